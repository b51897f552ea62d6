"""``patchkit cache`` and ``cache prune``: a cache of a test's own, holding real FlashInfer
wheels from PyPI and real git mirrors; what a manifest pins stays, the rest goes, and nothing a
run holds is touched."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
from pathlib import Path

import pytest
from testing import one_error, patchkit, real_cache
from testing.upstream import make_upstream, sh

WHEELS = ("flashinfer_python-0.6.15-py3-none-any.whl", "flashinfer_python-0.6.16-py3-none-any.whl")


def _real_wheel(name: str) -> Path:
    found = real_cache() / "pypi" / "wheels" / name
    if not found.is_file():   # the shared cache is filled on first use: fetch it as patchkit does
        found.parent.mkdir(parents=True, exist_ok=True)
        sh("python3", "-m", "pip", "download", "--no-deps", "--only-binary", ":all:", "-q",
           "-d", str(found.parent), name.split("-")[0].replace("_", "-") + "==" +
           name.split("-")[1], cwd=found.parent)
    return found


@pytest.fixture
def cached(tmp_path, monkeypatch):
    """A project pinning its upstream (git) and FlashInfer 0.6.15 (pypi), and a cache holding
    both pins, FlashInfer 0.6.16's wheel, another source's mirror, and a killed download."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("PATCHKIT_CACHE_DIR", str(cache))
    up = make_upstream(tmp_path / "up", {"v1": {"pkg/mod.py": "A = 1\n"}})
    other = make_upstream(tmp_path / "other", {"v1": {"pkg/mod.py": "B = 1\n"}})
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "patchset.yaml").write_text(
        f"name: demo\nvllm:\n  repo: {up}\n  ref: v1\npackages:\n  flashinfer:\n"
        "    dist: flashinfer-python\n    repo: [pypi]\n    ref: v0.6.15\npatches: []\n")
    wheels = cache / "pypi" / "wheels"
    wheels.mkdir(parents=True)
    for name in WHEELS:   # copies: the test changes their times
        shutil.copyfile(_real_wheel(name), wheels / name)
    (wheels / "download.flashinfer-python-0.6.16.x1y2").mkdir()
    (wheels / "download.flashinfer-python-0.6.16.x1y2" / "part").write_bytes(b"\0" * 4096)
    # the mirrors, made by patchkit itself: rebase-check --to v1 resolves the pin's source
    from patchkit.source import mirror

    for src in (up, other):
        mirror.resolve(str(src), "v1", cache, lambda m: None)
    return proj, cache


def listed(proj: Path) -> dict[str, dict]:
    p = patchkit("cache", "--format", "json", cwd=proj)
    assert p.returncode == 0, p.stderr
    return {Path(e["path"]).name: e for e in json.loads(p.stdout)["entries"]}


def test_cache_lists_entries_sizes_and_pins(cached):
    proj, cache = cached
    entries = listed(proj)
    assert entries[WHEELS[0]]["pinned"] and not entries[WHEELS[1]]["pinned"]
    assert entries[WHEELS[0]]["bytes"] == (cache / "pypi/wheels" / WHEELS[0]).stat().st_size
    assert entries[WHEELS[0]]["bytes"] > 1_000_000   # a real wheel
    mirrors = [e for e in entries.values() if e["kind"] == "mirror"]
    assert sorted(e["pinned"] for e in mirrors) == [False, True]
    assert entries["download.flashinfer-python-0.6.16.x1y2"]["kind"] == "leftover"
    p = patchkit("cache", cwd=proj)
    assert p.returncode == 0 and str(cache) in p.stdout.splitlines()[0]
    assert "pinned flashinfer_python 0.6.15" in p.stdout


def test_prune_removes_what_no_manifest_pins(cached):
    proj, cache = cached
    before = listed(proj)
    p = patchkit("cache", "prune", "--dry-run", cwd=proj)
    assert p.returncode == 0, p.stderr
    assert "would remove 3 entries" in p.stdout
    assert listed(proj).keys() == before.keys()
    p = patchkit("cache", "prune", cwd=proj)
    assert p.returncode == 0, p.stderr
    after = listed(proj)
    assert set(before) - set(after) == {WHEELS[1], "download.flashinfer-python-0.6.16.x1y2",
                                        next(n for n, e in before.items()
                                             if e["kind"] == "mirror" and not e["pinned"])}
    assert all(e["pinned"] or e["kind"] == "log" for e in after.values())
    # what stays still serves: the pinned release lays out from the kept wheel, offline
    p = patchkit("apply", "--package", "flashinfer", cwd=proj,
                 env=dict(os.environ, PIP_INDEX_URL="http://127.0.0.1:9/simple"))
    assert p.returncode == 0, p.stderr


def test_prune_older_than_keeps_what_was_used_lately(cached):
    proj, cache = cached
    p = patchkit("cache", "prune", "--older-than", "30d", cwd=proj)
    assert p.returncode == 0, p.stderr
    assert "removed 0 entries" in p.stdout
    old = cache / "pypi/wheels" / WHEELS[1]
    os.utime(old, (0, 0))
    (cache / "pypi" / "flashinfer-python.lock").unlink(missing_ok=True)
    p = patchkit("cache", "prune", "--older-than", "30d", cwd=proj)
    assert p.returncode == 0, p.stderr
    assert not old.exists() and (cache / "pypi/wheels" / WHEELS[0]).exists()


@pytest.mark.parametrize("bad", ["3x", "soon", "-1d", "d"])
def test_a_bad_duration_is_one_line_exit_2(cached, bad):
    proj, cache = cached
    p = patchkit("cache", "prune", "--older-than", bad, cwd=proj)
    assert p.returncode == 2
    assert "not a duration" in one_error(p)
    assert one_error(p).startswith("patchkit cache prune: error: ")
    assert (cache / "pypi/wheels" / WHEELS[1]).exists()


def test_prune_while_a_run_uses_the_cache_says_so_and_removes_nothing(cached):
    proj, cache = cached
    before = listed(proj)
    fd = os.open(cache / "in-use.lock", os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_SH)    # what every patchkit run holds while it runs
    try:
        p = patchkit("cache", "prune", "--wait", "0.5", cwd=proj)
    finally:
        os.close(fd)
    assert p.returncode == 2
    assert "another patchkit run is using the cache" in one_error(p)
    assert listed(proj).keys() == before.keys()


def test_prune_leaves_an_entry_whose_own_lock_is_held(cached):
    proj, cache = cached
    fd = os.open(cache / "pypi" / "flashinfer-python.lock", os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)    # a library caller laying out a release
    try:
        p = patchkit("cache", "prune", cwd=proj)
    finally:
        os.close(fd)
    assert p.returncode == 0, p.stderr
    assert "a run is using it" in p.stdout
    assert (cache / "pypi/wheels" / WHEELS[1]).exists()


def test_prune_outside_a_project_without_a_manifest_is_one_line(tmp_path):
    p = patchkit("cache", "prune", cwd=tmp_path)
    assert p.returncode == 2
    assert "no manifest" in one_error(p)


def test_a_wheels_last_use_moves_only_when_a_run_reads_it(cached):
    """Laying out FlashInfer 0.6.15 reads its wheel alone: 0.6.16's time stays where it was,
    and a release already laid out reads no wheel at all."""
    from patchkit.commands import cache as command
    from patchkit.manifest.model import identity
    from patchkit.source import pypi

    proj, cache = cached
    wheels = cache / "pypi" / "wheels"
    for name in WHEELS:
        os.utime(wheels / name, (1000, 1000))
    flashinfer = identity("flashinfer", "flashinfer-python")

    def used() -> dict[str, float]:
        return {e.path.name: e.used for e in command.inventory(cache) if e.kind == "wheel"}

    pypi.ensure_release(cache, "v0.6.15", package=flashinfer)
    after = used()
    assert after[WHEELS[1]] == 1000          # not read: its time stays
    assert after[WHEELS[0]] > 1000           # read to lay 0.6.15 out
    os.utime(wheels / WHEELS[0], (2000, 2000))
    pypi.ensure_release(cache, "v0.6.15", package=flashinfer)   # laid out: no wheel read
    assert used() == {WHEELS[0]: 2000, WHEELS[1]: 1000}
    p = patchkit("cache", "prune", "--older-than", "30d", cwd=proj)
    assert p.returncode == 0, p.stderr
    assert not (wheels / WHEELS[1]).exists() and (wheels / WHEELS[0]).exists()
