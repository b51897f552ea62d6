"""A patchset project against the real vLLM 0.27.1 (its PyPI layout), for the image tests.

The series touches what the real DSpark series touches, in miniature: a diff on
vllm/config/speculative.py and one on vllm/utils/torch_utils.py (the dtype map), a new module in
a new package folder.  ``remove_module`` adds the removal of a small module as a commit on top
of an applied checkout, as a user would before ``patchkit export``.  Each patched module carries a marker
that the tests look for inside the running arm64 container.  ``applied_project`` makes the
project and applies it; ``write_manifest`` puts it on a stack base, FlashInfer pinned beside vLLM.
"""

from __future__ import annotations

import os
import zipfile
from pathlib import Path

from patchkit import manifest
from patchkit.run import run_spec
from patchkit.series.applier import apply_series
from testing import flashinfer as fi
from testing import release_cache
from testing.baseimage import SITE as BASE_SITE, find_wheel
from testing.upstream import commit, unified

# where .ci/services.sh started the registry (a port it found free); unset, the registry
# fixture says so
REGISTRY = os.environ.get("PK_REGISTRY", "")
RELEASE = "0.27.1"        # the release the test patchset is applied to
SITE = "/" + BASE_SITE     # where the bases install vLLM

SPEC = "vllm/config/speculative.py"
DTYPES = "vllm/utils/torch_utils.py"
NEW = "vllm/patchkit_extra/draft_guard.py"
GONE = "vllm/utils/print_utils.py"
MARK_SPEC = "PATCHKIT_E2E_SPEC_MARKER"
MARK_NEW = "PATCHKIT_E2E_NEW_MARKER"
SERVE = "#!/bin/sh\necho \"patchkit-serve: vllm serve $*\"\n"


def wheel_text(version: str, rel: str) -> str:
    with zipfile.ZipFile(find_wheel(version)) as zf:
        return zf.read(rel).decode()


def patched_texts(version: str = "0.27.1") -> dict[str, str | None]:
    """What each touched file holds after the series (None: removed)."""
    spec = wheel_text(version, SPEC)
    dtypes = wheel_text(version, DTYPES)
    anchor = '    "bfloat16": torch.bfloat16,\n'
    assert dtypes.count(anchor) == 1
    return {
        SPEC: spec + f'\n\n{MARK_SPEC} = "draft quant config normalized"\n',
        DTYPES: dtypes.replace(anchor, anchor + '    "nvfp4_ds_mla": torch.uint8,\n'),
        NEW: f'"""Fail-closed guard for DSpark draft loading."""\n\n{MARK_NEW} = True\n\n\n'
             'def guard(weights):\n    if not weights:\n        raise ValueError("no draft weights")\n'
             '    return weights\n',
    }


def remove_module(workdir: Path) -> None:
    """Commit the removal of GONE on top of the applied checkout."""
    commit(workdir, "drop print_utils", {GONE: None})


MANIFEST = """\
name: {name}
vllm:
  repo: pypi
  ref: v{version}
image:
  base: {base}
  platform: linux/arm64
  tag: {tag}
patches:
  - id: draft-quant-config
    summary: normalize the draft quantization config
    diff: patches/draft-quant-config.diff
    verify:
      - file: vllm/config/speculative.py
        defines: {mark_spec}
  - id: nvfp4-ds-mla-dtype
    summary: map the nvfp4_ds_mla cache dtype
    diff: patches/nvfp4-ds-mla-dtype.diff
    verify:
      - file: vllm/utils/torch_utils.py
        in: STR_DTYPE_TO_TORCH_DTYPE
        has_key: nvfp4_ds_mla
  - id: draft-guard
    summary: fail-closed guard for DSpark draft loading
    diff: patches/draft-guard.diff
    verify:
      - file: vllm/patchkit_extra/draft_guard.py
        defines: guard
"""


def make_project(root: Path, *, base: str, tag: str, version: str = "0.27.1",
                 serve: bool = True, name: str = "pk-e2e") -> Path:
    """Writes patchset.yaml, patches/ and build/serve.sh under ``root``; returns the manifest.
    ``name``: the patchset's (a test whose images must not be cleared by others' gives its own).
    """
    texts = patched_texts(version)
    (root / "patches").mkdir(parents=True, exist_ok=True)
    pristine = {p: (wheel_text(version, p) if p != NEW else None) for p in texts}
    files = {"draft-quant-config": SPEC, "nvfp4-ds-mla-dtype": DTYPES, "draft-guard": NEW}
    for pid, rel in files.items():
        (root / "patches" / f"{pid}.diff").write_text(unified(rel, pristine[rel], texts[rel]))
    if serve:
        (root / "build").mkdir(exist_ok=True)
        (root / "build" / "serve.sh").write_text(SERVE)
    path = root / "patchset.yaml"
    path.write_text(MANIFEST.format(version=version, base=base, tag=tag, mark_spec=MARK_SPEC, name=name))
    return path


def applied_project(root: Path, *, base: str, tag: str, name: str = "pk-e2e",
                    remove: bool = False) -> tuple[manifest.Manifest, Path]:
    """The project made under ``root`` and applied to the release: its manifest and applied
    checkout; with ``remove``, GONE's removal committed on top (``remove_module``)."""
    m = manifest.load(make_project(root, base=base, tag=tag, name=name))
    workdir = root / ".patchkit" / "vllm"
    report = apply_series(m, run=run_spec(m, cache=release_cache()), workdir=workdir)
    assert report.ok, report.to_json()
    if remove:
        remove_module(workdir)
    return m, workdir


# FlashInfer pinned beside vLLM, for the image project on a stack base (testing.stackbase)
STACK_PACKAGES = """\
packages:
  flashinfer:
    dist: flashinfer-python
    repo: pypi
    ref: {fi_ref}
"""


def write_manifest(root, base: str, *, fi_ref="v0.6.15",
                   requires='{torch: "==2.11.*", nvidia-cutlass-dsl: ">=4.5,<4.6"}',
                   extra_package: str = "", name: str = "pk-stack", fi_patch: bool = False):
    """The image project's manifest on ``base``, named ``name``; with ``fi_patch``, FlashInfer's
    patch (testing.flashinfer.FI_ENTRY) ends its series."""
    path = root / "patchset.yaml"
    original = root / "patchset.orig"   # the image project's manifest, before any change
    if not original.exists():
        original.write_text(path.read_text())
    fi_entry = fi.FI_ENTRY if fi_patch else ""
    text = original.read_text().replace("name: pk-e2e\n", f"name: {name}\n")
    head, _, rest = text.partition("image:\n")
    image_block, _, patches = rest.partition("patches:\n")
    image_block = "\n".join(line for line in image_block.splitlines()
                            if not line.startswith("  base:"))
    path.write_text(head + STACK_PACKAGES.format(fi_ref=fi_ref) + extra_package + "image:\n"
                    + f"  base: {base}\n" + image_block + f"\n  requires: {requires}\n"
                    + "patches:\n" + patches + fi_entry)
    return manifest.load(path)
