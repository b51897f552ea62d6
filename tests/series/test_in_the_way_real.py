"""Every hunk and file in the way, named: one diff cut from the real vLLM v0.27.1 files across
three files, where v0.33.0 rewrote the lines some hunks change, kept the lines others change,
and removed one file."""

from __future__ import annotations

import json

import pytest
from testing.realdiffs import CHAT_UTILS, TORCH_UTILS, unified
from testing.upstream import sh

from patchkit import manifest
from patchkit.render import text as render_text
from patchkit.series import applier
from patchkit.run import run_spec
from patchkit.source import pypi

pytestmark = pytest.mark.real_vllm

FILES = (TORCH_UTILS, "vllm/config/model.py")


def _pick(old: list[str], new: list[str]) -> tuple[list[int], list[int]]:
    """Lines of ``old`` (0-based) the new release removed, and lines whose 7-line window it
    holds exactly once; each at least 20 lines from the others, so each edit is its own hunk."""
    gone, kept, taken = [], [], []
    new_text = "\n".join(new) + "\n"
    new_set = set(new)
    for i in range(10, len(old) - 10):
        if any(abs(i - t) < 20 for t in taken) or not old[i].strip():
            continue
        window = "\n".join(old[i - 3:i + 4]) + "\n"
        if old[i] not in new_set and len(gone) < 2 and old[i].strip().startswith(("def ", "#", "return")):
            gone.append(i)
            taken.append(i)
        elif new_text.count(window) == 1 and len(kept) < 1 and old[i].strip().startswith("def "):
            kept.append(i)
            taken.append(i)
    return gone, kept


@pytest.fixture
def project(real_vllm, tmp_path):
    repo, tag = pypi.ensure_release(real_vllm, "v0.27.1")
    pypi.ensure_release(real_vllm, "v0.33.0")
    chunks, expect = [], {}
    for rel in FILES:
        old = sh("git", "show", f"{tag}:{rel}", cwd=repo).splitlines()
        new = sh("git", "show", f"v0.33.0:{rel}", cwd=repo).splitlines()
        gone, kept = _pick(old, new)
        assert gone and kept, rel
        edited = list(old)
        for i in gone + kept:
            edited[i] += "  # patched"
        chunks.append(unified("\n".join(old) + "\n", "\n".join(edited) + "\n", rel))
        order = sorted(gone + kept)
        expect[rel] = [order.index(i) + 1 for i in gone]
    chat = sh("git", "show", f"{tag}:{CHAT_UTILS}", cwd=repo) + "\n"
    chunks.append(unified(chat, chat.replace("\n", "  # patched\n", 1), CHAT_UTILS))
    proj = tmp_path / "proj"
    (proj / "patches").mkdir(parents=True)
    (proj / "patches" / "big.diff").write_text("".join(chunks))
    (proj / "patchset.yaml").write_text(
        "name: real\nvllm:\n  repo: pypi\n  ref: v0.27.1\npatches:\n"
        "  - id: big\n    summary: three files\n    diff: patches/big.diff\n")
    return proj, expect


def test_every_conflicting_hunk_and_the_gone_file_are_named(project, tmp_path):
    proj, expect = project
    m = manifest.load(proj / "patchset.yaml")
    assert applier.apply_series(m, run=run_spec(m), workdir=tmp_path / "a").ok
    report = applier.apply_series(m, run=run_spec(m, ref="v0.33.0"), workdir=tmp_path / "b")
    (big,) = report.patches
    assert big.status == "failed"
    named = {(w.file, w.hunk, w.reason) for w in big.in_the_way}
    want = {(rel, n, "conflict") for rel, ns in expect.items() for n in ns}
    want.add((CHAT_UTILS, None, "gone"))
    assert named == want
    n = sum(map(len, expect.values()))
    line = render_text.patch_line(big)
    assert f"{n} of {n + len(FILES) + 1} hunks in 2 of 3 files conflict: " in line
    for rel, ns in expect.items():
        assert f"{rel} hunks {', '.join(map(str, ns))}" in line
    assert f"1 file is gone: {CHAT_UTILS}" in line
    data = json.loads(report.to_json())["patches"][0]
    assert {(w["file"], w["hunk"], w["reason"]) for w in data["in_the_way"]} == want
    assert all(w["line"] for w in data["in_the_way"] if w["reason"] == "conflict")
    assert data["message"] == big.message and data["files"]


def test_rebase_check_names_them_all_in_json_and_text(project, capsys):
    from patchkit import cli

    proj, expect = project
    want = {(rel, n, "conflict") for rel, ns in expect.items() for n in ns}
    want.add((CHAT_UTILS, None, "gone"))
    args = ["rebase-check", "--to", "v0.33.0", "--manifest", str(proj / "patchset.yaml")]
    assert cli.main(args + ["--format", "json"]) == 1
    (target,) = json.loads(capsys.readouterr().out)["targets"]
    (big,) = target["patches"]
    assert {(w["file"], w["hunk"], w["reason"]) for w in big["in_the_way"]} == want
    assert cli.main(args) == 1
    out = capsys.readouterr().out
    assert "in 2 of 3 files conflict: " in out and f"1 file is gone: {CHAT_UTILS}" in out
