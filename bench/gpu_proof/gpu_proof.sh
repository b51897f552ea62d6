#!/usr/bin/env bash
# shellcheck disable=SC2153   # ASIS and SLOW are set by builds.env (run)
# The speed gate on a real GPU (docs/gpu-proof.md): a real vLLM 0.26.0 server, twice, on one
# model and one set of settings, once as patchkit built it with no patch and once with the
# slow-decode patch; `patchkit smoke` measures both, records the evidence against each build
# (read from a Docker-API engine with --build), and gates the second against the first.
#
#   bench/gpu_proof/gpu_proof.sh images OUT      # where a Docker Engine is (DOCKER_HOST)
#   bench/gpu_proof/gpu_proof.sh stage STAGE     # anywhere with pip that reaches PyPI
#   bench/gpu_proof/gpu_proof.sh run STAGE OUT   # on the GPU machine
#
# `images` needs vLLM 0.26.0's wheel (VLLM_WHEEL, else it is downloaded), patchkit on PATH and
# an engine: it makes the base image (the wheel's files less its compiled objects and C++
# headers, in /usr/local/lib/python3.12/dist-packages), builds pk-gpu-proof twice with
# `patchkit build-image` (as-is.yaml: no patch; patchset.yaml: slow-decode), and saves the
# three images to OUT/images.tar, with their immutable tags in OUT/builds.env.
#
# `stage` fills STAGE with what `run` needs beside the images: so/ (vLLM 0.26.0's compiled
# objects, laid into the vllm package: _C_stable_libtorch and the small ones, and
# vllm_flash_attn/_vllm_fa3_C, which vLLM's Llama module imports), site/ (site-requirements.txt,
# for Python 3.12 on x86-64) and model/ (make_model.py's output).  `run` needs, in STAGE: those,
# images.tar and builds.env; and patchkit's sources (PATCHKIT_SRC, default this checkout's src/).  The engine is DOCKER_HOST's; with
# PODMAN_BUNDLE (a folder with bin/podman, bin/conmon, bin/runc and lib/), a Podman service
# of its own is started first, on vfs storage, and the images are loaded into it.  Each
# build's vLLM tree is taken out of its image (podman image mount, else docker export), the
# compiled objects laid beside it, and served from there: what is served is what the image
# holds.  Everything it finds goes to OUT.  REQUESTS, OUTPUT_TOKENS, CONCURRENCY and MAX_DROP
# set smoke's measurement and gate (10, 256, 4, 10); SERVE_ARGS adds to vLLM's settings (e.g.
# --enforce-eager); SERVE_WAIT is how long a server may take to answer /health (half-seconds).
set -u
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
SITE_PKG=usr/local/lib/python3.12/dist-packages

images() {
    out=$1; mkdir -p "$out"
    wheel=${VLLM_WHEEL:-}
    if [ -z "$wheel" ]; then
        python3 -m pip download -q --no-deps --only-binary :all: -d "$out/wheel" vllm==0.26.0
        wheel=$(ls "$out"/wheel/vllm-0.26.0-*.whl)
    fi
    ctx=$(mktemp -d)
    mkdir -p "$ctx/rootfs/$SITE_PKG" "$ctx/rootfs/usr/local/bin"
    unzip -q "$wheel" -x '*.so' 'vllm/vllm-rs' '*/include/*' -d "$ctx/rootfs/$SITE_PKG"
    printf 'FROM scratch\nCOPY rootfs/ /\nENV PATH=/usr/local/bin:/usr/bin:/bin\n' >"$ctx/Dockerfile"
    docker build -q -t pk-gpu-proof-base:v0.26.0 "$ctx" || return 1
    rm -rf "$ctx"
    cd "$here" || return 1
    asis=$(patchkit build-image --manifest as-is.yaml --workdir "$out/wd-asis" --format json |
           python3 -c 'import json,sys; print(json.load(sys.stdin)["immutable_tag"])') || return 1
    slow=$(patchkit build-image --workdir "$out/wd-slow" --format json |
           python3 -c 'import json,sys; print(json.load(sys.stdin)["immutable_tag"])') || return 1
    printf 'ASIS=%s\nSLOW=%s\n' "$asis" "$slow" >"$out/builds.env"
    docker save pk-gpu-proof-base:v0.26.0 "$asis" "$slow" -o "$out/images.tar"
    cat "$out/builds.env"
}

stage() {
    dest=$1; mkdir -p "$dest/so" "$dest/site"
    wheel=${VLLM_WHEEL:-}
    if [ -z "$wheel" ]; then
        python3 -m pip download -q --no-deps --only-binary :all: -d "$dest/wheel" vllm==0.26.0
        wheel=$(ls "$dest"/wheel/vllm-0.26.0-*.whl)
    fi
    unzip -q -o "$wheel" 'vllm/_C_stable_libtorch.abi3.so' 'vllm/cumem_allocator.abi3.so' \
        'vllm/spinloop.abi3.so' 'vllm/fs_io_C.abi3.so' 'vllm/_rust_tool_parser.abi3.so' \
        'vllm/_qutlass_C.abi3.so' 'vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so' -d "$dest/so.tmp"
    cp -a "$dest/so.tmp/vllm/." "$dest/so/" && rm -rf "$dest/so.tmp"
    platforms=()
    for p in 2_35 2_34 2_31 2_28 2_27 2_26 2_24 2_17 2_12 2_5; do
        platforms+=(--platform "manylinux_${p}_x86_64")
    done
    python3 -m pip install -q --no-deps --no-compile --only-binary :all: --python-version 3.12 \
        --implementation cp "${platforms[@]}" --platform manylinux2014_x86_64 \
        --platform manylinux1_x86_64 --target "$dest/site" -r "$here/site-requirements.txt"
    python3 "$here/make_model.py" "$dest/model"
}

start_podman() {   # a Podman service of our own, on vfs storage, behind its Docker API
    b=$1 pm=/tmp/pk-podman
    mkdir -p $pm /etc/containers
    [ -e /etc/containers/policy.json ] ||
        echo '{"default":[{"type":"insecureAcceptAnything"}]}' >/etc/containers/policy.json
    cat >$pm/containers.conf <<CONF
[containers]
netns = "none"
default_ulimits = []
[engine]
cgroup_manager = "cgroupfs"
events_logger = "file"
tmp_dir = "$pm/tmp"
conmon_path = ["$b/bin/conmon"]
runtime = "runc"
[engine.runtimes]
runc = ["$b/bin/runc"]
CONF
    echo 'unqualified-search-registries = []' >$pm/registries.conf
    export CONTAINERS_CONF=$pm/containers.conf CONTAINERS_REGISTRIES_CONF=$pm/registries.conf
    podman() { LD_LIBRARY_PATH=$b/lib "$b/bin/podman" --root "$pm/root" --runroot "$pm/run" \
                   --storage-driver vfs "$@"; }
    podman load -q -i "$STAGE/images.tar" || return 1
    LD_LIBRARY_PATH=$b/lib setsid "$b/bin/podman" --root $pm/root --runroot $pm/run \
        --storage-driver vfs system service --time=0 unix://$pm/podman.sock \
        >"$OUT/podman.log" 2>&1 </dev/null &
    export DOCKER_HOST=unix://$pm/podman.sock
    for _ in $(seq 50); do [ -S $pm/podman.sock ] && break; sleep 0.2; done
    podman images
}

tree_of() {   # the vLLM tree a build's image holds, with the compiled objects beside it
    tag=$1 dest=$2
    rm -rf "$dest"; mkdir -p "$dest"
    if [ -z "$engine" ]; then   # no engine: the image's layers, read from the saved archive
        python3 - "$STAGE/images.tar" "$tag" "$dest" "$SITE_PKG" <<'PY' || return 1
import json, os, shutil, sys, tarfile
archive, tag, dest, site = sys.argv[1:]
with tarfile.open(archive) as tar:
    image = next(m for m in json.load(tar.extractfile("manifest.json")) if tag in m["RepoTags"])
    for name in image["Layers"]:
        with tarfile.open(fileobj=tar.extractfile(name)) as layer:
            for m in layer.getmembers():
                if not m.name.startswith(site + "/"):
                    continue
                path = os.path.join(dest, m.name[len(site) + 1:])
                base = os.path.basename(path)
                if base.startswith(".wh."):   # a whiteout: the file below is gone
                    gone = os.path.join(os.path.dirname(path), base[4:])
                    shutil.rmtree(gone, True) if os.path.isdir(gone) else (
                        os.path.exists(gone) and os.remove(gone))
                elif m.isdir():
                    os.makedirs(path, exist_ok=True)
                elif m.isfile():
                    os.makedirs(os.path.dirname(path), exist_ok=True)
                    with open(path, "wb") as f:
                        shutil.copyfileobj(layer.extractfile(m), f)
PY
    elif [ -n "${PODMAN_BUNDLE:-}" ]; then
        mnt=$(podman image mount "$tag") || return 1
        cp -a "$mnt/$SITE_PKG/." "$dest/"
        podman image unmount "$tag" >/dev/null
    else
        cid=$(docker create "$tag" /bin/true) || return 1
        docker export "$cid" | tar -x -C "$dest" "$SITE_PKG" && docker rm "$cid" >/dev/null
        mv "$dest/$SITE_PKG"/* "$dest/" && rm -rf "${dest:?}/usr"
    fi
    cp -a "$STAGE/so/." "$dest/vllm/"   # compiled objects: the image holds none
}

serve() {   # serve the tree $1 on port 8000; log to $2; wait for /health
    tree=$1 log=$2
    # shellcheck disable=SC2086   # SERVE_ARGS: words of their own
    PYTHONPATH=$tree:$STAGE/site setsid python3 -m vllm.entrypoints.openai.api_server \
        --model "$STAGE/model" --served-model-name tiny-llama --port 8000 \
        --dtype bfloat16 --max-model-len 2048 --max-num-seqs 16 \
        --gpu-memory-utilization 0.30 --attention-backend TRITON_ATTN \
        --speculative-config '{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 2}' \
        ${SERVE_ARGS:-} >"$log" 2>&1 </dev/null &
    server=$!
    for _ in $(seq "${SERVE_WAIT:-600}"); do   # half-seconds
        curl -sf http://127.0.0.1:8000/health >/dev/null && return 0
        kill -0 $server 2>/dev/null || { tail -40 "$log"; return 1; }
        sleep 0.5
    done
    tail -40 "$log"; return 1
}

stop() {
    kill -- -$server 2>/dev/null; wait $server 2>/dev/null
    for _ in $(seq 60); do curl -s http://127.0.0.1:8000/health >/dev/null || break; sleep 0.5; done
    sleep 3
}

say() { echo; echo "\$ $*"; "$@"; echo "exit $?"; }
patchkit() { python3 -m patchkit "$@"; }   # patchkit from its sources (PATCHKIT_SRC)

run() {
    STAGE=$1 OUT=$2; mkdir -p "$OUT"
    export PYTHONPATH=${PATCHKIT_SRC:-$repo/src}:$STAGE/site PYTHONUNBUFFERED=1
    export PATCHKIT_CACHE_DIR=${PATCHKIT_CACHE_DIR:-/tmp/pk-cache}
    export VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_NO_USAGE_STATS=1 HF_HUB_OFFLINE=1
    # shellcheck disable=SC1091   # ASIS= and SLOW=: the two builds' immutable tags
    . "$STAGE/builds.env"
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
    python3 -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)'
    [ -e "$STAGE/model/config.json" ] || python3 "$here/make_model.py" "$STAGE/model"
    engine=yes
    if [ -n "${PODMAN_BUNDLE:-}" ]; then start_podman "$PODMAN_BUNDLE" || engine=; fi
    [ -n "$engine" ] && say patchkit images --manifest "$here/patchset.yaml"
    if [ -n "$engine" ] && ! { tree_of "$ASIS" /tmp/tree-asis && tree_of "$SLOW" /tmp/tree-slow; }
    then engine=; fi
    build_asis=(--build "$ASIS") build_slow=(--build "$SLOW") gate=(--against "$ASIS")
    if [ -z "$engine" ]; then   # measured all the same; no build can be named, nothing recorded
        echo "NO ENGINE: the trees come from the saved images; smoke records no evidence"
        tree_of "$ASIS" /tmp/tree-asis && tree_of "$SLOW" /tmp/tree-slow || return 1
        build_asis=() build_slow=() gate=()
    fi
    say patchkit verify --tree /tmp/tree-slow --manifest "$here/patchset.yaml"
    [ -n "$engine" ] && say patchkit verify --image "$SLOW" --manifest "$here/patchset.yaml"
    diff -r /tmp/tree-asis /tmp/tree-slow
    PYTHONPATH=/tmp/tree-asis:$STAGE/site python3 -c 'import vllm.entrypoints.openai.api_server, vllm._C_stable_libtorch; print("vLLM", vllm.__version__, "imports")' || return 1

    N=${REQUESTS:-10} T=${OUTPUT_TOKENS:-256} C=${CONCURRENCY:-4} D=${MAX_DROP:-10}
    speed=(--requests "$N" --output-tokens "$T" --concurrency "$C")
    url=http://127.0.0.1:8000
    serve /tmp/tree-asis "$OUT/server-asis.log" || return 1
    say patchkit smoke $url "${speed[@]}" "${build_asis[@]}"
    say patchkit smoke $url "${speed[@]}" "${build_asis[@]}" "${gate[@]}" ${gate:+--max-drop "$D"}
    stop
    serve /tmp/tree-slow "$OUT/server-slow.log" || return 1
    say patchkit smoke $url "${speed[@]}" "${build_slow[@]}" "${gate[@]}" ${gate:+--max-drop "$D"}
    stop
    [ -n "$engine" ] || return 0
    cd "$here" || return 1
    say patchkit images
    say patchkit images --evidence "$ASIS"
    say patchkit images --evidence "$SLOW"
    tar -C "$PATCHKIT_CACHE_DIR" -czf "$OUT/evidence.tar.gz" evidence
}

case ${1:-} in
    images) shift; images "$@" ;;
    stage) shift; stage "$@" ;;
    run) shift; run "$@" ;;
    *) sed -n '3,/^set -u/{/^#/p}' "$0"; exit 2 ;;
esac
