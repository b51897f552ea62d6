"""The stack through the CLI: apply's report per package, verify on each checkout,
rebase-check of FlashInfer over real releases, and one line for each bad input."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from patchkit import manifest

from testing import patchkit, release_cache
from testing.flashinfer import (FI_FILE, FI_TILE_ENTRY, FI_TILE_PATCH, FI_TILE_RELEASES,
                                TOPK_ENTRY, TOPK_FILE, TOPK_PATCH, ensure_releases,
                                git_history, make_stack)

pytestmark = pytest.mark.real_vllm


@pytest.fixture(scope="module")
def applied(tmp_path_factory) -> Path:
    """The stack project, applied once through the CLI."""
    ensure_releases(release_cache())
    proj = make_stack(tmp_path_factory.mktemp("stack"))
    p = run(proj, "apply")
    assert p.returncode == 0, p.stderr
    return proj


def run(proj: Path, *args: str):
    return patchkit(*args, cwd=proj, env={**os.environ, "PATCHKIT_CACHE_DIR": str(release_cache())})


def test_apply_text_labels_each_package_and_prints_its_pin(applied):
    p = run(applied, "apply", "--format", "text")
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert any(line.startswith("applied   fi-moe-activations (flashinfer) [") for line in lines)
    assert any(line.startswith("applied   table-nvfp4 [") for line in lines)
    fi = applied / ".patchkit" / "flashinfer"
    assert any(line.startswith("flashinfer v0.6.15 = ") and line.endswith(
        f", version 0.6.15, from pypi, checkout at {fi}") for line in lines), lines


def test_apply_json_has_a_section_per_package(applied):
    p = run(applied, "apply", "--format", "json")
    assert p.returncode == 0, p.stderr
    data = json.loads(p.stdout)
    assert set(data["packages"]) == {"vllm", "flashinfer"}
    assert data["packages"]["flashinfer"]["version"] == "0.6.15"
    assert {e["id"]: e["package"] for e in data["patches"]}["fi-moe-activations"] == "flashinfer"


def test_validate_json_lists_every_package_for_a_ci_matrix(applied):
    p = run(applied, "validate", "--format", "json")
    assert p.returncode == 0, p.stderr
    data = json.loads(p.stdout)
    pins = [(p.name, p.dist, p.ref) for p in manifest.load(applied / "patchset.yaml").packages]
    assert [(e["name"], e["dist"], e["ref"]) for e in data["packages"]] == pins
    assert pins[1] == ("flashinfer", "flashinfer-python", "v0.6.15")
    counts = {e["name"]: e["patches"] for e in data["packages"]}
    assert counts["flashinfer"] == 1 and counts["vllm"] == data["patches"] - 1


def test_verify_checks_each_package_on_its_checkout(applied):
    p = run(applied, "verify", "--format", "json")
    assert p.returncode == 0, p.stdout + p.stderr
    files = {a["file"] for a in json.loads(p.stdout)["verify"]}
    assert FI_FILE in files and "pkg/mod.py" in files
    p = run(applied, "verify", "--package", "flashinfer", "--format", "json")
    assert {a["file"] for a in json.loads(p.stdout)["verify"]} == {FI_FILE}
    # FlashInfer's file overwritten: its assertions fail on its checkout, vLLM's still pass
    fi = applied / ".patchkit" / "flashinfer"
    good = (fi / FI_FILE).read_bytes()
    try:
        (fi / FI_FILE).write_text("x = 1\n")
        p = run(applied, "verify", "--package", "vllm")
        assert p.returncode == 0, p.stdout
        p = run(applied, "verify")
        assert p.returncode == 1
        assert f"{FI_FILE}:1:0: [fi-moe-activations] " in p.stdout
    finally:
        (fi / FI_FILE).write_bytes(good)


def test_verify_names_a_package_without_its_checkout(applied, tmp_path):
    import shutil

    tree = tmp_path / "t" / "vllm"
    shutil.copytree(applied / ".patchkit" / "vllm", tree, symlinks=True)
    p = run(applied, "verify", "--tree", str(tree))
    assert p.returncode == 2
    assert p.stderr.strip().splitlines() == [
        f"patchkit verify: error: flashinfer has 1 patch with assertions but no checkout at "
        f"{tmp_path / 't' / 'flashinfer'}; run 'patchkit apply'"]


def test_rebase_check_gives_flashinfers_matrix_over_its_releases(applied):
    p = run(applied, "rebase-check", "--package", "flashinfer", "--to", "v0.6.16",
            "--to", "v0.6.15", "--format", "json")
    assert p.returncode == 0, p.stderr
    data = json.loads(p.stdout)
    assert data["package"] == "flashinfer" and data["package_pin"] == "v0.6.15"
    assert [r["id"] for r in data["patches"]] == ["fi-moe-activations"]
    assert data["patches"][0]["status"] == {"v0.6.15": "applied", "v0.6.16": "applied"}
    assert [t["packages"]["flashinfer"]["version"] for t in data["targets"]] == ["0.6.15",
                                                                               "0.6.16"]
    assert "flashinfer v0.6.16: ok" in p.stderr.splitlines()


def test_vllms_matrix_judges_a_flashinfer_range_at_flashinfers_pin(applied):
    p = run(applied, "rebase-check", "--to", "v2", "--ref", "flashinfer=v0.6.16",
            "--format", "json")
    assert p.returncode == 0, p.stderr
    data = json.loads(p.stdout)
    cells = {e["id"]: (e["status"], e["message"]) for e in data["targets"][0]["patches"]}
    assert cells["fast-mode"] == ("skipped", "flashinfer 0.6.16 is outside <0.6.16")
    assert cells["table-nvfp4"][0] == "applied"
    assert cells["fi-moe-activations"] == ("skipped", "it patches flashinfer, which has no "
                                                      "checkout in this run")


@pytest.mark.parametrize("args, line", [
    (["apply", "--ref", "flashinfer"],
     "patchkit apply: error: --ref 'flashinfer': give NAME=REF, e.g. --ref flashinfer=v0.6.16"),
    (["apply", "--ref", "triton=v3"],
     "patchkit apply: error: --ref triton: the manifest has no package 'triton' (packages: vllm, "
     "flashinfer)"),
    (["apply", "--package", "flashinfr"],
     "patchkit apply: error: --package flashinfr: the manifest has no package 'flashinfr' "
     "(packages: vllm, flashinfer); did you mean 'flashinfer'?"),
    (["verify", "--package", "flashinfr"],
     "patchkit verify: error: --package flashinfr: the manifest has no package 'flashinfr' "
     "(packages: vllm, flashinfer); did you mean 'flashinfer'?"),
    (["apply", "--ref", "flashinfer=v0.6.99"],
     "patchkit apply: error: flashinfer release 0.6.99 is not on PyPI (no flashinfer-python==0.6.99 "
     "wheel)"),
])
def test_bad_input_is_one_line_and_changes_nothing(applied, args, line):
    before = sorted(p.name for p in (applied / ".patchkit").iterdir())
    heads = [(applied / ".patchkit" / n / ".git" / "HEAD").read_text() for n in before]
    p = run(applied, *args)
    assert p.returncode == 2, p.stdout + p.stderr
    assert p.stderr.strip().splitlines()[-1:] == [line]
    assert "Traceback" not in p.stderr
    assert sorted(p.name for p in (applied / ".patchkit").iterdir()) == before
    assert [(applied / ".patchkit" / n / ".git" / "HEAD").read_text() for n in before] == heads


def test_rebase_moves_flashinfers_pin_alone(tmp_path):
    """`rebase --package flashinfer --to` rebases FlashInfer's patches on the new release and
    rewrites only FlashInfer's `ref:` line; vLLM's patches and pin stay."""
    ensure_releases(release_cache())
    proj = make_stack(tmp_path)
    before = (proj / "patchset.yaml").read_text()
    p = run(proj, "rebase", "--package", "flashinfer", "--to", "v0.6.16")
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert lines[-1] == "ok: rebased from flashinfer v0.6.15 to v0.6.16; review with `git diff`"
    assert any(ln.startswith(("applied   fi-moe-activations", "refreshed fi-moe-activations"))
               for ln in lines), p.stdout
    assert "skipped   fast-mode: it patches vllm, whose pin stays" in lines
    after = (proj / "patchset.yaml").read_text()
    changed = [(a, b) for a, b in zip(before.splitlines(), after.splitlines()) if a != b]
    assert changed == [("    ref: v0.6.15", "    ref: v0.6.16")]
    p = run(proj, "apply", "--package", "flashinfer")
    assert p.returncode == 0, p.stderr
    assert "_SUPPORTED_ACTIVATIONS" in (proj / ".patchkit/flashinfer" / FI_FILE).read_text()
    p = run(proj, "rebase", "--package", "flashinfr", "--to", "v0.6.16")
    assert p.returncode == 2 and "did you mean 'flashinfer'?" in p.stderr


@pytest.fixture(scope="module")
def guarded(tmp_path_factory) -> Path:
    """The stack project with a second FlashInfer patch, FI_TILE_PATCH, after FI_PATCH: it
    applies on 0.6.17 and conflicts on 0.6.18, the next release on PyPI."""
    ensure_releases(release_cache(), FI_TILE_RELEASES)
    proj = make_stack(tmp_path_factory.mktemp("guarded"), extra=FI_TILE_ENTRY)
    (proj / "patches" / "flashinfer" / "fi-nvfp4-only.diff").write_text(FI_TILE_PATCH)
    return proj


def test_bisect_walks_flashinfers_releases(guarded):
    p = run(guarded, "bisect", "fi-nvfp4-only", "--good", "v0.6.17", "--bad", "v0.6.18")
    assert p.returncode == 1, p.stderr   # the pypi source names the pair, not the commit
    lines = p.stdout.splitlines()
    assert lines[0].startswith("fi-nvfp4-only (flashinfer): applied at v0.6.17 (")
    assert "), failed/conflict at v0.6.18 (" in lines[0]
    assert lines[1] == ("it changes between the flashinfer releases v0.6.17 (applied) and "
                        "v0.6.18 (failed/conflict)")
    assert "tested 2 of 2 releases, both ends included (at most 2)" in lines
    assert f"upstream diff of {FI_FILE} from v0.6.17 to v0.6.18:" in lines
    # the upstream change that broke it: 0.6.18 rewrote the line the patch holds on
    assert "-        tile_k = sf_vec_size * 8" in lines
    assert "+        tile_k = 128 if sf_vec_size == 32 else sf_vec_size * 8" in lines
    assert any(line.startswith("fi-nvfp4-only at flashinfer v0.6.18 (") and
               line.endswith(": failed/conflict") for line in p.stderr.splitlines()), p.stderr


def test_bisect_json_of_a_flashinfer_patch(guarded):
    p = run(guarded, "bisect", "fi-nvfp4-only", "--ref", "flashinfer=v0.6.17",
            "--bad", "v0.6.18", "--format", "json")
    assert p.returncode == 1, p.stderr
    data = json.loads(p.stdout)
    assert (data["package"], data["source"], data["ok"], data["first_bad"]) == (
        "flashinfer", "pypi", False, None)
    # --ref flashinfer= moved the pin the search starts from; its own `flashinfer: "<0.6.18"`
    # range is ignored, so at 0.6.18 it is tried (and conflicts) instead of being skipped
    assert (data["good"]["ref"], data["good"]["fate"]) == ("v0.6.17", "applied")
    assert (data["bad"]["ref"], data["bad"]["fate"]) == ("v0.6.18", "failed/conflict")
    assert "hunk 1 of " + FI_FILE in data["bad"]["message"]
    assert [data["narrowed"][end]["ref"] for end in ("good", "bad")] == ["v0.6.17", "v0.6.18"]
    assert data["files"] == [FI_FILE] and data["commits"] == 1 and data["tested"] == 2
    assert "tile_k = 128 if sf_vec_size == 32" in data["diff"]


@pytest.mark.parametrize("args, line", [
    (["--bad", "v0.6.99"], "flashinfer release 0.6.99 is not on PyPI (no "
                           "flashinfer-python==0.6.99 wheel)"),
    (["--good", "v0.6.18", "--bad", "v0.6.17"],
     "--good flashinfer v0.6.18 is not older than --bad flashinfer v0.6.17 (swap them?)"),
    (["--good", "v0.6.17", "--ref", "flashinfer=v0.6.16"],
     "--good v0.6.17 and --ref flashinfer= both say where the bisect starts; give one"),
])
def test_bisect_of_a_flashinfer_patch_bad_input_is_one_line(guarded, args, line):
    p = run(guarded, "bisect", "fi-nvfp4-only", *args)
    assert p.returncode == 2, p.stdout + p.stderr
    assert p.stderr.strip().splitlines()[-1] == f"patchkit bisect: error: {line}"
    assert "Traceback" not in p.stderr


def test_bisect_of_a_vllm_patch_judges_its_flashinfer_range_at_flashinfers_pin(guarded):
    # fast-mode holds on flashinfer <0.6.16: with FlashInfer's pin moved to 0.6.16 it is
    # skipped at both ends, its vllm: range alone being the one a bisect ignores
    p = run(guarded, "bisect", "fast-mode", "--ref", "flashinfer=v0.6.16", "--format", "json")
    assert p.returncode == 0, p.stdout + p.stderr
    data = json.loads(p.stdout)
    assert (data["package"], data["changed"]) == ("vllm", False)
    for end in ("good", "bad"):
        assert (data[end]["fate"], data[end]["message"]) == (
            "skipped", "flashinfer 0.6.16 is outside <0.6.16")
    p = run(guarded, "bisect", "fast-mode", "--format", "json")
    assert p.returncode == 0, p.stdout + p.stderr
    assert json.loads(p.stdout)["good"]["fate"] == "applied"


@pytest.fixture(scope="module")
def from_git(tmp_path_factory) -> tuple[Path, dict[str, str]]:
    """The guarded project, FI_TILE_PATCH without its range, with FlashInfer taken from a git
    history of its releases 0.6.16, 0.6.17, 0.6.18 (one commit each, on one line), pinned at
    0.6.16; and each release's commit."""
    ensure_releases(release_cache(), ("v0.6.16", *FI_TILE_RELEASES))
    tmp = tmp_path_factory.mktemp("fi-git")
    repo = git_history(release_cache(), tmp / "flashinfer.git", ("v0.6.16", *FI_TILE_RELEASES))
    proj = make_stack(tmp, extra=FI_TILE_ENTRY)
    (proj / "patches" / "flashinfer" / "fi-nvfp4-only.diff").write_text(FI_TILE_PATCH)
    yaml = proj / "patchset.yaml"
    text = yaml.read_text().replace("    repo: [pypi]\n    ref: v0.6.15\n",
                                    f"    repo: [{repo}]\n    ref: v0.6.16\n")
    # without its range: rebase-check tries it at 0.6.18 (and bisects the failure)
    yaml.write_text(text.replace('    flashinfer: "<0.6.18"\n', ""))
    commits = {ref: subprocess.run(["git", "rev-parse", ref], cwd=repo, check=True, text=True,
                                   capture_output=True).stdout.strip()
               for ref in ("v0.6.16", *FI_TILE_RELEASES)}
    return proj, commits


def test_bisect_on_flashinfers_git_history_names_the_commit(from_git):
    proj, commits = from_git
    p = run(proj, "bisect", "fi-nvfp4-only", "--bad", "v0.6.18")
    assert p.returncode == 0, p.stdout + p.stderr
    lines = p.stdout.splitlines()
    assert lines[0].startswith("fi-nvfp4-only (flashinfer): applied at v0.6.16 (")
    assert lines[1] == f"broken by {commits['v0.6.18'][:10]}  Release 0.6.18"
    assert "tested 3 of 3 first-parent commits, both ends included (at most 3)" in lines


def test_rebase_check_bisects_flashinfers_failures(from_git):
    proj, commits = from_git
    p = run(proj, "rebase-check", "--package", "flashinfer", "--to", "v0.6.17", "--to",
            "v0.6.18", "--bisect", "--format", "json")
    assert p.returncode == 1, p.stdout + p.stderr
    data = json.loads(p.stdout)
    row = {r["id"]: r["status"] for r in data["patches"]}["fi-nvfp4-only"]
    assert row == {"v0.6.17": "applied", "v0.6.18": "failed:conflict"}
    cell = {e["id"]: e for e in data["targets"][1]["patches"]}["fi-nvfp4-only"]
    assert cell["bisect"]["package"] == "flashinfer"
    assert cell["bisect"]["first_bad"]["commit"] == commits["v0.6.18"]
    assert cell["bisect"]["good"]["ref"] == "v0.6.16"
    p = run(proj, "rebase-check", "--package", "flashinfer", "--to", "v0.6.18", "--bisect")
    assert f"broken by {commits['v0.6.18'][:10]}" in p.stdout


def test_a_flashinfer_rebase_stops_at_a_conflict_naming_flashinfer_and_its_checkout(tmp_path):
    """A FlashInfer diff whose lines v0.6.16 rewrote: the stop names FlashInfer's ref and
    checkout (never vLLM's), and the merge markers name the FlashInfer releases."""
    ensure_releases(release_cache())
    proj = make_stack(tmp_path, TOPK_ENTRY)
    (proj / "patches" / "flashinfer" / "fi-topk-deterministic.diff").write_text(TOPK_PATCH)
    p = run(proj, "rebase", "--package", "flashinfer", "--to", "v0.6.16")
    assert p.returncode == 1, p.stderr
    lines = p.stdout.splitlines()
    assert any(ln.startswith("fi-topk-deterministic (diff patches/flashinfer/fi-topk-"
                             "deterministic.diff) does not apply to flashinfer v0.6.16: "
                             "conflict: ") for ln in lines), p.stdout
    assert ("The checkout .patchkit/rebase/tree holds flashinfer v0.6.16 with the patches "
            "before fi-topk-deterministic, and fi-topk-deterministic merged in as far as it "
            "goes:") in lines
    assert f"  {TOPK_FILE}: 1 conflict between <<<<<<< and >>>>>>>" in lines
    assert "vLLM" not in p.stdout
    merged = (proj / ".patchkit" / "rebase" / "tree" / TOPK_FILE).read_text()
    assert "<<<<<<< flashinfer v0.6.16\n" in merged
    assert ">>>>>>> fi-topk-deterministic\n" in merged
    p = run(proj, "rebase", "--abort")
    assert p.returncode == 0, p.stderr
    assert "ref: v0.6.15" in (proj / "patchset.yaml").read_text()



def test_a_vllm_bisect_reads_no_base_for_a_pin_no_range_asks_about(tmp_path):
    """FlashInfer pinned `ref: base` (only an engine can read it): a vLLM bisect needs that pin
    only when some patch has a range on FlashInfer; without one it runs, with one it is one
    line."""
    proj = make_stack(tmp_path)
    yaml = proj / "patchset.yaml"
    text = yaml.read_text().replace("    ref: v0.6.15\n", "    ref: base\n", 1)
    text = text.replace('    flashinfer: ">=0.6.15"\n', "")
    text += "image:\n  base: example/vllm:v1.0.0\n"   # no engine here holds it
    assert "    ref: base\n" in text and "image:" not in yaml.read_text()
    yaml.write_text(text.replace('    flashinfer: "<0.6.16"\n', ""))
    p = run(proj, "bisect", "fast-mode", "--format", "json")
    assert p.returncode == 0, p.stdout + p.stderr
    assert json.loads(p.stdout)["good"]["fate"] == "applied"
    yaml.write_text(text)   # fast-mode holds on flashinfer <0.6.16 again
    p = run(proj, "bisect", "fast-mode")
    assert p.returncode == 2, p.stdout + p.stderr
    assert p.stderr.strip().splitlines()[-1].startswith(
        "patchkit bisect: error: flashinfer: a pin read from a base image"), p.stderr
