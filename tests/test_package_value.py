"""vLLM differs from the other packages by the data of its value (``PackageId``), never by a
comparison of names: the guard reads the sources, as a reviewer would grep them."""

from __future__ import annotations

import re
from pathlib import Path

from patchkit import manifest
from patchkit.packageid import VLLM, PackageId

SRC = Path(manifest.__file__).resolve().parents[1]   # src/patchkit
MANIFEST_DIR = SRC / "manifest"

# a package compared with vLLM by name or by value: `== VLLM`, `!= "vllm"`, `VLLM.name ==`,
# `is VLLM`, and the label written by hand (`"vLLM" if ...`); a path compared with vLLM's
# import folder (`VLLM.top`) compares no package
BY_NAME = re.compile(
    r"""(==|!=|\bis(\s+not)?)\s*(source\.)?VLLM\b(?!\.(top|dist)\b)"""
    r"""|\bVLLM(\.name)?\s*(==|!=)"""
    r"""|(==|!=)\s*VLLM\.name\b"""
    r"""|(==|!=)\s*["']vllm["']"""
    r"""|["']vllm["']\s*(==|!=)"""
    r"""|["']vLLM["']\s+if\b""")
# a second constant naming vLLM: `PACKAGE = "vllm"`, `VLLM = "vllm"`
CONSTANT = re.compile(r"""^[A-Z_]+\s*=\s*["']vllm["']\s*(#.*)?$""", re.MULTILINE)


def _sources() -> dict[str, str]:
    return {str(p.relative_to(SRC)): p.read_text(encoding="utf-8") for p in SRC.rglob("*.py")}


def test_no_code_outside_the_manifest_compares_a_package_with_vllm():
    found = [f"{name}:{text.count(chr(10), 0, m.start()) + 1}: {m.group(0)}"
             for name, text in _sources().items() if not name.startswith("manifest/")
             for m in BY_NAME.finditer(text)]
    assert found == [], "\n".join(found)


def test_the_guard_catches_what_it_is_for():
    for line in ('if name == VLLM:', 'x = a if package != VLLM else b', 'if p.name == "vllm":',
                 'what = "vLLM" if name == VLLM else name', 'if VLLM.name == n:',
                 'if package == source.VLLM:', "if n != 'vllm':"):
        assert BY_NAME.search(line), line
    for line in ('package: str = VLLM.name', 'found[VLLM.name] = v', 'label = VLLM.label'):
        assert not BY_NAME.search(line), line


def test_vllm_is_named_by_one_constant():
    constants = [f"{name}: {m.group(0)}" for name, text in _sources().items()
                 for m in CONSTANT.finditer(text)]
    assert constants == []
    made = [name for name, text in _sources().items()
            if re.search(r"PackageId\(\s*[\"']vllm[\"']", text)]
    assert made == ["packageid.py"]


def test_what_sets_vllm_apart_is_data_of_its_value(tmp_path):
    fi = manifest.identity("flashinfer", "flashinfer-python")
    assert manifest.identity("vllm", "vllm") is VLLM
    assert (VLLM.label, fi.label) == ("vLLM", "flashinfer")
    work = tmp_path / ".patchkit" / "vllm"
    assert VLLM.checkout(work) == work
    assert fi.checkout(work) == tmp_path / ".patchkit" / "flashinfer"
    assert VLLM.option("repo", "image") == "--vllm-repo image"
    assert fi.option("repo", "image") == "packages.flashinfer.repo: image"
    assert (VLLM.key("ref"), fi.key("ref")) == ("vllm.ref", "packages.flashinfer.ref")
    assert (VLLM.beside("patches"), fi.beside("patches")) == ("patches", "patches/flashinfer")
    assert (VLLM.confined, fi.confined) == (False, True)
    assert (VLLM.aside(" ({})"), fi.aside(" ({})")) == ("", " (flashinfer)")


def test_the_manifest_makes_every_package_value_and_the_run_carries_it(tmp_path):
    path = tmp_path / "patchset.yaml"
    path.write_text("name: demo\nvllm:\n  repo: pypi\n  ref: v0.27.1\n"
                    "packages:\n  flashinfer:\n    dist: flashinfer-python\n    repo: pypi\n"
                    "    ref: v0.6.15\npatches: []\n")
    m = manifest.load(path)
    assert m.vllm.id is VLLM and m.vllm.label == "vLLM"
    fi = m.package("flashinfer")
    assert fi.id == PackageId("flashinfer", "flashinfer-python", "", "flashinfer")
    assert fi.checkout(tmp_path / "w" / "vllm") == tmp_path / "w" / "flashinfer"
    from patchkit.run import run_spec

    pins = run_spec(m, refs=["flashinfer=v0.6.16"]).pins
    assert [(p.id, p.ref) for p in pins] == [(VLLM, "v0.27.1"), (fi.id, "v0.6.16")]
