"""The fixtures every test folder shares: the CLI run as a user runs it, the real-vLLM cache, and
(in the submodules) small upstreams and patchset projects built on the fly.

pyproject's ``pythonpath`` puts tests/ on the import path, so any test imports ``testing``:

* ``testing`` -- ``patchkit()`` and ``spawn()`` (the CLI in a child process), ``real_cache()``
  (the long-lived cache of real releases) and ``release_cache()`` (a run's cache that shares
  them), ``isolate()`` (no user git config, no user cache);
* ``testing.upstream`` -- throwaway git upstreams with one tagged commit per release, diffs;
* ``testing.project`` -- the engine's small project and the rebase "fates" project, and the
  held patch that keeps a run inside the series until the test lets it go on;
* ``testing.realdiffs`` -- diffs cut from the real vLLM v0.27.1 files;
* ``testing.bisect_history`` -- an upstream with a long first-parent history, for bisect;
* ``testing.standin_vllm`` -- a stand-in for vLLM's OpenAI-compatible server.
* ``testing.releases`` -- the vLLM releases the DSpark patchset is tested on, and what the
  series does on each; ``testing.lift`` -- one definition of the patched sources lifted out and
  run against stubs;
* ``testing.baseimage`` -- arm64 stand-ins for the vllm-openai base image (cached, keyed by
  content); ``testing.imageproject`` -- the image tests' patchset project on the real vLLM
  0.27.1; ``testing.regproxy`` -- a byte-counting relay in front of a registry;
* ``testing.link`` -- a relay between ssh and a node's sshd that counts, cuts and slows;
  ``testing.onesession`` -- an sshd of a test's own in front of a node's engine that takes one
  session per connection;
  ``testing.smallimage`` -- small images of a run's own, for copies; ``testing.smalldisk`` --
  an engine of a test's own on a small tmpfs; ``testing.fakeengine`` -- a Docker Engine in
  memory under the engine border, for the image paths' unit tests;
* ``testing.dockersdk`` -- an image's files, fingerprint and presence read straight through the
  Docker SDK; ``testing.imagetree`` -- an image's files held in memory, with dist-info;
  ``testing.checkout`` -- applied checkouts as values; ``testing.venvbase`` -- the image unit
  tests' hand-made base, checkout and project; ``testing.progress`` -- a run's progress kept
  for the test to read.

No test module imports another (tests/test_imports.py holds to it): what tests share is here.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
SRC = REPO_ROOT / "src"


def cli_env(env: dict | None = None, **extra: str) -> dict[str, str]:
    """``env`` (default: this process's) with this checkout's sources first on the path.  An
    ``env`` made from scratch still gets the test's cache (``isolate``), so that no run of the
    CLI falls back on the user's own."""
    out = dict(env if env is not None else os.environ, PYTHONPATH=str(SRC), **extra)
    if "PATCHKIT_CACHE_DIR" not in out and "PATCHKIT_CACHE_DIR" in os.environ:
        out["PATCHKIT_CACHE_DIR"] = os.environ["PATCHKIT_CACHE_DIR"]
    return out


def patchkit(*args: str, cwd: Path, env: dict | None = None, **kw) -> subprocess.CompletedProcess:
    """``patchkit ARGS`` in ``cwd``, to the end: its exit code, stdout and stderr as text."""
    return subprocess.run([sys.executable, "-m", "patchkit", *args], cwd=cwd, env=cli_env(env),
                          text=True, capture_output=True, check=False, **kw)


def spawn(*args: str, cwd: Path, env: dict | None = None, **kw) -> subprocess.Popen:
    """``patchkit ARGS`` started in the background (stdout and stderr piped unless given)."""
    kw.setdefault("stdout", subprocess.PIPE)
    kw.setdefault("stderr", subprocess.PIPE)
    return subprocess.Popen([sys.executable, "-m", "patchkit", *args], cwd=cwd,
                            env=cli_env(env), text=True, **kw)


REAL_CACHE = "~/.cache/patchkit-tests"   # the README names it


def real_cache() -> Path:
    """The persistent cache the real-vLLM tests share between runs (wheels, the PyPI upstream,
    the image tests' .debs), never a test's own and never the user's own (~/.cache/patchkit):
    ``$PATCHKIT_REAL_CACHE``, else ``~/.cache/patchkit-tests``."""
    env = os.environ.get("PATCHKIT_REAL_CACHE")
    return Path(env) if env else Path(REAL_CACHE).expanduser()


# What a run on real releases shares with every other run: the releases (``pypi``, ``image``),
# the image tests' .debs, and memos keyed by content.
SHARED = ("pypi", "image", "test-image", "assertions", "transforms", "transform-listings")
_releases: list[Path] = []   # this test process's release cache, once made


def release_cache(where: Path | None = None) -> Path:
    """The cache a test runs patchkit with on the real releases: a folder of this test
    process's own (``where``, given once by tests/conftest.py; else a temp folder removed at
    exit) in which the long-lived cache's SHARED parts are linked.  The rest of what a run
    writes (mirrors of a test's own upstreams, build records, logs) stays there, in the suite's
    temp folder, and never shows up in a listing of ``real_cache()``."""
    if where is None and _releases:
        where = _releases[0]
    elif where is None:
        import atexit
        import shutil
        import tempfile

        where = Path(tempfile.mkdtemp(prefix="patchkit-releases-"))
        atexit.register(shutil.rmtree, where, True)
    real = real_cache()
    where.mkdir(parents=True, exist_ok=True)
    for name in SHARED:
        (real / name).mkdir(parents=True, exist_ok=True)
        if not (where / name).is_symlink():
            (where / name).symlink_to(real / name, target_is_directory=True)
    _releases[:] = [where]
    return where


def isolate(monkeypatch, home: Path) -> None:
    """No git run reads the user's config or template, no patchkit run the user's cache: a
    git identity and ``main`` as the first branch in ``home``, the cache under it."""
    home.mkdir(parents=True, exist_ok=True)
    (home / ".gitconfig").write_text("[user]\n\tname = test\n\temail = test@example.invalid\n"
                                     "[init]\n\tdefaultBranch = main\n")
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(home / ".gitconfig"))
    monkeypatch.setenv("GIT_TEMPLATE_DIR", "")
    monkeypatch.setenv("PATCHKIT_CACHE_DIR", str(home / "cache"))


def one_error(p: subprocess.CompletedProcess) -> str:
    """The one error line of a failed run (progress lines may come before it, nothing after)."""
    lines = [ln for ln in p.stderr.splitlines() if ln.startswith("patchkit")]
    assert len(lines) == 1 and p.stderr.endswith(lines[0] + "\n"), p.stderr
    return lines[0]


def snapshot(proj: Path) -> dict[str, bytes]:
    """Every file of a project but its checkouts, by path: to prove a command wrote nothing."""
    return {str(p.relative_to(proj)): p.read_bytes() for p in sorted(proj.rglob("*"))
            if p.is_file() and ".patchkit" not in p.parts}
