#!/usr/bin/env bash
# FlashInfer 0.7.4 on a real GPU: a JIT-cache provider's prebuilt norm against patchkit's layer.
# Run from the repository root on a machine with an NVIDIA GPU, Python 3.12 and torch:
#   PROOF=<the PK_PROOF_OUT folder of tests/image/test_jit_docker.py -k hopper>
#   FI_TAR=<flashinfer-python 0.7.4 wheel files as a tar.xz>  TVM_WHEEL=<apache-tvm-ffi wheel>
#   OUT=<folder for result.txt>  bash tools/flashinfer07-gpu-proof.sh
# docs/compiled-code.md says what each step shows.
set -euo pipefail
export PROOF=${PROOF:?the folder PK_PROOF_OUT wrote}
FI_TAR=${FI_TAR:?} TVM_WHEEL=${TVM_WHEEL:?} OUT=${OUT:?}
SITE=/tmp/site; rm -rf "$SITE" /tmp/ws-*; mkdir -p "$SITE"
exec > >(tee "$OUT/result.txt") 2>&1
nvidia-smi --query-gpu=name,compute_cap --format=csv,noheader
python3 -c "import sys, torch; print('python', sys.version.split()[0], 'torch', torch.__version__)"
tar -xJf "$FI_TAR" -C "$SITE"
python3 - "$SITE" <<'PY'
import base64, csv, hashlib, pathlib, sys
site = pathlib.Path(sys.argv[1])
rows = list(csv.reader((site / "flashinfer_python-0.7.4.dist-info/RECORD").read_text().splitlines()))
bad = 0
for path, digest, _size in rows:
    if not digest:
        continue
    algo, want = digest.split("=", 1)
    got = base64.urlsafe_b64encode(hashlib.sha256((site / path).read_bytes()).digest()).rstrip(b"=").decode()
    bad += got != want
print(f"flashinfer-python 0.7.4: {len(rows)} RECORD rows, {bad} mismatches")
assert bad == 0
PY
pip install -q --no-index --no-deps --target "$SITE" "$TVM_WHEEL"
export PYTHONPATH="$SITE" FLASHINFER_USE_CUDA_NORM=1
cat > /tmp/norm_run.py <<'PY'
import os, torch, flashinfer
torch.manual_seed(0)
x = torch.randn(64, 4096, device="cuda", dtype=torch.float16)
w = torch.randn(4096, device="cuda", dtype=torch.float16)
out = flashinfer.norm.rmsnorm(x, w, 1e-6)
ref = (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6) * w.float())
ratio = (out.float() / ref).median().item()
maps = sorted({line.split()[-1] for line in open("/proc/self/maps") if line.rstrip().endswith("/norm.so")})
print(f"rmsnorm / reference = {ratio:.3f}; norm modules mapped: {maps}")
PY
echo "== 1. the pristine norm, compiled by FlashInfer's JIT (what the provider ships)"
FLASHINFER_WORKSPACE_BASE=/tmp/ws-pristine python3 /tmp/norm_run.py
SO=$(find /tmp/ws-pristine -path '*cached_ops/norm/norm.so' | head -1); echo "built: $SO"
echo "== 2. the provider and the shim, installed as pip installs them (tests/testing/jitcache.py)"
python3 - "$SITE" "$SO" <<'PY'
import pathlib, sys
sys.path.insert(0, "tests")
from testing import jitcache
site, so = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2]).read_bytes()
files = {**jitcache.shim("0.7.4+cu130"), **jitcache.provider("sm90a", {"norm": so}, "0.7.4+cu130")}
for rel, data in files.items():
    (site / rel).parent.mkdir(parents=True, exist_ok=True)
    (site / rel).write_bytes(data)
print(f"{len(files)} files of flashinfer-jit-cache and flashinfer-jit-cache-sm90a")
PY
FLASHINFER_WORKSPACE_BASE=/tmp/ws-base python3 /tmp/norm_run.py
# the image's environment (FLASHINFER_WORKSPACE_BASE, FLASHINFER_CUBIN_DIR), under /tmp here
eval "$(python3 - <<'PY'
import json, os
env = dict(e.split("=", 1) for e in json.load(open(os.environ["PROOF"] + "/image.json"))["env"])
for key in ("FLASHINFER_WORKSPACE_BASE", "FLASHINFER_CUBIN_DIR"):
    print(f"export IMG_{key}=/tmp/ws-img{env[key]}")
PY
)"
lay() {   # lay patchkit's layer over a copy of the site: files, and the whiteouts unless told not to
    local dest=$1 whiteouts=$2 prefix
    prefix=$(python3 -c "import json; print(json.load(open('$PROOF/image.json'))['site'].lstrip('/'))")
    rm -rf "$dest"; cp -a "$SITE" "$dest"
    python3 - "$dest" "$prefix" "$whiteouts" <<'PY'
import os, pathlib, shutil, sys, tarfile
dest, prefix, whiteouts = pathlib.Path(sys.argv[1]), sys.argv[2] + "/", sys.argv[3] == "yes"
with tarfile.open(os.environ["PROOF"] + "/layer.tar") as tar:
    for m in tar.getmembers():
        if not m.name.startswith(prefix) or m.name[len(prefix):].startswith("vllm/"):
            continue
        rel = pathlib.PurePosixPath(m.name[len(prefix):])
        if rel.name.startswith(".wh."):
            gone = dest / rel.parent / rel.name[4:]
            print(("whiteout " if whiteouts else "whiteout skipped ") + str(gone.relative_to(dest)))
            if whiteouts:
                shutil.rmtree(gone) if gone.is_dir() else gone.unlink()
        elif m.isfile():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            (dest / rel).write_bytes(tar.extractfile(m).read())
            print(f"file {rel}")
PY
}
echo "== 3. patchkit's layer without its whiteout: the patched norm.cuh, the provider intact"
lay /tmp/site-nowh no
PYTHONPATH=/tmp/site-nowh FLASHINFER_WORKSPACE_BASE=$IMG_FLASHINFER_WORKSPACE_BASE FLASHINFER_CUBIN_DIR=$IMG_FLASHINFER_CUBIN_DIR python3 /tmp/norm_run.py
echo "== 4. patchkit's layer as built: the patched norm.cuh, the provider's norm whited out"
lay /tmp/site-img yes
rm -rf /tmp/ws-img
PYTHONPATH=/tmp/site-img FLASHINFER_WORKSPACE_BASE=$IMG_FLASHINFER_WORKSPACE_BASE FLASHINFER_CUBIN_DIR=$IMG_FLASHINFER_CUBIN_DIR python3 /tmp/norm_run.py
