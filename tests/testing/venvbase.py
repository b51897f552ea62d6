"""The image unit tests' case, made by hand: a base holding vLLM 0.27.1 in a venv (python3.12
under /opt/venv) as the in-memory engine (testing.fakeengine) holds its files, the applied
checkout that goes on it, and the project that names both."""

from __future__ import annotations

import json
from pathlib import Path

from patchkit.manifest import ImageDefaults, Manifest, VllmSource
from testing.upstream import commit, sh, write_files

SITE = "/opt/venv/lib/python3.12/site-packages"
SPEC_V1 = "class SpeculativeConfig:\n    method = 'ngram'\n"
SPEC_V2 = SPEC_V1 + "    draft_quant = 'normalized'\n"


def applied_checkout(tmp: Path) -> Path:
    """An applied checkout at ``tmp/vllm``: one modified, one added, one removed module, one
    test."""
    wd = tmp / "vllm"
    write_files(wd, {"vllm/__init__.py": "", "vllm/config/speculative.py": SPEC_V1,
                     "vllm/utils/old.py": "OLD = 1\n"})
    sh("git", "init", "-q", cwd=wd)
    commit(wd, "upstream")
    sh("git", "tag", "patchkit/base", cwd=wd)
    commit(wd, "patched", {"vllm/config/speculative.py": SPEC_V2,
                           "vllm/dspark/guard.py": "GUARD = True\n", "vllm/utils/old.py": None,
                           "tests/test_guard.py": "def test(): pass\n"})
    (wd / ".git" / "patchkit-report.json").write_text(json.dumps({
        "ok": True, "vllm": {"ref": "v0.27.1", "commit": "c" * 40, "version": "0.27.1",
                             "repo": "https://example.invalid/vllm.git"},
        "patches": [{"id": "p1", "status": "applied"}, {"id": "p2", "status": "upstream"}]}))
    return wd


def demo_project(tmp: Path) -> Manifest:
    """The project at ``tmp/proj``: its serve script, and the manifest naming the base."""
    root = tmp / "proj"
    (root / "build").mkdir(parents=True)
    (root / "patchset.yaml").write_text("name: demo\n")
    (root / "build" / "serve.sh").write_text("#!/bin/sh\nexec vllm serve \"$@\"\n")
    return Manifest(name="demo", root=root, path=root / "patchset.yaml",
                    vllm=VllmSource(("https://example.invalid/vllm.git",), "v0.27.1"),
                    image=ImageDefaults(base="reg:5000/vllm/base:0.27.1", tag="demo:{ref}"),
                    patches=())


def base_fs(version: str = "0.27.1", spec: str = SPEC_V1) -> dict[str, bytes]:
    """The base's files: the release's package with stale byte-code beside the modules the
    checkout changes, and another site's package."""
    return {f"{SITE}/vllm/__init__.py": b"", f"{SITE}/vllm/config/speculative.py": spec.encode(),
            f"{SITE}/vllm/utils/old.py": b"OLD = 1\n",
            f"{SITE}/vllm/_version.py": f"__version__ = version = '{version}'\n".encode(),
            f"{SITE}/vllm-{version}.dist-info/METADATA": f"Name: vllm\nVersion: {version}\n".encode(),
            f"{SITE}/vllm/config/__pycache__/speculative.cpython-312.pyc": b"stale",
            f"{SITE}/vllm/config/__pycache__/speculative.cpython-312.opt-1.pyc": b"stale",
            f"{SITE}/vllm/utils/__pycache__/old.cpython-312.pyc": b"stale",
            "/usr/local/lib/python3.11/dist-packages/yaml/__init__.py": b""}
