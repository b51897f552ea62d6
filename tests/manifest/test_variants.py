"""Variants: the manifest keys, and which patches apply, verify and rebase-check take."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from testing import patchkit
from testing.project import make_project
from testing.said import said

from patchkit import manifest
from patchkit.commands import rebase_check, verify
from patchkit.run import run_spec
from patchkit.errors import ManifestError, UsageError
from patchkit.manifest import variants
from patchkit.series import applier, checkout


MANIFEST = """\
name: demo
vllm:
  repo: {repo}   # the fixture upstream
  ref: v1
image:
  tag: demo:{{ref}}-{{variant}}
variants:
  diag: position-0 diagnostics on   # for a diagnostic run
  trace: request tracing
patches:
  - id: table-nvfp4
    summary: add nvfp4 to the table
    diff: patches/table.diff
    verify:
      - file: pkg/mod.py
        in: TABLE
        has_key: nvfp4
  - id: fast-mode
    summary: make the mode fast
    transform: patches/fast.py
    variants: [diag]
    verify:
      - file: pkg/mod.py
        in: Config.setup
        contains: fast
  - id: extra-file
    summary: add a new module
    overlay: overlays/extra
    variants: [diag, trace]
    verify:
      - file: pkg/extra.py
        defines: EXTRA
"""


@pytest.fixture
def proj(tmp_path) -> Path:
    return make_project(tmp_path, MANIFEST)


def fates(report) -> list[tuple[str, str, str]]:
    return [(p.id, p.status, p.message if p.status == "skipped" else "") for p in report.patches]


# ------------------------------------------------------------------------------ the manifest

def test_variants_load_in_order_with_their_lines(proj):
    m = manifest.load(proj / "patchset.yaml")
    assert [(v.name, v.description, v.line) for v in m.variants.values()] == [
        ("diag", "position-0 diagnostics on", 8), ("trace", "request tracing", 9)]
    assert [p.variants for p in m.patches] == [(), ("diag",), ("diag", "trace")]
    assert [p.id for p in variants.selected(m, None)] == ["table-nvfp4"]
    assert [p.id for p in variants.selected(m, "trace")] == ["table-nvfp4", "extra-file"]
    assert [p.id for p in variants.selected(m, variants.EVERY)] == [p.id for p in m.patches]


def _error(proj: Path, old: str, new: str) -> str:
    path = proj / "patchset.yaml"
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new, 1))
    with pytest.raises(ManifestError) as info:
        manifest.load(path)
    message = str(info.value)
    assert "\n" not in message and info.value.exit_code == 2
    return message.replace(str(path), "patchset.yaml")


@pytest.mark.parametrize("old,new,message", [
    ("variants: [diag]\n", "variants: [dag]\n",
     "patchset.yaml:21: patches[1] (id=fast-mode): variants[0]: unknown variant 'dag'; did you "
     "mean 'diag'?"),
    ("variants: [diag, trace]", "variants: [diag, nope]",
     "patchset.yaml:29: patches[2] (id=extra-file): variants[1]: unknown variant 'nope' "
     "(expected one of: diag, trace)"),
    ("variants: [diag]\n", "variants: diag\n",
     "patchset.yaml:21: patches[1] (id=fast-mode): variants: expected a list of variant names, "
     "got the string 'diag'"),
    ("variants: [diag]\n", "variants: []\n",
     "patchset.yaml:21: patches[1] (id=fast-mode): variants: the list is empty; drop the key to "
     "put the patch in every build"),
    ("variants: [diag]\n", "variants: [diag, diag]\n",
     "patchset.yaml:21: patches[1] (id=fast-mode): variants[1]: 'diag' is named twice"),
    ("variants: [diag]\n", "variants: [1]\n",
     "patchset.yaml:21: patches[1] (id=fast-mode): variants[0]: expected a string, got the "
     "number 1 (quote it to make it a string)"),
    ("  diag: position-0", "  Diag: position-0",
     "patchset.yaml:8: variants: 'Diag' is not a valid variant name (lowercase letters, digits "
     "and '-', starting with a letter or digit)"),
    ("  trace: request tracing\n", "  trace:\n",
     "patchset.yaml:9: variants.trace: expected a string, got nothing (null)"),
    ("variants:\n  diag: position-0 diagnostics on   # for a diagnostic run\n  trace: request "
     "tracing\n", "variants: [diag, trace]\n",
     "patchset.yaml:7: variants: expected a mapping of variant name -> one-line description, got "
     "a list"),
])
def test_bad_variants_are_one_line_with_the_line(proj, old, new, message):
    assert _error(proj, old, new) == message


def test_a_patch_naming_a_variant_of_a_manifest_without_variants(proj):
    text = (proj / "patchset.yaml").read_text()
    start, end = text.index("variants:\n"), text.index("patches:")
    (proj / "patchset.yaml").write_text(text[:start] + text[end:])
    with pytest.raises(ManifestError, match=r"^.*patchset.yaml:18: patches\[1\] \(id=fast-mode\): "
                       r"variants\[0\]: unknown variant 'diag': the manifest declares no variants"):
        manifest.load(proj / "patchset.yaml")


def test_variants_may_come_after_the_patches(proj):
    text = (proj / "patchset.yaml").read_text()
    start, end = text.index("variants:\n"), text.index("patches:")
    block = text[start:end]
    (proj / "patchset.yaml").write_text(text[:start] + text[end:] + block)
    assert list(manifest.load(proj / "patchset.yaml").variants) == ["diag", "trace"]


def test_an_unknown_variant_flag_is_a_usage_error(proj):
    m = manifest.load(proj / "patchset.yaml")
    with pytest.raises(UsageError) as info:
        variants.check(m, "dig")
    assert said(info.value) == "--variant 'dig': unknown variant; did you mean 'diag'?"
    assert str(info.value) == "variant 'dig': unknown variant; did you mean 'diag'?"
    with pytest.raises(UsageError) as info:
        variants.check(m, "zzz")
    assert said(info.value) == "--variant 'zzz': unknown variant (declared: diag, trace)"


@pytest.mark.parametrize("template,variant,tag", [
    ("demo:{ref}-{variant}", None, "demo:{ref}"),
    ("demo:{ref}-{variant}", "diag", "demo:{ref}-diag"),
    ("demo:{variant}-{ref}", None, "demo:{ref}"),
    ("demo-{variant}:{ref}", None, "demo:{ref}"),
    ("demo:{ref}{variant}", None, "demo:{ref}"),
    ("demo:{ref}", "diag", "demo:{ref}"),
])
def test_the_variant_in_a_tag(template, variant, tag):
    assert variants.fill_tag(template, variant) == tag


# ------------------------------------------------------------------------------ apply, verify

def test_apply_without_a_variant_skips_the_variant_patches_with_the_reason(proj):
    m = manifest.load(proj / "patchset.yaml")
    wd = proj / ".patchkit/vllm"
    report = applier.apply_series(m, run=run_spec(m), workdir=wd)
    assert report.ok, report.to_json()
    assert fates(report) == [("table-nvfp4", "applied", ""),
                             ("fast-mode", "skipped", "only in variant diag"),
                             ("extra-file", "skipped", "only in variants diag, trace")]
    assert [a.patch for a in report.verify] == ["table-nvfp4"]
    assert '"plain"' in (wd / "pkg/mod.py").read_text() and not (wd / "pkg/extra.py").exists()
    assert report.to_dict()["variant"] is None
    # the checkout remembers how it was made: verify agrees with it
    assert checkout.read_report(wd).variant is None
    assert [a.patch for a in verify.verify_tree(m, wd)] == ["table-nvfp4"]
    with pytest.raises(UsageError, match=r"^--variant diag: --tree .* was built as the default "
                                         r"build \(no variant\); verify it as that"):
        verify.verify_tree(m, wd, "diag")


def test_apply_of_a_variant_adds_its_patches_and_is_recorded(proj):
    m = manifest.load(proj / "patchset.yaml")
    wd = proj / ".patchkit/vllm"
    report = applier.apply_series(m, run=run_spec(m, variant="diag"), workdir=wd)
    assert report.ok, report.to_json()
    assert fates(report) == [("table-nvfp4", "applied", ""), ("fast-mode", "applied", ""),
                             ("extra-file", "applied", "")]
    report = applier.apply_series(m, run=run_spec(m, variant="trace"), workdir=wd)
    assert fates(report) == [("table-nvfp4", "applied", ""),
                             ("fast-mode", "skipped", "only in variant diag"),
                             ("extra-file", "applied", "")]
    assert '"plain"' in (wd / "pkg/mod.py").read_text() and (wd / "pkg/extra.py").exists()
    assert checkout.read_report(wd).variant == "trace"
    assert [a.patch for a in verify.verify_tree(m, wd)] == ["table-nvfp4", "extra-file"]
    assert [a.ok for a in verify.verify_tree(m, wd, "trace")] == [True, True]
    with pytest.raises(UsageError, match=r"was built as variant trace; verify it as that \(drop "
                                         r"--variant or give --variant trace\)$"):
        verify.verify_tree(m, wd, "diag")


def test_a_tree_without_a_report_is_verified_as_the_variant_asked(proj, tmp_path):
    m = manifest.load(proj / "patchset.yaml")
    wd = proj / ".patchkit/vllm"
    applier.apply_series(m, run=run_spec(m, variant="diag"), workdir=wd)
    checkout.report_path(wd).unlink()
    assert [a.patch for a in verify.verify_tree(m, wd)] == ["table-nvfp4"]
    assert [(a.patch, a.ok) for a in verify.verify_tree(m, wd, "diag")] == [
        ("table-nvfp4", True), ("fast-mode", True), ("extra-file", True)]
    assert [(a.patch, a.ok) for a in verify.verify_tree(m, wd, "trace")] == [
        ("table-nvfp4", True), ("extra-file", True)]


def test_cli_variant_flags(proj):
    p = patchkit("apply", "--variant", "diag", "--format", "json", cwd=proj)
    assert p.returncode == 0, p.stderr
    data = json.loads(p.stdout)
    assert data["variant"] == "diag" and [x["status"] for x in data["patches"]] == ["applied"] * 3
    p = patchkit("verify", cwd=proj)
    assert p.returncode == 0 and p.stdout.startswith("ok: 3/3 assertions passed"), p.stdout
    p = patchkit("verify", "--variant", "trace", cwd=proj)
    assert p.returncode == 2 and "was built as variant diag" in p.stderr
    assert len(p.stderr.splitlines()) == 1
    p = patchkit("apply", cwd=proj)
    assert p.returncode == 0
    assert "skipped   fast-mode: only in variant diag" in p.stdout.splitlines()
    assert p.stdout.splitlines()[-1].startswith("ok: 1 applied, 2 skipped; 1/1 assertions")
    p = patchkit("apply", "--variant", "diag", cwd=proj)
    assert p.stdout.splitlines()[-1].startswith("ok: 3 applied; 3/3 assertions passed")
    assert ", variant diag)" in p.stdout.splitlines()[-1]


@pytest.mark.parametrize("args,message", [
    (("apply", "--variant", "nope"), "patchkit apply: error: --variant 'nope': unknown variant "
                                     "(declared: diag, trace)"),
    (("verify", "--variant", "dia"), "patchkit verify: error: --variant 'dia': unknown variant; did you "
                                     "mean 'diag'?"),
    (("rebase-check", "--to", "v2", "--variant", "nope"),
     "patchkit rebase-check: error: --variant 'nope': unknown variant (declared: diag, trace)"),
    (("build-image", "--variant", "nope"),
     "patchkit build-image: error: --variant 'nope': unknown variant (declared: diag, trace)"),
    (("apply", "--variant", "diag", "--variant", "trace"),
     "patchkit apply: error: Invalid value for '--variant': give it once: a build is one variant "
     "(see 'patchkit apply --help')"),
])
def test_cli_bad_variants_exit_2_in_one_line(proj, args, message):
    p = patchkit(*args, cwd=proj)
    assert (p.returncode, p.stderr.strip()) == (2, message)
    assert not (proj / ".patchkit").exists()


# ------------------------------------------------------------------------------ rebase-check

def test_rebase_check_of_a_variant(proj, tmp_path):
    m = manifest.load(proj / "patchset.yaml")
    default = rebase_check.check(m, ["v2", "v4"], run_spec(m, cache=tmp_path / "cache"), jobs=1)
    diag = rebase_check.check(m, ["v2", "v4"], run_spec(m, cache=tmp_path / "cache",
                                                        variant="diag"), jobs=2)
    words = {r.patch.id: [c.status for c in r.cells] for r in default.rows()}
    assert words == {"table-nvfp4": ["applied", "upstream"], "fast-mode": ["skipped", "skipped"],
                     "extra-file": ["skipped", "skipped"]}
    assert default.ok and default.to_dict()["variant"] is None
    words = {r.patch.id: [c.reason or c.status for c in r.cells] for r in diag.rows()}
    assert words == {"table-nvfp4": ["applied", "upstream"],
                     "fast-mode": ["applied", "anchor-missing"],
                     "extra-file": ["applied", "applied"]}
    assert not diag.ok
    data = diag.to_dict()
    assert data["variant"] == "diag" and [t["variant"] for t in data["targets"]] == ["diag"] * 2
    from patchkit.render import matrix as render

    assert render.render(diag, "text").splitlines()[0] == (
        "demo: 3 patches x 2 vLLM targets (pinned at v1, variant diag)")
    assert "only in variant diag" in default.targets[0].patches[1].message
