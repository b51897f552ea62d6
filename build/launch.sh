#!/usr/bin/env bash
# Launch a patchset's image on two nodes (tensor parallel across them), from a machine that
# reaches each node's Docker Engine (DOCKER_HOST=ssh://NODE: see docs/dspark.md for the ssh and
# docker group set-up).  Rank 1 starts first and headless; rank 0 starts once rank 1 is up, and
# serves the API.  Your model's settings (its checkpoint, the name it is served as, ...) come
# from a file you write, LAUNCH_SETTINGS; build/dspark.launch is DSpark's (docs/serving.md).
#
#   launch.sh print     check the settings, read the image's JIT cache place, print the two
#                       docker run commands (nothing is started)
#   launch.sh up        start rank 1, wait until it is up, start rank 0, wait until the API
#                       answers /health; on a failure or ^C, save both logs and clean up
#   launch.sh status    each node's container, and whether the API answers
#   launch.sh down      save each node's log (LAUNCH_LOGS/NAME.log), stop and remove both
#                       containers, rank 0 first
#
# Settings, from the environment, else from the LAUNCH_SETTINGS file (defaults in brackets):
#   LAUNCH_SETTINGS       a file of NAME=VALUE lines (blank lines and # comments aside) that
#                         gives any setting below, and the values of LAUNCH_PASS's
#                         variables; a variable set in the environment wins          [none]
#   LAUNCH_MODEL          the checkpoint folder in the container, under /models       [none]
#   LAUNCH_SERVED_NAME    the model name the API answers to                           [none]
#   LAUNCH_SERVE_PREFIX   how the image's serve command reads the launch's values: each
#                         container gets PREFIX_NODE_RANK (0 or 1), PREFIX_MASTER_ADDR,
#                         PREFIX_MODEL, PREFIX_SERVED_NAME and PREFIX_PORT     [PATCHKIT]
#   LAUNCH_PASS           more variables given to both containers as they are, when set
#                         (names, separated by spaces)                 [VLLM_LOGGING_LEVEL]
#   LAUNCH_MASTER_ADDR    rank 0's address on the node-to-node link            [none]
#   LAUNCH_PORT           the port rank 0's API listens on                             [8000]
#   LAUNCH_IMAGE          the image, the same on both nodes (a tag or NAME@sha256:...)   [none]
#   LAUNCH_RANK0_ENGINE   rank 0's Docker engine, as DOCKER_HOST takes it    [ssh://spark-1]
#   LAUNCH_RANK1_ENGINE   rank 1's Docker engine                             [ssh://spark-2]
#   NCCL_SOCKET_IFNAME    the node-to-node link's network interface, the same name on both
#                         nodes (the one holding LAUNCH_MASTER_ADDR on rank 0)       [none]
#   GLOO_SOCKET_IFNAME    the interface torch.distributed's gloo uses  [NCCL_SOCKET_IFNAME]
#   NCCL_IB_HCA           the link's RDMA device (ls /sys/class/infiniband on a node)[none]
#   LAUNCH_MODELS         the folder on each node mounted read-only at /models       [/models]
#   LAUNCH_JIT_CACHE      the folder on each node that keeps FlashInfer's JIT builds, one
#                         folder per JIT cache place              [/var/cache/patchkit-jit]
#   LAUNCH_JIT_WORKSPACE  the image's JIT cache place (label io.patchkit.jit.workspace);
#                         read from rank 0's engine when unset; "none" for no mount  [label]
#   LAUNCH_CUBINS         where the image's FlashInfer keeps the cubins it downloads (label
#                         io.patchkit.jit.cubins), mounted from LAUNCH_JIT_CACHE/cubins;
#                         read from rank 0's engine when unset; "none" for no mount  [label]
#   LAUNCH_NAME           the containers are NAME-rank0 and NAME-rank1              [serve]
#   LAUNCH_DEADLINE       seconds each wait of 'up' gives (rank 1 up, the API answering)
#                                                                                    [1800]
#   LAUNCH_LOGS           the folder 'down' saves the logs in                           [.]
#   LAUNCH_GPUS           docker run --gpus; "none" for no --gpus                     [all]
#   LAUNCH_ULIMITS        docker run --ulimit values, what RDMA needs; "none" for none
#                                                  [memlock=-1 stack=67108864]
#   LAUNCH_DEVICES        the RDMA device folder given to both containers; "none" for
#                         none (then NCCL runs over sockets)                [/dev/infiniband]
# The NCCL and GLOO settings go to both containers too.  A missing, empty or malformed setting,
# or a name in LAUNCH_SETTINGS that is neither a setting nor in LAUNCH_PASS, stops the script
# before anything starts (exit 2).
set -euo pipefail

die() {
    printf 'launch.sh: %s\n' "$*" >&2
    exit 2
}

fail() {
    printf 'launch.sh: %s\n' "$*" >&2
    exit 1
}

verb=${1-}
case "$verb" in
    print | up | status | down) ;;
    -h | --help)
        awk 'NR == 1 { next } /^#/ { print; next } { exit }' "$0"
        exit 0
        ;;
    "") die "give a verb: print, up, status or down (--help says more)" ;;
    *) die "unknown verb '$verb' (print, up, status or down)" ;;
esac
[ "$#" -le 1 ] || die "too many arguments (one verb: print, up, status or down)"

# LAUNCH_SETTINGS: NAME=VALUE lines, each given unless the environment sets NAME already.  A
# value may be quoted ('...' or "..."); nothing in it is expanded or run.  Every name is judged
# before any is given.
settings=${LAUNCH_SETTINGS-}
keys=() vals=() lines=()
if [ -n "$settings" ]; then
    if ! [ -f "$settings" ] || ! [ -r "$settings" ]; then
        die "LAUNCH_SETTINGS='$settings' is not a file this script can read"
    fi
    lineno=0
    while IFS= read -r line || [ -n "$line" ]; do
        lineno=$((lineno + 1))
        line=${line%$'\r'}
        [[ $line =~ ^[[:space:]]*(#.*)?$ ]] && continue
        [[ $line =~ ^[[:space:]]*([A-Za-z_][A-Za-z0-9_]*)=(.*)$ ]] ||
            die "$settings:$lineno: not NAME=VALUE: $line"
        key=${BASH_REMATCH[1]} value=${BASH_REMATCH[2]}
        if [[ $value =~ ^\'(.*)\'$ || $value =~ ^\"(.*)\"$ ]]; then
            value=${BASH_REMATCH[1]}
        fi
        keys+=("$key") vals+=("$value") lines+=("$lineno")
    done <"$settings"
fi
from_file() { # NAME DEFAULT: the environment's value, else the file's, else DEFAULT
    local i
    if [ -n "${!1+set}" ]; then
        printf '%s' "${!1}"
        return
    fi
    for i in "${!keys[@]}"; do
        if [ "${keys[$i]}" = "$1" ]; then
            printf '%s' "${vals[$i]}"
            return
        fi
    done
    printf '%s' "$2"
}
pass=$(from_file LAUNCH_PASS VLLM_LOGGING_LEVEL)
for var in $pass; do
    [[ $var =~ ^[A-Za-z_][A-Za-z0-9_]*$ ]] || die "LAUNCH_PASS: '$var' is not a variable name"
done
for i in "${!keys[@]}"; do
    key=${keys[$i]}
    case "$key" in
        LAUNCH_SETTINGS) die "$settings:${lines[$i]}: LAUNCH_SETTINGS cannot name another file" ;;
        LAUNCH_* | NCCL_* | GLOO_*) ;;
        *) case " $pass " in
               *" $key "*) ;;
               *) die "$settings:${lines[$i]}: $key is neither a launch setting nor in LAUNCH_PASS" ;;
           esac ;;
    esac
done
for i in "${!keys[@]}"; do
    key=${keys[$i]}
    [ -n "${!key+set}" ] || printf -v "$key" '%s' "${vals[$i]}"
done

serve_prefix=${LAUNCH_SERVE_PREFIX-PATCHKIT}
[[ $serve_prefix =~ ^[A-Za-z_][A-Za-z0-9_]*$ ]] ||
    die "LAUNCH_SERVE_PREFIX='$serve_prefix' is not the start of a variable name"

image=${LAUNCH_IMAGE-}
engine0=${LAUNCH_RANK0_ENGINE-ssh://spark-1}
engine1=${LAUNCH_RANK1_ENGINE-ssh://spark-2}
models=${LAUNCH_MODELS-/models}
model=${LAUNCH_MODEL-}
served_name=${LAUNCH_SERVED_NAME-}
master_addr=${LAUNCH_MASTER_ADDR-}
jit_cache=${LAUNCH_JIT_CACHE-/var/cache/patchkit-jit}
name=${LAUNCH_NAME-serve}
deadline=${LAUNCH_DEADLINE-1800}
logs=${LAUNCH_LOGS-.}
gpus=${LAUNCH_GPUS-all}
devices=${LAUNCH_DEVICES-/dev/infiniband}
ulimits=${LAUNCH_ULIMITS-memlock=-1 stack=67108864}
api_port=${LAUNCH_PORT-8000}
JIT_LABEL=io.patchkit.jit.workspace
CUBINS_LABEL=io.patchkit.jit.cubins
DOCKER_WAIT=120   # seconds one docker command may take (an ssh link that hangs ends there)

require() { # NAME VALUE WHAT
    [ -n "$2" ] || die "$1 is not set: $3"
}

engine_name() { # NAME VALUE
    require "$1" "$2" "a Docker engine, as DOCKER_HOST takes it (ssh://NODE)"
    [[ $2 =~ ^(ssh|unix|tcp)://[^[:space:]]+$ ]] ||
        die "$1='$2' is not a Docker engine address (ssh://NODE, unix:///PATH or tcp://HOST:PORT)"
}

folder() { # NAME VALUE
    require "$1" "$2" "an absolute folder"
    [[ $2 == /* && $2 != *[[:space:]:,]* ]] ||
        die "$1='$2' is not an absolute folder without spaces, ':' or ','"
}

interface() { # NAME VALUE
    [[ $2 =~ ^[A-Za-z0-9._@-]{1,15}$ ]] || die "$1='$2' is not a network interface name"
}

engine_name LAUNCH_RANK0_ENGINE "$engine0"
engine_name LAUNCH_RANK1_ENGINE "$engine1"
[ "$engine0" != "$engine1" ] || die "LAUNCH_RANK0_ENGINE and LAUNCH_RANK1_ENGINE are both $engine0"
[[ $name =~ ^[a-z0-9][a-z0-9_.-]*$ ]] || die "LAUNCH_NAME='$name' is not a container name"
name0=$name-rank0
name1=$name-rank1

docker_at() { # ENGINE ARGS...: docker on that engine, with a deadline
    local engine=$1
    shift
    DOCKER_HOST=$engine timeout "$DOCKER_WAIT" docker "$@"
}

# Say each node's log into LAUNCH_LOGS, then stop and remove both containers, rank 0 first
# (rank 1's workers wait on rank 0).  A container that is not there is passed over.
down() {
    local rank engine container
    mkdir -p "$logs"
    for rank in 0 1; do
        engine=$engine0 container=$name0
        [ "$rank" = 0 ] || engine=$engine1 container=$name1
        if ! docker_at "$engine" container inspect "$container" >/dev/null 2>&1; then
            printf 'rank %s: no container %s on %s\n' "$rank" "$container" "$engine"
            continue
        fi
        docker_at "$engine" logs "$container" >"$logs/$container.log" 2>&1 || true
        docker_at "$engine" stop --time 60 "$container" >/dev/null 2>&1 || true
        docker_at "$engine" rm --force "$container" >/dev/null
        printf 'rank %s: %s stopped and removed on %s; its log is %s\n' "$rank" "$container" \
            "$engine" "$logs/$container.log"
    done
}

require LAUNCH_LOGS "$logs" "the folder 'down' saves the logs in"
if [ "$verb" = down ]; then
    down
    exit 0
fi

running() { # ENGINE CONTAINER: true while it runs
    [ "$(docker_at "$1" container inspect --format '{{.State.Running}}' "$2" 2>/dev/null)" = true ]
}

# The API's /health, asked from inside rank 0's container (host network: the port serve.sh
# gave it), so that the machine running this script need not reach the node's port.
api_answers() {
    docker_at "$engine0" exec "$name0" python3 -c "import sys, urllib.request
try:
    sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:$api_port/health', timeout=5).status == 200 else 1)
except Exception:
    sys.exit(1)" >/dev/null 2>&1
}

if [ "$verb" = status ]; then
    for pair in "0 $engine0 $name0" "1 $engine1 $name1"; do
        read -r rank engine container <<<"$pair"
        if ! state=$(docker_at "$engine" container inspect --format '{{.State.Status}}' \
            "$container" 2>/dev/null); then
            state="not there"
        fi
        printf 'rank %s: %s on %s: %s\n' "$rank" "$container" "$engine" "$state"
    done
    if running "$engine0" "$name0" && api_answers; then
        printf 'API: /health answers 200 on port %s of rank 0\n' "$api_port"
    else
        printf 'API: not answering\n'
    fi
    exit 0
fi

require LAUNCH_IMAGE "$image" "the image to run on both nodes (a tag or NAME@sha256:...)"
[[ $image =~ ^[A-Za-z0-9][A-Za-z0-9._/:@-]*$ ]] || die "LAUNCH_IMAGE='$image' is not an image reference"
require NCCL_SOCKET_IFNAME "${NCCL_SOCKET_IFNAME-}" \
    "the node-to-node link's interface (ip -br addr on rank 0: the one holding $master_addr)"
interface NCCL_SOCKET_IFNAME "$NCCL_SOCKET_IFNAME"
gloo_ifname=${GLOO_SOCKET_IFNAME-$NCCL_SOCKET_IFNAME}
interface GLOO_SOCKET_IFNAME "$gloo_ifname"
require NCCL_IB_HCA "${NCCL_IB_HCA-}" "the link's RDMA device (ls /sys/class/infiniband on a node)"
[[ $NCCL_IB_HCA =~ ^[=^]?[A-Za-z0-9_.:,-]+$ ]] || die "NCCL_IB_HCA='$NCCL_IB_HCA' is not an RDMA device list"
require LAUNCH_MASTER_ADDR "$master_addr" "rank 0's address on the node-to-node link"
[[ $master_addr =~ ^[A-Za-z0-9]([A-Za-z0-9.-]{0,251}[A-Za-z0-9])?$ ]] ||
    die "LAUNCH_MASTER_ADDR='$master_addr' is not a host name or IPv4 address"
folder LAUNCH_MODELS "$models"
folder LAUNCH_JIT_CACHE "$jit_cache"
require LAUNCH_MODEL "$model" "the checkpoint folder in the container, under /models (your \
model's settings file gives it: LAUNCH_SETTINGS=build/dspark.launch is DSpark's)"
[[ $model == /models/?* && $model != *[[:space:]]* ]] ||
    die "LAUNCH_MODEL='$model' is not a folder under /models (where LAUNCH_MODELS is mounted)"
require LAUNCH_SERVED_NAME "$served_name" "the model name the API answers to"
[[ $served_name =~ ^[A-Za-z0-9][A-Za-z0-9._/:-]*$ ]] ||
    die "LAUNCH_SERVED_NAME='$served_name' is not a model name (letters, digits, . _ / : -)"
if ! [[ $deadline =~ ^[0-9]{1,6}$ ]] || ((10#$deadline < 1)); then
    die "LAUNCH_DEADLINE='$deadline' is not a number of seconds above 0"
fi
[[ $api_port =~ ^[0-9]{1,5}$ ]] || die "LAUNCH_PORT='$api_port' is not a port number"
[[ $gpus =~ ^[A-Za-z0-9=,\"-]+$ ]] || die "LAUNCH_GPUS='$gpus' is not a --gpus value (or none)"
[ "$devices" = none ] || folder LAUNCH_DEVICES "$devices"
[[ $ulimits =~ ^(none|[a-z]+=-?[0-9]+(:-?[0-9]+)?( [a-z]+=-?[0-9]+(:-?[0-9]+)?)*)$ ]] ||
    die "LAUNCH_ULIMITS='$ulimits' is not NAME=VALUE ... (or none)"

# label_place VAR SETTING LABEL WHAT: VAR is SETTING, else the image's LABEL read from rank 0's
# engine, else "none"; an absolute folder unless "none".
label_place() {
    local value=$2
    if [ -z "$value" ]; then
        value=$(docker_at "$engine0" image inspect --format "{{ index .Config.Labels \"$3\" }}" \
            "$image" 2>&1) || fail "cannot read $image on $engine0: ${value##*$'\n'}"
        [ "$value" != "<no value>" ] || value=""
        [ -n "$value" ] || value=none
    fi
    if [ "$value" != none ]; then
        [[ $value == /* && $value != *[[:space:]:,]* ]] ||
            die "the $4 '$value' ($3 of $image) is not an absolute folder"
    fi
    printf -v "$1" '%s' "$value"
}
# The image's JIT cache place: where its FlashInfer builds the modules a patch feeds.  Mounted
# from the node, each container of this image finds the modules the first one compiled.
workspace=""
label_place workspace "${LAUNCH_JIT_WORKSPACE-}" "$JIT_LABEL" "JIT cache place"
# The cubins FlashInfer downloads at run time: kept on the node, so a restart downloads none
# again (and a node without internet still starts once they are there).
cubins=""
label_place cubins "${LAUNCH_CUBINS-}" "$CUBINS_LABEL" "cubin place"

run_words() { # RANK: the docker run arguments of that rank
    local rank=$1 var
    # --pull never: an image a node lacks is one error at once, not a pull past the deadline
    words=(run --detach --pull never --name "$name-rank$rank")
    [ "$gpus" = none ] || words+=(--gpus "$gpus")
    words+=(--network host --ipc host)
    if [ "$ulimits" != none ]; then
        for var in $ulimits; do
            words+=(--ulimit "$var")
        done
    fi
    [ "$devices" = none ] || words+=(--device "$devices")
    words+=(--volume "$models:/models:ro")
    if [ "$workspace" != none ]; then
        words+=(--volume "$jit_cache/${workspace##*/}:$workspace")
    fi
    [ "$cubins" = none ] || words+=(--volume "$jit_cache/cubins:$cubins")
    local p=$serve_prefix
    words+=(--env "${p}_NODE_RANK=$rank" --env "${p}_MASTER_ADDR=$master_addr"
        --env "${p}_MODEL=$model" --env "${p}_SERVED_NAME=$served_name"
        --env "${p}_PORT=$api_port" --env "NCCL_SOCKET_IFNAME=$NCCL_SOCKET_IFNAME"
        --env "GLOO_SOCKET_IFNAME=$gloo_ifname" --env "NCCL_IB_HCA=$NCCL_IB_HCA")
    for var in $pass; do
        if [ -n "${!var-}" ]; then
            words+=(--env "$var=${!var}")
        fi
    done
    words+=("$image")
}

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

if [ "$verb" = print ]; then
    run_words 1
    shell_words "DOCKER_HOST=$engine1" docker "${words[@]}"
    run_words 0
    shell_words "DOCKER_HOST=$engine0" docker "${words[@]}"
    exit 0
fi

# -- up ------------------------------------------------------------------------------------
for pair in "$engine0 $name0" "$engine1 $name1"; do
    read -r engine container <<<"$pair"
    if docker_at "$engine" container inspect "$container" >/dev/null 2>&1; then
        die "$container is already there on $engine; 'launch.sh down' stops and removes it"
    fi
done

started=0
give_up() { # MESSAGE: both logs saved, both containers removed, exit 1
    trap - INT TERM
    printf 'launch.sh: %s\n' "$1" >&2
    down >&2
    exit 1
}
trap 'give_up "interrupted; cleaning up"' INT TERM

last_lines() { # ENGINE CONTAINER
    docker_at "$1" logs --tail 20 "$2" 2>&1 | sed 's/^/    /' >&2 || true
}

# wait_for WHAT CHECK...: polls CHECK every 5 s until it holds or LAUNCH_DEADLINE passes;
# either container stopping ends the wait at once.
wait_for() {
    local what=$1 start=$SECONDS
    shift
    while ! "$@"; do
        for pair in "$engine1 $name1" "$engine0 $name0"; do
            read -r engine container <<<"$pair"
            if [ "$container" = "$name0" ] && [ "$started" -lt 2 ]; then
                continue
            fi
            if ! running "$engine" "$container"; then
                printf 'launch.sh: %s stopped on %s; its last lines:\n' "$container" "$engine" >&2
                last_lines "$engine" "$container"
                give_up "waiting for $what, $container stopped"
            fi
        done
        if ((SECONDS - start >= deadline)); then
            give_up "$what: not within $deadline s (LAUNCH_DEADLINE)"
        fi
        sleep 5
    done
    printf '%s after %s s\n' "$what" "$((SECONDS - start))"
}

# Rank 1 is up when vLLM says it launched its headless executor: its workers then wait for
# rank 0 at DSPARK_MASTER_ADDR.
rank1_up() { # (grep reads it all: no SIGPIPE for docker under pipefail)
    docker_at "$engine1" logs "$name1" 2>&1 | grep 'headless multiproc executor' >/dev/null
}

run_words 1
docker_at "$engine1" "${words[@]}" >/dev/null || give_up "rank 1 did not start on $engine1"
started=1
printf 'rank 1: %s started on %s\n' "$name1" "$engine1"
wait_for "rank 1 up (headless executor launched)" rank1_up
run_words 0
docker_at "$engine0" "${words[@]}" >/dev/null || give_up "rank 0 did not start on $engine0"
started=2
printf 'rank 0: %s started on %s\n' "$name0" "$engine0"
wait_for "API answering /health on port $api_port of rank 0" api_answers
trap - INT TERM
printf 'ready: check it with patchkit smoke, judge each log with patchkit verify (docs/dspark.md)\n'
