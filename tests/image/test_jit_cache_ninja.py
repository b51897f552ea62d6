"""The cache question, with ninja and FlashInfer's own rule (depfiles, ``deps = gcc``) and the
host compiler in place of nvcc: a module built from the pristine header into the cache at
FlashInfer's default place, then the image's patched header with the overlay layer's old time.
In the default place ninja says "no work to do" and the unpatched module stays; the place the
image gives its JIT cache (``FLASHINFER_WORKSPACE_BASE``) holds no module built from other
sources, so ninja builds the patched one."""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from patchkit.image import build, prebuilt
from testing.checkout import applied, changed
from testing.flashinfer import MOE_HEADER as HEADER

SOURCE = "flashinfer/data/csrc/fused_moe/cutlass_backend/cutlass_fused_moe_instantiation.cu"
OLD = 1_700_000_000   # the overlay layer's time: the base commit's, older than any build since

# FlashInfer's rule (jit/cpp_ext.py), with the host compiler
NINJA = """\
ninja_required_version = 1.3
rule compile
  command = gcc -x c -MD -MF $out.d -fPIC -I{include} -c $in -o $out
  depfile = $out.d
  deps = gcc
rule link
  command = gcc -shared $in -o $out
build instantiation.o: compile {source}
build fused_moe_120.so: link instantiation.o
"""


def _module(site: Path, cache: Path) -> tuple[str, int]:
    """ninja in ``cache``'s module folder, as FlashInfer runs it: its output and the built
    module's answer."""
    folder = cache / ".cache" / "flashinfer" / "0.6.15" / "120" / "cached_ops" / "fused_moe_120"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "build.ninja").write_text(NINJA.format(
        include=site / Path(HEADER).parent, source=site / SOURCE))
    out = subprocess.run(["ninja", "-C", str(folder)], capture_output=True, text=True,
                         check=True).stdout
    lib = ctypes.CDLL(str(folder / "fused_moe_120.so"))
    return out, lib.scale(1)


def test_a_mounted_cache_of_the_pristine_header_is_not_the_images(tmp_path):
    if shutil.which("ninja") is None or shutil.which("gcc") is None:
        pytest.fail("ninja and gcc are needed: apt-get install -y ninja-build gcc")
    site = tmp_path / "site"
    (site / HEADER).parent.mkdir(parents=True)
    (site / SOURCE).write_text('#include "cutlass_fused_moe_kernels.cuh"\n'
                               "int scale(int x) { return FACTOR * x; }\n")
    (site / HEADER).write_text("#define FACTOR 1\n")
    home = tmp_path / "home"          # the host's cache, mounted at FlashInfer's default place
    out, answer = _module(site, home)
    assert answer == 1

    # the image's patched header, laid with the layer's old time
    (site / HEADER).write_text("#define FACTOR 2\n")
    os.utime(site / HEADER, (OLD, OLD))
    out, answer = _module(site, home)
    assert "no work to do" in out and answer == 1    # the trap: the unpatched module runs

    tree = build.PackageTree("flashinfer", "flashinfer-python",
                             applied({HEADER: ["fused_moe_120"]}), (changed(HEADER, "2" * 40),),
                             "/site")
    place = prebuilt.workspace([tree], None)["FLASHINFER_WORKSPACE_BASE"]
    assert not place.startswith(str(home))
    image_cache = tmp_path / place.lstrip("/")
    out, answer = _module(site, image_cache)
    assert "no work to do" not in out and answer == 2   # built from the patched header
