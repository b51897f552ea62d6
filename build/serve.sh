#!/usr/bin/env bash
# Serve DeepSeek-V4-Flash (NVFP4 target, MXFP4 DSpark draft) with tensor parallelism across two
# DGX Spark nodes.  Run the same image on both: rank 1 starts headless (workers only), rank 0
# starts the workers and the OpenAI-compatible API.
#
#   serve.sh            check the settings, then exec vllm serve
#   serve.sh --print    check the settings, print the command line it would exec, and exit
#
# Settings, from the environment (defaults in brackets):
#   DSPARK_NODE_RANK          0 or 1                                    [0]
#   DSPARK_MASTER_ADDR        rank 0's address on the node-to-node link [192.168.100.10]
#   DSPARK_MASTER_PORT        rank 0's torch.distributed port           [29501]
#   DSPARK_HEADLESS           auto, 0 or 1; auto = headless on rank 1   [auto]
#   DSPARK_HOST               address the API listens on (rank 0)       [0.0.0.0]
#   DSPARK_PORT               port the API listens on (rank 0)          [8000]
#   DSPARK_MODEL              the checkpoint, same path on both nodes
#                                                       [/models/DeepSeek-V4-Flash-NVFP4]
#   DSPARK_SERVED_NAME        the model name the API answers to         [deepseek-v4-flash]
#   DSPARK_DRAFT_MOE_BACKEND  the draft's MoE backend; vLLM 0.27.1 and 0.28.0
#                             have no b12x, use auto there              [b12x]
# Anything missing, empty or malformed stops the script before vLLM starts, naming the setting.
# The rest of the environment reaches vLLM unchanged: NCCL_SOCKET_IFNAME and GLOO_SOCKET_IFNAME
# (the node-to-node link's interface) and NCCL_IB_HCA (its RDMA device) among it.
#
# The two-node launch check, from a machine with patchkit and this repository that reaches each
# node's Docker Engine over ssh (IMAGE is the same image on both nodes; its default command is
# this script; build/launch.sh --help lists every setting, docs/dspark.md walks through it):
#   1. the two docker run commands, then rank 1, then rank 0 once rank 1 is up; up returns
#      once rank 0's API answers /health:
#        export LAUNCH_SETTINGS=build/dspark.launch     # DSpark's model, names and settings
#        LAUNCH_IMAGE=IMAGE NCCL_SOCKET_IFNAME=IFACE NCCL_IB_HCA=RDMA build/launch.sh print
#        LAUNCH_IMAGE=IMAGE NCCL_SOCKET_IFNAME=IFACE NCCL_IB_HCA=RDMA build/launch.sh up
#   2. one answer with content, a long one without garble, and the draft accepted, from the
#      same machine, at rank 0's API:
#        patchkit smoke http://spark-1:8000 --long 4096 --timeout 600 --min-acceptance 0.25
#   3. 10 s later (vLLM logs its spec-decode metrics every 10 s), each node's log against the
#      patches in IMAGE and the series' acceptance floors (exit 0 every marker holds, 1 one
#      does not, naming the patch and the line):
#        DOCKER_HOST=ssh://spark-2 patchkit verify --image IMAGE --container dsv4-rank1 --require-traffic
#        DOCKER_HOST=ssh://spark-1 patchkit verify --image IMAGE --container dsv4-rank0 --require-traffic
#   4. stop: both logs saved as dsv4-rank0.log and dsv4-rank1.log, both containers removed:
#        build/launch.sh down
set -euo pipefail

die() {
    printf 'serve.sh: %s\n' "$*" >&2
    exit 2
}

print_only=0
case "${1-}" in
    "") ;;
    --print | --dry-run) print_only=1 ;;
    -h | --help)
        awk 'NR == 1 { next } /^#/ { print; next } { exit }' "$0"
        exit 0
        ;;
    *) die "unknown argument '$1' (use --print, or no argument)" ;;
esac
[ "$#" -le 1 ] || die "too many arguments (use --print, or no argument)"

node_rank=${DSPARK_NODE_RANK-0}
master_addr=${DSPARK_MASTER_ADDR-192.168.100.10}
master_port=${DSPARK_MASTER_PORT-29501}
headless=${DSPARK_HEADLESS-auto}
host=${DSPARK_HOST-0.0.0.0}
port=${DSPARK_PORT-8000}
model=${DSPARK_MODEL-/models/DeepSeek-V4-Flash-NVFP4}
served_name=${DSPARK_SERVED_NAME-deepseek-v4-flash}
draft_moe_backend=${DSPARK_DRAFT_MOE_BACKEND-b12x}

require() { # NAME VALUE
    [ -n "$2" ] || die "$1 is set but empty"
}

port_number() { # NAME VALUE
    require "$1" "$2"
    if ! [[ $2 =~ ^[0-9]{1,5}$ ]] || ((10#$2 < 1 || 10#$2 > 65535)); then
        die "$1='$2' is not a port number (1-65535)"
    fi
}

host_name() { # NAME VALUE: an IPv4 address or a DNS name
    require "$1" "$2"
    [[ $2 =~ ^[A-Za-z0-9]([A-Za-z0-9.-]{0,251}[A-Za-z0-9])?$ ]] ||
        die "$1='$2' is not a host name or IPv4 address"
}

require DSPARK_NODE_RANK "$node_rank"
[[ $node_rank == 0 || $node_rank == 1 ]] ||
    die "DSPARK_NODE_RANK='$node_rank' is not 0 or 1 (rank 0 serves the API, rank 1 is headless)"
host_name DSPARK_MASTER_ADDR "$master_addr"
port_number DSPARK_MASTER_PORT "$master_port"
host_name DSPARK_HOST "$host"
port_number DSPARK_PORT "$port"
require DSPARK_MODEL "$model"
[[ $model != *[[:space:]]* ]] || die "DSPARK_MODEL='$model' contains white space"
require DSPARK_SERVED_NAME "$served_name"
[[ $served_name =~ ^[A-Za-z0-9][A-Za-z0-9._/:-]*$ ]] ||
    die "DSPARK_SERVED_NAME='$served_name' is not a model name (letters, digits, . _ / : -)"
require DSPARK_DRAFT_MOE_BACKEND "$draft_moe_backend"
[[ $draft_moe_backend =~ ^[a-z0-9_]+$ ]] ||
    die "DSPARK_DRAFT_MOE_BACKEND='$draft_moe_backend' is not a MoE backend name (a-z 0-9 _)"

case "$headless" in
    auto) [ "$node_rank" = 1 ] && headless=1 || headless=0 ;;
    0 | 1) ;;
    "") die "DSPARK_HEADLESS is set but empty" ;;
    *) die "DSPARK_HEADLESS='$headless' is not auto, 0 or 1" ;;
esac
[ "$headless" = "$node_rank" ] ||
    die "DSPARK_HEADLESS=$headless does not fit DSPARK_NODE_RANK=$node_rank" \
        "(rank 1 runs headless, rank 0 serves the API)"
[ "$node_rank" = 1 ] || [ "$port" != "$master_port" ] ||
    die "DSPARK_PORT and DSPARK_MASTER_PORT are both $port on rank 0"

if [ "$print_only" = 0 ]; then
    [ -d "$model" ] || die "DSPARK_MODEL='$model' is not a directory"
    command -v vllm >/dev/null || die "vllm is not on PATH"
fi

speculative_config='{"method":"dspark","num_speculative_tokens":5,"moe_backend":"'
speculative_config+=$draft_moe_backend'"}'

cmd=(
    vllm serve "$model"
    --served-model-name "$served_name"
    --host "$host"
    --port "$port"
    --tensor-parallel-size 2
    --nnodes 2
    --node-rank "$node_rank"
    --master-addr "$master_addr"
    --master-port "$master_port"
    --kv-cache-dtype nvfp4_ds_mla
    --moe-backend flashinfer_b12x
    --speculative-config "$speculative_config"
    --enable-prefix-caching
    --tokenizer-mode deepseek_v4
    --tool-call-parser deepseek_v4
    --enable-auto-tool-choice
    --reasoning-parser deepseek_v4
    --max-model-len 524288
    --block-size 256
)
if [ "$headless" = 1 ]; then
    cmd+=(--headless)
fi

# One line a POSIX shell reads back into the same words; plain words stay unquoted.
shell_words() {
    local word sep=""
    for word in "$@"; do
        if [[ $word =~ ^[A-Za-z0-9_./:=@%+,-]+$ ]]; then
            printf '%s%s' "$sep" "$word"
        else
            printf "%s'%s'" "$sep" "${word//\'/\'\\\'\'}"
        fi
        sep=" "
    done
    printf '\n'
}

if [ "$print_only" = 1 ]; then
    shell_words "${cmd[@]}"
    exit 0
fi
exec "${cmd[@]}"
