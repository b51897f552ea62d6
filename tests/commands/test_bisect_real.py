"""bisect on the real ``pypi`` source (v0.31.0, v0.32.0, v0.33.0 from PyPI, cached): one orphan
commit per release, so it narrows to the pair of adjacent releases and says why it stops.

Three diffs cut from the real v0.31.0 vllm/utils/torch_utils.py:

    seed        applied   conflict   conflict   (v0.32.0 gave set_random_seed a parameter)
    imports     applied   applied    conflict   (v0.33.0 dropped the packaging imports)
    ultraquant  applied   upstream   conflict   (v0.32.0 has the entry; v0.33.0 put lines above)
"""

from __future__ import annotations

import json

import pytest
from testing import patchkit
from testing.upstream import sh
from testing.realdiffs import TORCH_UTILS, unified

from patchkit import manifest
from patchkit.commands import bisect as bisect_command
from patchkit.series import bisect_upstream as bisect
from patchkit.commands import rebase_check as rebasecheck
from patchkit.run import Asked
from patchkit.render import matrix as render
from patchkit.render.bisect import render_text
from patchkit.source import pypi

pytestmark = pytest.mark.real_vllm

RELEASES = ("v0.31.0", "v0.32.0", "v0.33.0")


def _once(text: str, old: str, new: str) -> str:
    assert text.count(old) == 1, old
    return text.replace(old, new)


@pytest.fixture
def project(real_vllm, tmp_path):
    for tag in RELEASES:
        repo, _ = pypi.ensure_release(real_vllm, tag)
    text = sh("git", "show", f"v0.31.0:{TORCH_UTILS}", cwd=repo) + "\n"
    diffs = {
        "seed": _once(text, "def set_random_seed(seed: int | None) -> None:\n",
                      "def set_random_seed(seed: int | None) -> None:  # patched\n"),
        "imports": _once(text, "from packaging.version import Version\n",
                         "from packaging.version import Version  # patched\n"),
        "ultraquant": _once(text, '    "turboquant_3bit_nc": torch.uint8,\n',
                            '    "turboquant_3bit_nc": torch.uint8,\n'
                            '    "ultraquant_4bit": torch.uint8,\n'),
    }
    proj = tmp_path / "proj"
    (proj / "patches").mkdir(parents=True)
    entries = []
    for pid, after in diffs.items():
        (proj / "patches" / f"{pid}.diff").write_text(unified(text, after, TORCH_UTILS))
        entries.append(f"  - id: {pid}\n    summary: real edit {pid}\n"
                       f"    diff: patches/{pid}.diff\n")
    (proj / "patchset.yaml").write_text(
        "name: real\nvllm:\n  repo: pypi\n  ref: v0.31.0\npatches:\n" + "".join(entries))
    return proj


def _narrowed(r: bisect.BisectResult) -> list[tuple[str, str]]:
    assert r.narrowed is not None
    return [(end.ref, str(end.fate)) for end in r.narrowed]


def test_pypi_narrows_to_the_pair_of_releases_and_says_why(project):
    m = manifest.load(project / "patchset.yaml")
    seed = bisect_command.run(m, "seed", ends=(None, "v0.33.0"))
    assert (str(seed.good.fate), str(seed.bad.fate)) == ("applied", "failed/conflict")
    assert _narrowed(seed) == [("v0.31.0", "applied"), ("v0.32.0", "failed/conflict")]
    assert seed.first_bad is None and not seed.ok
    assert "one commit per release and no history between releases" in seed.why
    # the releases between the ends are searched: here v0.32.0, between v0.31.0 and v0.33.0
    assert seed.commits == 2 and seed.tested <= bisect.limit_for(2) == 3
    assert "-def set_random_seed(seed: int | None) -> None:\n" in seed.diff
    text = render_text(seed)
    assert ("it changes between the releases v0.31.0 (applied) and v0.32.0 (failed/conflict)"
            in text)
    assert "bisect on a git source to name the commit" in text
    assert f"upstream diff of {TORCH_UTILS} from v0.31.0 to v0.32.0:" in text

    imports = bisect_command.run(m, "imports", ends=(None, "v0.33.0"))
    assert _narrowed(imports) == [("v0.32.0", "applied"), ("v0.33.0", "failed/conflict")]
    assert "-from packaging.version import Version\n" in imports.diff

    # applied -> upstream -> conflict: the first change from the good fate is where it went up
    ultra = bisect_command.run(m, "ultraquant", ends=(None, "v0.33.0"))
    assert _narrowed(ultra) == [("v0.31.0", "applied"), ("v0.32.0", "upstream")]
    assert '+    "ultraquant_4bit": torch.uint8,\n' in ultra.diff


def test_pypi_bisect_cli_exits_1_with_the_pair(project):
    p = patchkit("bisect", "imports", "--bad", "v0.33.0", "--format", "json", cwd=project)
    assert p.returncode == 1, p.stderr
    data = json.loads(p.stdout)
    assert data["ok"] is False and data["first_bad"] is None and data["changed"] is True
    assert data["narrowed"]["good"]["ref"] == "v0.32.0"
    assert data["narrowed"]["bad"]["ref"] == "v0.33.0"
    assert data["narrowed"]["bad"]["fate"] == "failed/conflict"
    assert "no history between releases" in data["narrowed"]["why"]
    # a good that is not older than bad is one line
    p = patchkit("bisect", "imports", "--good", "v0.33.0", "--bad", "v0.32.0", cwd=project)
    assert p.returncode == 2
    errors = [ln for ln in p.stderr.splitlines() if ln.startswith("patchkit")]
    assert errors == ["patchkit bisect: error: --good v0.33.0 is not older than --bad v0.32.0 "
                      "(swap them?)"]


def test_rebase_check_bisect_on_pypi_says_it_cannot(project):
    m = manifest.load(project / "patchset.yaml")
    matrix = rebasecheck.run(m, Asked(), refs=["v0.33.0"], jobs=1, bisect=True)
    rows = {r.patch.id: r for r in matrix.rows()}
    for pid in ("seed", "imports", "ultraquant"):
        assert render.notes(rows[pid]) == [
            "cannot bisect on the pypi source: it has one commit per release and no history "
            "between releases"]
    entry = matrix.to_dict()["targets"][0]["patches"][0]
    assert entry["bisect"]["ok"] is False and "cannot bisect" in entry["bisect"]["error"]
