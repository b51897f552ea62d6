"""import --overlay on a tree shaped as a real fork ships it: ``LICENSE`` on top, ``vllm/`` with
no ``__init__.py``, whole files of a real vLLM release with small edits, and a ``KEY=VALUE``
upstream.lock whose commit no source has but whose tag the pypi source has."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from testing import one_error, patchkit, snapshot
from testing.upstream import sh

from patchkit import git as g
from patchkit import manifest
from patchkit.manifest import ID_MAX
from patchkit.series import applier
from patchkit.run import run_spec

pytestmark = pytest.mark.real_vllm

RELEASE = "v0.32.0"
MISSING = "1f2e3d4c5b6a" + "7" * 28      # a commit no source has
EDIT = "# dgx-spark: tuned for GB10\n"
LOCK = (f"# pinned by the fork's CI\nVLLM_REPOSITORY=https://github.com/vllm-project/vllm.git\n"
        f"VLLM_TAG=\"{RELEASE}\"\nVLLM_COMMIT={MISSING}\nFLASHINFER_COMMIT={'a' * 40}\n"
        "FLASHINFER_VERSION=0.6.15\nTORCH_VERSION='2.9.0'\n"
        f"VALIDATED_VLLM_VERSION=0.32.1.dev0+g{MISSING[:9]}.d20260714\n")


@pytest.fixture
def release_files(real_vllm) -> dict[str, bytes]:
    """33 whole files of the release, from several folders of the package."""
    from patchkit.source import pypi

    repo, tag = pypi.ensure_release(real_vllm, RELEASE)
    names = [n for _m, _k, n in g.list_tree(repo, tag, "vllm") if n.endswith(".py")
             and n != "vllm/__init__.py"]
    chosen = names[::max(1, len(names) // 33)][:33]
    assert len(chosen) == 33
    blobs = g.read_blobs(repo, [f"{tag}:{n}" for n in chosen])
    return {n: blobs[f"{tag}:{n}"] for n in chosen}


def _overlay(root: Path, files: dict[str, bytes]) -> dict[str, bytes]:
    """The fork's overlay folder: 30 of the files edited, 3 as the release has them, one new
    file; returns what the package should hold after applying."""
    want = {}
    for n, (rel, data) in enumerate(sorted(files.items())):
        if n >= 3:
            first, _, rest = data.partition(b"\n")
            data = first + b"\n" + EDIT.encode() + rest
        want[rel] = data
    want["vllm/spark/tuning.py"] = b"GB10_SMS = 48\n"
    for rel, data in want.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    (root / "LICENSE").write_text("Apache License 2.0\n")
    return want


@pytest.fixture
def proj(tmp_path, real_vllm) -> Path:
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "patchset.yaml").write_text(f"name: spark\nvllm:\n  repo: pypi\n  ref: {RELEASE}\n"
                                        "patches: []\n")
    return proj


def _applied(proj: Path, tmp_path: Path) -> Path:
    wd = tmp_path / "applied"
    report = applier.apply_series(manifest.load(proj / "patchset.yaml"),
                                  run=run_spec(manifest.load(proj / "patchset.yaml")), workdir=wd)
    assert report.ok, report.to_json()
    return wd


def test_a_fork_overlay_imports_as_it_ships_one_patch_per_file(proj, tmp_path, release_files):
    ov = tmp_path / "overlay"
    want = _overlay(ov, release_files)
    (ov / "upstream.lock").write_text(LOCK)
    p = patchkit("import", "--overlay", str(ov), "--split", "file", cwd=proj)
    assert p.returncode == 0, p.stderr
    notes = [ln for ln in p.stdout.splitlines() if ln.startswith("note: ")]
    assert "note: left out, beside the package folder (not part of vLLM): LICENSE" in notes
    assert (f"note: {ov}/upstream.lock: VLLM_COMMIT={MISSING} is in no source of patchset.yaml;"
            f" the files are diffed against VLLM_TAG={RELEASE} instead") in notes
    entries = yaml.safe_load((proj / "patchset.yaml").read_text())["patches"]
    changed = sorted(want)[3:]
    assert len(entries) == len(changed) == 31
    for entry, rel in zip(entries, changed):
        assert len(entry["id"]) <= ID_MAX
        assert entry["summary"].startswith(f"{rel} from overlay, against vLLM {RELEASE}")
        diff = (proj / entry["diff"]).read_text()
        assert diff.count("diff --git ") == 1 and f" b/{rel}\n" in diff
    wd = _applied(proj, tmp_path)
    for rel, data in want.items():
        assert (wd / rel).read_bytes() == data, rel
    assert not (wd / "LICENSE").exists()


def test_split_dir_makes_one_patch_per_folder(proj, tmp_path, release_files):
    ov = tmp_path / "overlay"
    want = _overlay(ov, release_files)
    (ov / "upstream.lock").write_text(LOCK)
    p = patchkit("import", "--overlay", str(ov), "--split", "dir", cwd=proj)
    assert p.returncode == 0, p.stderr
    entries = yaml.safe_load((proj / "patchset.yaml").read_text())["patches"]
    folders = sorted({rel.rsplit("/", 1)[0] for rel in sorted(want)[3:]})
    assert [e["summary"].split(" from ")[0] for e in entries] == [f + "/" for f in folders]
    wd = _applied(proj, tmp_path)
    for rel, data in want.items():
        assert (wd / rel).read_bytes() == data, rel


def test_an_overlay_on_a_fork_branch_is_read_from_the_repository(proj, tmp_path, release_files):
    fork = tmp_path / "spark-fork"
    want = _overlay(fork / "overlay", release_files)
    (fork / "upstream.lock").write_text(LOCK)  # beside overlay/, as the fork keeps it
    (fork / "README.md").write_text("The DGX Spark fork\n")
    sh("git", "init", "-q", "-b", "main", str(fork))
    sh("git", "add", "-A", cwd=fork)
    sh("git", "commit", "-qm", "overlay", cwd=fork)
    sh("git", "checkout", "-q", "-b", "spark", cwd=fork)
    (fork / "overlay/vllm/spark/tuning.py").write_text("GB10_SMS = 48\nSPARK = True\n")
    want["vllm/spark/tuning.py"] = b"GB10_SMS = 48\nSPARK = True\n"
    sh("git", "commit", "-qam", "tune", cwd=fork)
    sh("git", "checkout", "-q", "main", cwd=fork)
    p = patchkit("import", "--overlay", "overlay", "--from", f"{fork}@spark", cwd=proj)
    assert p.returncode == 0, p.stderr
    assert f"note: {fork}@spark:upstream.lock: VLLM_COMMIT={MISSING} is in no source" in p.stdout
    assert "left out, beside the package folder (not part of vLLM): LICENSE" in p.stdout
    entries = yaml.safe_load((proj / "patchset.yaml").read_text())["patches"]
    assert [e["id"] for e in entries] == ["overlay"]
    wd = _applied(proj, tmp_path)
    for rel, data in want.items():
        assert (wd / rel).read_bytes() == data, rel


def _no_package(d: Path) -> None:
    (d / "src").mkdir(parents=True)
    (d / "src/x.py").write_text("X = 1\n")
    (d / "LICENSE").write_text("MIT\n")


def _with_link(d: Path) -> None:
    (d / "vllm").mkdir(parents=True)
    (d / "vllm/a.py").write_text("A = 1\n")
    (d / "vllm/b.py").symlink_to("a.py")


def _lock(text: str):
    def setup(d: Path) -> None:
        (d / "vllm").mkdir(parents=True)
        (d / "vllm/a.py").write_text("A = 1\n")
        (d / "upstream.lock").write_text(text)
    return setup


@pytest.mark.parametrize("setup,args,message", [
    (_no_package, (), "--overlay {d}: holds no vllm/ folder (at its top or one level down)"),
    (_with_link, (), "--overlay {d}: vllm/b.py is not a regular file"),
    (_lock(f"VLLM_COMMIT={MISSING}\nVLLM_TAG=v0.0.1\n"), (),
     f"{{d}}/upstream.lock names vLLM VLLM_COMMIT={MISSING}, VLLM_TAG=v0.0.1, none of which a "
     "source of patchset.yaml has (tried "),
    (_lock(f"FLASHINFER_COMMIT={'a' * 40}\nFLASHINFER_VERSION=0.6.15\n"), (),
     "{d}/upstream.lock: names no vllm commit, tag or version (keys tried: VLLM_COMMIT, "
     "VLLM_TAG, VLLM_VERSION)"),
    (_lock("VLLM_TAG=v0.32.0\n"), ("--from", "{d}"),
     "--from {d}: with --overlay, give the fork as REPO@REF"),
    (_lock("VLLM_TAG=v0.32.0\n"), ("--split", "lines"), None),
])
def test_bad_fork_input_is_one_line_and_writes_nothing(proj, tmp_path, setup, args, message):
    d = tmp_path / "ov"
    setup(d)
    before = snapshot(proj)
    p = patchkit("import", "--overlay", str(d), *[a.format(d=d) for a in args], cwd=proj)
    assert p.returncode == 2, p.stderr
    if message is None:
        assert "Invalid value for '--split'" in p.stderr
    else:
        assert one_error(p).startswith("patchkit import: error: " + message.format(d=d)), p.stderr
    assert snapshot(proj) == before


def test_from_a_fork_without_the_path_or_with_a_link_is_one_line(proj, tmp_path):
    fork = tmp_path / "fork"
    (fork / "overlay/vllm").mkdir(parents=True)
    (fork / "overlay/vllm/a.py").write_text("A = 1\n")
    (fork / "overlay/vllm/b.py").symlink_to("a.py")
    sh("git", "init", "-q", "-b", "main", str(fork))
    sh("git", "add", "-A", cwd=fork)
    sh("git", "commit", "-qm", "overlay", cwd=fork)
    before = snapshot(proj)
    for path, message in [("nowhere", f"--from {fork}@main: no folder nowhere at main"),
                          ("overlay", f"--from {fork}@main: overlay/vllm/b.py at main is a link")]:
        p = patchkit("import", "--overlay", path, "--from", f"{fork}@main", cwd=proj)
        assert p.returncode == 2, p.stderr
        assert one_error(p).startswith("patchkit import: error: " + message), p.stderr
    assert snapshot(proj) == before


# ------------------------------------------------------------------------------ another package

@pytest.fixture
def fi_stack(tmp_path, real_vllm) -> Path:
    """The stack project (vLLM's fixture upstream, FlashInfer 0.6.15 from PyPI) without its
    own FlashInfer patch."""
    from testing.flashinfer import ensure_releases, make_stack

    ensure_releases(real_vllm)
    proj = make_stack(tmp_path / "stack")
    text = (proj / "patchset.yaml").read_text()
    (proj / "patchset.yaml").write_text(text[:text.index("  - id: fi-moe-activations")])
    return proj


def _fi_overlay(root: Path, cache: Path) -> dict[str, bytes]:
    """A fork's flashinfer/ overlay as it ships: LICENSE beside it, no __init__.py, the real
    MoE kernel file patched, another real file edited, a new file, and a lock whose FlashInfer
    commit no source has; returns what the package should hold after applying."""
    from testing.flashinfer import FI_FILE, FI_PACKAGE, patched

    from patchkit import source

    pin = source.resolve(["pypi"], "v0.6.15", cache, package=FI_PACKAGE)
    other = "flashinfer/fused_moe/cute_dsl/blackwell_sm12x/moe_activation.py"
    blobs = g.read_blobs(pin.repo, [f"{pin.commit}:{FI_FILE}", f"{pin.commit}:{other}"])
    want = {FI_FILE: patched(blobs[f"{pin.commit}:{FI_FILE}"].decode()).encode(),
            other: EDIT.encode() + blobs[f"{pin.commit}:{other}"],
            "flashinfer/spark/tuning.py": b"GB10_SMS = 48\n"}
    for rel, data in want.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    (root / "LICENSE").write_text("Apache License 2.0\n")
    (root / "upstream.lock").write_text(LOCK.replace("a" * 40, MISSING))
    return want


def test_a_flashinfer_overlay_imports_as_flashinfer_patches(fi_stack, tmp_path, real_vllm):
    ov = tmp_path / "overlay"
    want = _fi_overlay(ov, real_vllm)
    p = patchkit("import", "--overlay", str(ov), "--package", "flashinfer", "--split", "file",
                 cwd=fi_stack)
    assert p.returncode == 0, p.stderr
    notes = [ln for ln in p.stdout.splitlines() if ln.startswith("note: ")]
    assert "note: left out, beside the package folder (not part of flashinfer): LICENSE" in notes
    assert (f"note: {ov}/upstream.lock: FLASHINFER_COMMIT={MISSING} is in no source of "
            "patchset.yaml; the files are diffed against FLASHINFER_VERSION=0.6.15 "
            "instead") in notes
    assert p.stdout.splitlines()[-1].startswith(
        "ok: the series applies at flashinfer v0.6.15 with 3 new patches")
    entries = yaml.safe_load((fi_stack / "patchset.yaml").read_text())["patches"][-3:]
    assert [(e["id"], e["package"], e["diff"]) for e in entries] == [
        (pid, "flashinfer", f"patches/flashinfer/{pid}.diff") for pid in (
            "fused-moe-cute-dsl-blackwell-sm12x-moe-activation",
            "fused-moe-cute-dsl-blackwell-sm12x-moe-micro-kernel", "spark-tuning")]
    assert entries[0]["summary"] == ("flashinfer/fused_moe/cute_dsl/blackwell_sm12x/"
                                     "moe_activation.py from overlay, against flashinfer v0.6.15")
    p = patchkit("apply", "--package", "flashinfer", cwd=fi_stack)
    assert p.returncode == 0, p.stderr
    for rel, data in want.items():
        assert (fi_stack / ".patchkit/flashinfer" / rel).read_bytes() == data, rel
    assert not (fi_stack / ".patchkit/flashinfer/LICENSE").exists()


def test_a_flashinfer_overlay_without_its_folder_is_one_line(fi_stack, tmp_path, real_vllm):
    ov = tmp_path / "overlay"
    _overlay(ov, {"vllm/a.py": b"A = 1\n"})
    before = snapshot(fi_stack)
    for args, line in [
            (("--package", "flashinfer"),
             f"--overlay {ov}: holds no flashinfer/ folder (at its top or one level down)"),
            (("--package", "flashinfr"),
             "--package flashinfr: the manifest has no package 'flashinfr'")]:
        p = patchkit("import", "--overlay", str(ov), *args, cwd=fi_stack)
        assert p.returncode == 2 and one_error(p).startswith("patchkit import: error: " + line), p.stderr
    assert snapshot(fi_stack) == before


def test_rebase_of_a_split_series_refreshes_what_applies_and_stops_at_each_file(
        proj, tmp_path, release_files, real_vllm):
    """15 of the fork's files (12 edited all through), as one patch per file, rebased onto
    the next release: the files it did not change are applied or refreshed, and the rebase
    stops at each file it did change, naming that file; dropping the stopped entry goes on to
    the next.  The stops are exactly the files v0.33.0 changed (each stop replays the old pin's
    series up to it: fewer files, the same paths through the rebase)."""
    from patchkit.commands import rebase as rebase_cmd
    from patchkit.series import rebase
    from patchkit.manifest.edit import ManifestText
    from patchkit.source import pypi

    ov = tmp_path / "overlay"
    edited = {}
    for n, (rel, data) in enumerate(sorted(release_files.items())[:15]):
        lines = data.decode().splitlines(keepends=True)
        if n >= 3:   # a comment every 6 lines: any upstream change meets a hunk's context
            lines = [ln + (EDIT if i % 6 == 5 else "") for i, ln in enumerate(lines)]
        edited[rel] = "".join(lines).encode()
    want = _overlay(ov, edited)
    (ov / "upstream.lock").write_text(LOCK)
    p = patchkit("import", "--overlay", str(ov), "--split", "file", cwd=proj)
    assert p.returncode == 0, p.stderr
    by_id = {q.id: q for q in manifest.load(proj / "patchset.yaml").patches}
    file_of = {q.id: next(r for r in want if f" b/{r}\n" in (proj / q.path).read_text())
               for q in by_id.values()}
    repo, _tag = pypi.ensure_release(real_vllm, "v0.33.0")
    changed = _changed(repo, sorted(edited)[3:])
    result = rebase_cmd.start_at(proj / "patchset.yaml", "v0.33.0")
    stops = []
    while result.stop is not None:
        stopped = by_id[result.stop.patch]
        head = result.stop.instructions[0]
        assert head.startswith(f"{stopped.id} (diff {stopped.path}) does not apply to vLLM "
                               "v0.33.0: "), head
        stops.append(file_of[stopped.id])
        edit = ManifestText.read(proj / "patchset.yaml")   # a person drops it and goes on
        edit.delete_item(("patches",), manifest.load(proj / "patchset.yaml").patch(
            stopped.id).index)
        edit.write(proj / "patchset.yaml")
        result = rebase.resume(proj / "patchset.yaml")
    assert result.done
    actions = {s.id: s.action for s in result.steps}
    assert set(stops) == changed and len(stops) == len(changed) > 0, (stops, changed)
    assert sorted(file_of[pid] for pid, a in actions.items() if a == "dropped") == sorted(stops)
    assert all(a in ("applied", "refreshed", "dropped") for a in actions.values()), actions
    patches = len(edited) - 3 + 1   # one per edited file, and the new file
    assert len(by_id) == patches
    assert sum(a in ("applied", "refreshed") for a in actions.values()) == patches - len(changed)
    rebased = manifest.load(proj / "patchset.yaml")
    assert rebased.vllm.ref == "v0.33.0" and len(rebased.patches) == patches - len(changed)
    report = applier.apply_series(rebased, run=run_spec(rebased), workdir=tmp_path / "applied")
    assert report.ok and all(r.status == "applied" and not r.offsets for r in report.patches)


def _changed(repo: Path, rels: list[str]) -> set[str]:
    """Those of ``rels`` v0.33.0 changed since RELEASE."""
    blobs = g.read_blobs(repo, [f"{t}:{r}" for t in (RELEASE, "v0.33.0") for r in rels])
    return {r for r in rels if blobs[f"{RELEASE}:{r}"] != blobs[f"v0.33.0:{r}"]}

