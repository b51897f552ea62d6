"""The git border: every git query and mutation patchkit makes, and the only module that runs git.

It drives git through GitPython (its command wrapper for porcelain and plumbing, its object
database for reading blobs) and offers typed functions; no caller builds a git argument list.
Every git process starts in one place, :func:`_execute`, and every one has a deadline: a
command on this machine ``timeouts.GIT_LOCAL``, a mirror's clone or fetch
``timeouts.GIT_TRANSFER``, a query or push to a user's remote the timeout its caller gives; the
reads of the object database share ``timeouts.GIT_LOCAL``.  A command past its deadline is
killed.  Failures leave it as one error, :class:`~patchkit.errors.GitError` (the command, its
exit code, its output; ``timeout`` set when it was killed), GitPython's own exceptions
translated on the way, or as the answer of a query (``None``, ``False``) where failing is an
answer.  Only a missing git executable is another error, ``ToolMissingError``.

Every command runs with the same pinned options: no hooks, no signing, no CRLF conversion, no
quoting of paths, no prompt for credentials, and none of the system's git config, so that a
user's setup changes nothing patchkit writes.
"""

from __future__ import annotations

import hashlib
import os
import re
import signal
import stat
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TypeVar

from patchkit import interrupt, process, progress, timeouts
from patchkit.errors import GitError, ToolMissingError

# Commits patchkit makes are reproducible: the same manifest on the same vLLM commit gives the
# same commit ids on every machine.
IDENTITY = {
    "GIT_AUTHOR_NAME": "patchkit",
    "GIT_AUTHOR_EMAIL": "patchkit@localhost",
    "GIT_AUTHOR_DATE": "2000-01-01T00:00:00+0000",
    "GIT_COMMITTER_NAME": "patchkit",
    "GIT_COMMITTER_EMAIL": "patchkit@localhost",
    "GIT_COMMITTER_DATE": "2000-01-01T00:00:00+0000",
}
# Never prompt for credentials, never read the user's hooks or templates.
QUIET = {"GIT_TERMINAL_PROMPT": "0", "GIT_ASKPASS": "", "SSH_ASKPASS": "",
         "GIT_CONFIG_NOSYSTEM": "1", "LC_ALL": "C"}
BASE_ARGS = ("-c", "core.hooksPath=/dev/null", "-c", "commit.gpgsign=false",
             "-c", "tag.gpgsign=false", "-c", "core.autocrlf=false", "-c", "advice.detachedHead=false",
             "-c", "init.defaultBranch=main", "-c", "core.quotePath=false",
             # a commit's bytes are patchkit's, whatever the user's config: Commits makes
             # the same commits in-process
             "-c", "commit.cleanup=whitespace", "-c", "i18n.commitEncoding=UTF-8")
# A source that stops answering (a dropped route, a stalled proxy) fails within a minute, so the
# next source in the list gets its turn instead of the run hanging.
NETWORK = ("-c", "http.lowSpeedLimit=1000", "-c", "http.lowSpeedTime=60")
# Every option of `git diff` that a user's config could otherwise change: the same change gives
# the same bytes on every machine.
DIFF_ARGS = ("-c", "diff.suppressBlankEmpty=false", "-c", "diff.mnemonicPrefix=false",
             "-c", "diff.noprefix=false", "diff", "--no-color", "--no-ext-diff", "--no-textconv",
             "--no-renames", "--no-relative", "--full-index", "--binary", "--unified=3",
             "--diff-algorithm=myers", "--indent-heuristic", "--src-prefix=a/", "--dst-prefix=b/")

T = TypeVar("T")


@dataclass(frozen=True)
class Result:
    """What a git command that may fail said."""

    ok: bool
    code: int
    stdout: str
    stderr: str


def _gitpython():
    # GitPython: imported when git is first needed, not by every CLI start.  Without a git
    # executable its import fails with a page of advice: patchkit says it in one line.
    os.environ.setdefault("GIT_PYTHON_REFRESH", "quiet")
    import git

    return git


def _execute(args: Sequence[str], *, cwd: str | os.PathLike[str] | None = None,
             env: dict[str, str] | None = None, input: bytes | IO[bytes] | None = None,
             timeout: float | None = None, network: bool = False
             ) -> tuple[int, bytes, bytes]:
    """The one place a git process starts: with the pinned options, killed (and its children)
    past ``timeout`` seconds, by default ``timeouts.GIT_LOCAL``, or ``timeouts.GIT_TRANSFER``
    for a ``network`` command.  A killed command is a GitError whose ``timeout`` is set."""
    limit = timeout if timeout is not None else \
        timeouts.GIT_TRANSFER if network else timeouts.GIT_LOCAL
    if cwd is not None and not os.path.isdir(cwd):
        # GitPython would run the command in this process's folder instead: git's own answer
        # for a folder that is no repository, a query's False and a command's GitError
        return 128, b"", f"fatal: no such folder: {cwd}\n".encode("utf-8", "surrogateescape")
    cmd = _gitpython().cmd.Git(str(cwd) if cwd is not None else None)
    full_env = dict(QUIET)
    if env:
        full_env.update(env)
    argv = ["git", *BASE_ARGS, *args]
    progress.command(["git", *args] if cwd is None else ["git", "-C", str(cwd), *args])
    stdin = None
    started = time.monotonic()
    try:
        if isinstance(input, bytes):
            stdin = tempfile.TemporaryFile()
            stdin.write(input)
            stdin.seek(0)
        code, out, err = cmd.execute(argv, istream=stdin if stdin is not None else input,
                                     with_extended_output=True,
                                     with_exceptions=False, stdout_as_string=False,
                                     strip_newline_in_stdout=False, env=full_env,
                                     kill_after_timeout=limit,
                                     preexec_fn=_death_signal(network))
    except _gitpython().exc.GitCommandNotFound:
        raise ToolMissingError("git is not installed (no git on PATH); patchkit needs it for "
                               "every checkout") from None
    finally:
        if stdin is not None:
            stdin.close()
    interrupt.check()  # a child stopped by ^C is an interruption, not a failed command
    if code != 0 and time.monotonic() - started >= limit:
        # GitPython's own line about the kill is left out: the error says it
        raise GitError(["git", *args], -9, _text(out or b""), limit)
    if isinstance(err, str):
        err = err.encode("utf-8", "surrogateescape")
    return code, out or b"", err or b""


def _death_signal(network: bool):
    """A clone, fetch or push (as long as the network makes it) dies with patchkit, ``kill -9``
    included.  Local commands end on their own within moments, and arming the signal costs
    each one a full fork of this process (measured 2.4x per call: bench/bench_spawn.py), so
    they go without."""
    return process.dies_with_us() if network else None


def _text(data: bytes) -> str:
    return data.decode("utf-8", "surrogateescape")


def _try(*args: str, cwd=None, env=None, input: bytes | IO[bytes] | None = None,
         timeout: float | None = None, network: bool = False) -> Result:
    """What a command that may fail said; past its deadline it is a GitError all the same."""
    code, out, err = _execute(args, cwd=cwd, env=env, input=input, timeout=timeout,
                              network=network)
    return Result(code == 0, code, _text(out), _text(err))


def _run(*args: str, cwd=None, env=None, input: bytes | IO[bytes] | None = None,
         timeout: float | None = None, network: bool = False) -> str:
    """Stdout of a command that must succeed."""
    code, out, err = _execute(args, cwd=cwd, env=env, input=input, timeout=timeout,
                              network=network)
    if code != 0:
        raise GitError(["git", *args], code, _text(out) + _text(err))
    return _text(out)


def _line(*args: str, cwd=None, env=None) -> str:
    return _run(*args, cwd=cwd, env=env).strip()


@contextmanager
def _translated(args: Sequence[str]) -> Iterator[None]:
    """GitPython's exceptions, where patchkit uses its objects in-process (the object database,
    the ref files), become the one GitError naming ``args``."""
    git = _gitpython()
    try:
        yield
    except (git.exc.InvalidGitRepositoryError, git.exc.NoSuchPathError) as exc:
        raise GitError(["git", *args], 128, f"not a git repository: {exc}") from None
    except git.exc.GitCommandError as exc:
        raise GitError(["git", *args], exc.status if isinstance(exc.status, int) else 1,
                       str(exc.stderr or exc)) from None
    except git.exc.GitError as exc:
        raise GitError(["git", *args], 1, str(exc)) from None


def _lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line]


# ------------------------------------------------------------------------------ repositories

def is_repository(path: Path) -> bool:
    """True when ``path`` is a git directory git can open (a bare repo or a ``.git``)."""
    return _try(f"--git-dir={path}", "rev-parse", "--is-bare-repository").ok


def missing_alternates(work_tree: Path) -> list[str]:
    """The object stores a checkout borrows from (``git clone --shared``) that no longer exist."""
    info = work_tree / ".git" / "objects" / "info" / "alternates"
    try:
        lines = info.read_text().splitlines()
    except OSError:
        return []
    base = work_tree / ".git" / "objects"
    return [line for line in (x.strip() for x in lines)
            if line and not line.startswith("#") and not (base / line).is_dir()]


def init_bare(path: Path) -> None:
    _run("init", "--quiet", "--bare", str(path))


def init(path: Path) -> None:
    """An empty repository with a work tree at ``path``."""
    _run("init", "--quiet", str(path))


def clone_mirror(url: str, dest: Path) -> None:
    """A bare mirror of ``url`` at ``dest``; GitError when the source does not answer."""
    _run(*NETWORK, "clone", "--quiet", "--mirror", "--", url, str(dest), network=True)


def fetch_mirror(repo: Path, url: str) -> None:
    """Every branch and tag of ``url`` into the mirror ``repo``, pruning what went away.  A
    tag the source moved moves in the mirror too (``--tags`` would refuse it, silently under
    ``--quiet``: "would clobber existing tag")."""
    _run(*NETWORK, "fetch", "--quiet", "--prune", "--", url, "+refs/heads/*:refs/heads/*",
         "+refs/tags/*:refs/tags/*", cwd=repo, network=True)


ANSWER_WAIT = 30.0   # seconds a source is given to list its branches


def answers(url: str) -> bool:
    """True when the git source ``url`` answers at all (lists its branches): what tells a
    source that is out of reach from one that answered and refused one thing."""
    return silence(url) is None


def silence(url: str) -> str | None:
    """None when the git source ``url`` answers (lists its branches); else what git said of
    it (all of it: the caller picks the words), or its deadline."""
    try:
        got = _try(*NETWORK, "ls-remote", "--heads", "--", url, timeout=ANSWER_WAIT,
                   network=True)
    except GitError as exc:
        return str(exc) or "no answer in time"
    if got.ok:
        return None
    return (got.stderr + got.stdout).strip() or f"git ls-remote exited {got.code}"


def clone_shared(source: Path, dest: Path, commit: str, paths: Sequence[str] | None = None,
                 tag: str | None = None, *, refs: bool = True) -> None:
    """A checkout of ``commit`` at ``dest`` borrowing ``source``'s objects (no copy); with
    ``paths``, sparse: only those files are written out; with ``tag``, that tag names
    ``commit``.  The clone writes the sparse setting into the new repository's config; then
    HEAD names the branch ``patchkit``, still unborn, and ``reset --hard`` makes it
    ``commit`` and writes the tree out.  That reads the commit's trees alone, where
    ``checkout -B`` from an unborn branch also looks up every blob (a sparse checkout of a
    large tree: seven times the system calls).  HEAD and the tag are written as git writes
    them, in the new repository, without a process each.  Without ``refs`` (a scratch
    checkout no one asks what the source's branches and tags are) the new repository is
    made as ``git init`` makes one, borrowing the objects, and nothing is cloned."""
    if refs:
        sparse = ("--config", "core.sparseCheckout=true") if paths is not None else ()
        # no template: no sample hooks to write (and remove), none of a user's template folder
        _run("clone", "--quiet", "--shared", "--no-checkout", "--template=", *sparse,
             str(source), str(dest))
    else:
        _borrowing_work_tree(source, dest, sparse=paths is not None)
    if paths is not None:
        info = dest / ".git" / "info"
        info.mkdir(exist_ok=True)
        (info / "sparse-checkout").write_text("".join(_sparse_pattern(p) + "\n" for p in paths))
    _new_ref(dest, "HEAD", "ref: refs/heads/patchkit")
    _run("reset", "--quiet", "--hard", commit, cwd=dest)
    if tag is not None:
        _new_ref(dest, f"refs/tags/{tag}", _head_of_refs(dest))


def _borrowing_work_tree(source: Path, dest: Path, *, sparse: bool) -> None:
    """A new repository with a work tree at ``dest`` (absent or empty), laid out as
    ``git init --template=`` lays one out, whose objects are ``source``'s (as ``clone
    --shared`` records them); no ref, HEAD unborn."""
    objects = Path(source) / "objects"
    if not objects.is_dir():
        objects = Path(source) / ".git" / "objects"
    if not objects.is_dir():
        raise GitError(["git", "clone", "--shared", str(source), str(dest)], 128,
                       f"fatal: repository '{source}' does not exist")
    git_dir = dest / ".git"
    for folder in ("objects/info", "objects/pack", "refs/heads", "refs/tags"):
        (git_dir / folder).mkdir(parents=True)
    (git_dir / "objects" / "info" / "alternates").write_text(f"{objects.resolve()}\n")
    (git_dir / "config").write_text(
        "[core]\n\trepositoryformatversion = 0\n\tfilemode = true\n\tbare = false\n"
        "\tlogallrefupdates = true\n" + ("\tsparsecheckout = true\n" if sparse else ""))
    (git_dir / "HEAD").write_text("ref: refs/heads/patchkit\n")


def _new_ref(work_tree: Path, ref: str, value: str) -> None:
    """Write the ref ``ref`` (or HEAD) of the repository just cloned at ``work_tree`` as a
    loose ref file holding ``value``, by rename."""
    path = work_tree / ".git" / ref
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.lock")
    tmp.write_text(f"{value}\n")
    os.replace(tmp, path)


def _sparse_pattern(path: str) -> str:
    return "/" + re.sub(r"([\\*?\[\]!# ])", r"\\\1", path)


def borrowing_repository(dest: Path, sources: Sequence[Path]) -> None:
    """A new bare repository at ``dest`` that sees every object of ``sources`` (their object
    stores as alternates, nothing copied): commits of two repositories meet in it."""
    _run("init", "--quiet", "--bare", str(dest))
    stores = []
    for src in sources:
        objects = Path(src) / "objects"
        if not objects.is_dir():
            objects = Path(src) / ".git" / "objects"
        stores.append(str(objects.resolve()))
    (dest / "objects" / "info" / "alternates").write_text("".join(f"{s}\n" for s in stores))


def exclude(work_tree: Path, patterns: str) -> None:
    """Untracked files matching ``patterns`` (gitignore lines) are never part of a change."""
    info = work_tree / ".git" / "info"
    info.mkdir(exist_ok=True)
    (info / "exclude").write_text(patterns)


# ------------------------------------------------------------------------------ refs

def resolve_commit(repo: Path, ref: str) -> str | None:
    """The commit ``ref`` names in ``repo`` (tag, branch, remote branch or sha), or None."""
    candidates = [f"refs/tags/{ref}", f"refs/heads/{ref}", f"refs/remotes/origin/{ref}", ref]
    for cand in candidates:
        r = _try("rev-parse", "--verify", "--quiet", f"{cand}^{{commit}}", cwd=repo)
        if r.ok and r.stdout.strip():
            return r.stdout.strip()
    return None


def head(repo: Path) -> str:
    return _line("rev-parse", "HEAD", cwd=repo)


def tree_of(repo: Path, rev: str) -> str:
    """The tree id of commit ``rev``."""
    return _line("rev-parse", f"{rev}^{{tree}}", cwd=repo)


def has_tag(repo: Path, name: str) -> bool:
    return _try("rev-parse", "--verify", "--quiet", f"refs/tags/{name}", cwd=repo).ok


def is_branch(repo: Path, ref: str) -> bool:
    return _try("show-ref", "--verify", "--quiet", f"refs/heads/{ref}", cwd=repo).ok


def remote_url(repo: Path, remote: str = "origin") -> str | None:
    """The URL a mirror was cloned from, or None."""
    r = _try("config", "--get", f"remote.{remote}.url", cwd=repo)
    return (r.stdout.strip() or None) if r.ok else None


def remotes(repo: Path) -> dict[str, str]:
    """Each remote's name and URL, as configured in ``repo``."""
    r = _try("config", "--get-regexp", r"^remote\..*\.url$", cwd=repo)
    out = {}
    for line in (r.stdout.splitlines() if r.ok else []):
        key, _, url = line.partition(" ")
        out[key[len("remote."):-len(".url")]] = url.strip()
    return out


@dataclass(frozen=True)
class Provenance:
    """Where a project's files came from: its commit (None: not in a git repository, or no
    commit yet), whether its folder has changes not committed, and where it is published
    (its ``origin`` remote, credentials stripped; None: no such remote)."""

    commit: str | None = None
    dirty: bool = False
    origin: str | None = None

    @property
    def revision(self) -> str | None:
        """The commit, ``-dirty`` marked when the folder does not match it (as ``git describe
        --dirty`` marks it)."""
        if self.commit is None:
            return None
        return self.commit + ("-dirty" if self.dirty else "")


def provenance(folder: Path) -> Provenance:
    """The commit of the repository ``folder`` is in, whether anything under ``folder`` differs
    from it (changes staged or not, and untracked files no ignore rule covers; patchkit's own
    ``.patchkit/`` left out), and its origin remote's URL without credentials."""
    head_ = _try("rev-parse", "--verify", "--quiet", "HEAD^{commit}", cwd=folder)
    if not head_.ok:
        return Provenance()
    changed = _try("--no-optional-locks", "status", "--porcelain", "--untracked-files=normal",
                   "--", ".", ":(exclude).patchkit", cwd=folder)
    dirty = not changed.ok or bool(changed.stdout.strip())
    origin = remote_url(folder)
    return Provenance(head_.stdout.strip(), dirty,
                      without_credentials(origin) if origin else None)


def without_credentials(url: str) -> str:
    """``url`` without a user name and password (``https://user:token@host/x`` is
    ``https://host/x``); an ssh user (``git@host:x``, ``ssh://git@host/x``) is no secret and
    stays.  A query or fragment goes too: tokens hide there as well."""
    m = re.match(r"^([a-zA-Z][a-zA-Z0-9+.-]*://)([^/@]*@)?([^?#]*)", url)
    if not m:
        return url
    scheme, user, rest = m.groups()
    if user and (":" in user or not scheme.startswith("ssh")):
        user = None
    return scheme + (user or "") + rest


def tags(repo: Path) -> list[str]:
    return _lines(_run("tag", "--list", cwd=repo))


def tags_at(repo: Path, commit: str) -> list[str]:
    return _lines(_run("tag", "--points-at", commit, cwd=repo))


def nearest_tag(repo: Path, commit: str) -> str | None:
    r = _try("describe", "--tags", "--abbrev=0", commit, cwd=repo)
    return (r.stdout.strip() or None) if r.ok else None


def tag(repo: Path, name: str, commit: str) -> None:
    _run("tag", "-f", name, commit, cwd=repo)


def update_ref(repo: Path, ref: str, commit: str) -> None:
    _run("update-ref", ref, commit, cwd=repo)


def move_ref(repo: Path, ref: str, commit: str, expected: str | None) -> None:
    """Point ``ref`` at ``commit`` only if it is still ``expected`` (None: only if it does not
    exist), in one step; else a GitError and nothing moves."""
    _run("update-ref", ref, commit, expected or "0" * 40, cwd=repo)


# ------------------------------------------------------------------------------ history

def commits_between(repo: Path, old: str, new: str, *, merges_only: bool = False) -> list[str]:
    """The commits in ``old..new``, oldest first (only the merges with ``merges_only``)."""
    args = ["rev-list", "--reverse"] + (["--merges"] if merges_only else [])
    return _run(*args, f"{old}..{new}", cwd=repo).split()


def merge_base(repo: Path, a: str, b: str) -> str | None:
    """The best common ancestor of two commits, or None when they share no history."""
    r = _try("merge-base", a, b, cwd=repo)
    return (r.stdout.strip() or None) if r.ok else None


def subjects_between(repo: Path, old: str, new: str) -> list[str]:
    """Subjects of ``old..new``, newest first; none when a ref is missing."""
    r = _try("log", "--format=%s", f"{old}..{new}", cwd=repo)
    return _lines(r.stdout) if r.ok else []


def commit_time(repo: Path, commit: str) -> int:
    return int(_line("show", "-s", "--format=%ct", commit, cwd=repo))


@dataclass(frozen=True)
class CommitInfo:
    """What git says of a commit: its full sha, subject, committer date (ISO 8601) and the
    ``(key, value)`` of each trailer of its message, unfolded, in order."""

    sha: str
    subject: str
    date: str
    trailers: tuple[tuple[str, str], ...] = ()


def commit_info(repo: Path, commit: str) -> CommitInfo:
    out = _run("log", "-1", "--no-walk", "--format=%H%x00%s%x00%cI%x00%(trailers:unfold,only)",
               commit, cwd=repo)
    sha, subject, date, text = out.split("\0", 3)
    trailers = []
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            trailers.append((key.strip(), value.strip()))
    return CommitInfo(sha, subject, date, tuple(trailers))


def first_parent_commits(repo: Path, old: str, new: str) -> list[str]:
    """``git rev-list --first-parent old..new``, oldest first: the line of history ``new``
    was built on, each merge as one step (the side branch it brings in is not walked)."""
    return _run("rev-list", "--first-parent", "--reverse", f"{old}..{new}", cwd=repo).split()


def is_ancestor(repo: Path, old: str, new: str) -> bool:
    """True when ``old`` is ``new`` or one of its ancestors."""
    return _try("merge-base", "--is-ancestor", old, new, cwd=repo).ok


# ------------------------------------------------------------------------------ objects

def show(repo: Path, spec: str) -> str | None:
    """The text of ``commit:path`` (or any object spec), None when there is no such object."""
    data = read_blobs(repo, [spec])[spec]
    return None if data is None else data.decode("utf-8", "surrogateescape")


def blob_id(repo: Path, commit: str, path: str) -> str | None:
    r = _try("rev-parse", "--verify", "--quiet", f"{commit}:{path}", cwd=repo)
    return (r.stdout.strip() or None) if r.ok else None


def package_folders(repo: Path, commit: str) -> list[str]:
    """The folders at the root of ``commit`` holding an ``__init__.py``: its import packages
    (one ``cat-file`` process: the root tree, then each folder's ``__init__.py``)."""
    def folders(read: Callable[[str], bytes | None]) -> list[str]:
        root = read(f"{commit}^{{tree}}")
        if root is None:
            raise GitError(["git", "cat-file", "--batch"], 128, f"no commit {commit}")
        entries = _gitpython().objects.fun.tree_entries_from_data(root)
        names = [name for _sha, mode, name in entries if mode == 0o40000]
        return sorted(n for n in names if read(f"{commit}:{n}/__init__.py") is not None)

    return _reading(repo, folders)


def list_tree(repo: Path, commit: str, path: str = "") -> list[tuple[str, str, str]]:
    """(mode, type, path) of every file under ``path`` at ``commit``, recursively (links and
    submodules included, as git records them); empty when there is no such folder."""
    spec = f"{commit}:{path}" if path else commit
    kind = _try("cat-file", "-t", spec, cwd=repo)
    if not kind.ok or kind.stdout.strip() != "tree":
        return []
    out = _run("ls-tree", "-r", "-z", "--full-tree", commit, *(["--", path] if path else []),
               cwd=repo)
    entries = []
    for item in out.split("\0"):
        if item:
            meta, name = item.split("\t", 1)
            mode, kind, _sha = meta.split(" ")
            entries.append((mode, kind, name))
    return entries


def hash_file(path: Path) -> str:
    return _line("hash-object", "--no-filters", str(path))


def read_blobs(repo: Path, specs: Iterable[str]) -> dict[str, bytes | None]:
    """The exact bytes of each object spec (``commit:path`` or a blob id), None when missing.

    Read through GitPython's object database (one ``cat-file`` process for all of them); bytes,
    not text, so that content compares byte for byte.
    """
    wanted = list(dict.fromkeys(specs))
    if not wanted:
        return {}
    return _reading(repo, lambda read: {spec: read(spec) for spec in wanted})


def _kill_readers(db) -> None:
    """End the ``cat-file`` processes GitPython keeps for ``db``."""
    for persistent in (db.git.cat_file_all, db.git.cat_file_header):
        proc = getattr(persistent, "proc", None)
        if proc is not None and proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)


def _reading(repo: Path, work: Callable[[Callable[[str], bytes | None]], T]) -> T:
    """``work(read)`` with ``read(spec)`` the bytes of an object spec, None when missing, all
    through one ``cat-file`` process, which is killed past ``timeouts.GIT_LOCAL``."""
    args = ("cat-file", "--batch")
    with _translated(args):
        db = _gitpython().Repo(str(repo))
    limit = timeouts.GIT_LOCAL
    expired = threading.Event()

    def expire() -> None:
        expired.set()
        _kill_readers(db)

    def read(spec: str) -> bytes | None:
        interrupt.check()
        try:
            _sha, _kind, _size, data = db.git.get_object_data(spec)
        except (ValueError, OSError) as exc:
            if expired.is_set():
                raise GitError(["git", *args], -9, "", limit) from None
            if isinstance(exc, OSError):
                raise
            return None  # missing or ambiguous: GitPython's word for cat-file's answer
        return data

    watchdog = threading.Timer(limit, expire)
    watchdog.daemon = True
    try:
        db.git.update_environment(**QUIET)
        watchdog.start()
        with _translated(args):
            return work(read)
    finally:
        watchdog.cancel()
        db.close()


# ------------------------------------------------------------------------------ the work tree

def commit_all(repo: Path, message: str, paths: Iterable[str] | None = None) -> str | None:
    """Stage ``paths`` (everything when None) and commit; None when nothing changed.

    One git process for the commit (a series commits once per patch): git refuses an empty
    commit itself, and only then is the index asked whether that was the reason; the new
    commit is read from HEAD's ref files in-process."""
    if paths is None:
        _run("add", "-A", cwd=repo)
    else:
        plist = list(paths)
        if plist:
            _run("add", "-A", "--", *plist, cwd=repo)
    args = ("commit", "--quiet", "--no-verify", "-m", message)
    made = _try(*args, cwd=repo, env=IDENTITY)
    if made.ok:
        return _head_of_refs(repo)
    if _try("diff", "--cached", "--quiet", cwd=repo).ok:
        return None
    raise GitError(["git", *args], made.code, made.stdout + made.stderr)


class Commits:
    """The commits of a series on the branch of the work tree ``repo``, made in-process.

    ``commit(message, paths)`` reads ``paths`` from the work tree and returns the commit that
    ``git add -A -- paths`` then ``git commit -m message`` with the fixed identity would make,
    by the same bytes (so the same id), or None when the tree would not change; no process
    runs.  ``write`` puts the commits made since the last write into the repository with one
    ``fast-import`` (the branch moves to the last, ``tag`` names it) and brings the index of
    the paths they changed to it with one ``update-index``; each commit's id is checked
    against fast-import's.  Until then HEAD, the index and ``status`` are as last written.
    One ``cat-file`` process, open until ``close``, reads the trees the commits build on.
    A work tree on no branch is a GitError."""

    def __init__(self, repo: Path) -> None:
        git = _gitpython()
        self.repo = Path(repo)
        with _translated(("symbolic-ref", "HEAD")):
            self._db = git.Repo(str(repo))
        try:
            with _translated(("symbolic-ref", "HEAD")):
                if self._db.head.is_detached:
                    raise GitError(["git", "symbolic-ref", "HEAD"], 128,
                                   f"{repo}: HEAD is on no branch")
                self.branch = self._db.head.reference.path
                self.tip = git.SymbolicReference.dereference_recursive(self._db, "HEAD")
        except BaseException:
            self._db.close()
            raise
        self._db.git.update_environment(**QUIET)
        self._expired = threading.Event()
        self._written = self.tip          # what the repository's branch is at
        self._steps: list[tuple[str, bytes, list[tuple[str, bytes | None, bytes]]]] = []
        self._at_written: dict[str, tuple[bytes, bytes] | None] = {}   # path -> its entry there
        self._folders: dict[str, dict[bytes, tuple[bytes, bytes]]] = {}   # at the tip
        self._root: bytes | None = None   # the tip's tree (binary id)

    def __enter__(self) -> Commits:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._db.close()

    # -- reading what the commits build on
    def _object(self, sha: str) -> bytes:
        args = ("cat-file", "--batch")
        try:
            with _translated(args):
                return self._db.git.get_object_data(sha)[3]
        except (ValueError, OSError) as exc:
            if self._expired.is_set():
                raise GitError(["git", *args], -9, "", timeouts.GIT_LOCAL) from None
            raise GitError(["git", *args], 128, f"{self.repo}: cannot read {sha}: {exc}") \
                from None

    @contextmanager
    def _deadline(self) -> Iterator[None]:
        """The reads of one commit end within ``timeouts.GIT_LOCAL``: past it the
        ``cat-file`` process is killed and the read fails."""
        def expire() -> None:
            self._expired.set()
            _kill_readers(self._db)

        watchdog = threading.Timer(timeouts.GIT_LOCAL, expire)
        watchdog.daemon = True
        watchdog.start()
        try:
            yield
        finally:
            watchdog.cancel()

    def _folder(self, folder: str) -> dict[bytes, tuple[bytes, bytes]] | None:
        """The entries of ``folder`` (\"\" the root) at the tip: name -> (mode, binary id);
        None when the tip has no such folder."""
        if folder in self._folders:
            return self._folders[folder]
        if not folder:
            head = self._object(self.tip)
            tree = bytes.fromhex(head[5:45].decode())   # b"tree <hex>\n..."
        else:
            parent, _, name = folder.rpartition("/")
            above = self._folder(parent)
            entry = above.get(name.encode("utf-8", "surrogateescape")) if above else None
            if entry is None or entry[0] != b"40000":
                return None
            tree = entry[1]
        self._folders[folder] = _tree_entries(self._object(tree.hex()))
        return self._folders[folder]

    def _entry(self, path: str) -> tuple[bytes, bytes] | None:
        folder, _, name = path.rpartition("/")
        entries = self._folder(folder)
        return entries.get(name.encode("utf-8", "surrogateescape")) if entries else None

    # -- making commits
    def commit(self, message: str, paths: Iterable[str]) -> str | None:
        """The next commit: ``paths`` as the work tree has them (a missing one deleted)."""
        with self._deadline():
            return self._commit(message, paths)

    def _commit(self, message: str, paths: Iterable[str]) -> str | None:
        changes: list[tuple[str, bytes | None, bytes]] = []
        for path in _files_under(self.repo, paths):
            mode, data = _work_file(self.repo / path)
            old = self._entry(path)
            new = None if mode is None else (mode, _object_id(b"blob", data))
            if new != old and (old is None or old[0] != b"160000"):
                changes.append((path, mode, data))
                self._at_written.setdefault(path, old)
                self._put(path, new)
        if not changes:
            return None
        tree = self._tree("")
        body = (f"tree {tree.hex()}\nparent {self.tip}\n"
                f"author patchkit <patchkit@localhost> {_WHEN}\n"
                f"committer patchkit <patchkit@localhost> {_WHEN}\n\n").encode()
        text = _stripspace(message).encode("utf-8", "surrogateescape")
        self.tip = _object_id(b"commit", body + text).hex()
        self._steps.append((self.tip, text, changes))
        return self.tip

    def _put(self, path: str, entry: tuple[bytes, bytes] | None) -> None:
        """Set (None: remove) ``path``'s entry in the tip's folders; a folder left empty goes,
        and each folder above is marked to be hashed again (its id dropped)."""
        parts = path.split("/")
        for depth in range(len(parts) - 1):   # each folder above exists and is a folder
            folder, name = "/".join(parts[:depth]), parts[depth]
            entries = self._folder(folder)
            assert entries is not None
            key = name.encode("utf-8", "surrogateescape")
            here = "/".join(parts[:depth + 1])
            if entries.get(key, (b"",))[0] != b"40000":
                if entry is None:
                    return   # nothing there to remove
                self._folders[here] = {}   # a file there gives way to the folder
            else:
                self._folder(here)
            entries[key] = (b"40000", b"")
        folder, _, name = path.rpartition("/")
        entries = self._folder(folder)
        assert entries is not None
        key = name.encode("utf-8", "surrogateescape")
        if entries.get(key, (b"",))[0] == b"40000":   # a folder gives way to the file
            below = f"{path}/"
            for known in [f for f in self._folders if f == path or f.startswith(below)]:
                del self._folders[known]
        if entry is None:
            entries.pop(key, None)
        else:
            entries[key] = entry
        while folder and not self._folders[folder]:   # git keeps no empty folder
            parent, _, name = folder.rpartition("/")
            self._folders[parent].pop(name.encode("utf-8", "surrogateescape"), None)
            folder = parent

    def _tree(self, folder: str) -> bytes:
        """The id of ``folder``'s tree at the tip, hashing the folders marked below it."""
        entries = self._folders[folder]
        for name, (mode, sha) in entries.items():
            if mode == b"40000" and not sha:
                below = f"{folder}/{name.decode('utf-8', 'surrogateescape')}" if folder else \
                    name.decode("utf-8", "surrogateescape")
                entries[name] = (mode, self._tree(below))
        ordered = sorted(entries.items(),
                         key=lambda item: item[0] + (b"/" if item[1][0] == b"40000" else b""))
        return _object_id(b"tree", b"".join(b"%s %s\0%s" % (mode, name, sha)
                                            for name, (mode, sha) in ordered))

    # -- into the repository
    def write(self, tag: str | None = None) -> None:
        """The commits made since the last write into the repository, the branch at the last,
        ``tag`` (when given) there too, and the index of every path they changed as the
        branch has it.  The work tree is expected to hold those paths as committed."""
        if not self._steps and tag is None:
            return
        with tempfile.TemporaryFile() as stream:
            for n, (_sha, text, changes) in enumerate(self._steps, 1):
                stream.write(f"commit {self.branch}\nmark :{n}\n".encode())
                for who in ("author", "committer"):
                    stream.write(f"{who} patchkit <patchkit@localhost> {_WHEN}\n".encode())
                stream.write(b"data %d\n%s" % (len(text), text))
                stream.write(f"from {f':{n - 1}' if n > 1 else self._written}\n".encode())
                for path, mode, data in changes:
                    quoted = _quoted(path).encode("utf-8", "surrogateescape")
                    if mode is None:
                        stream.write(b"D %s\n" % quoted)
                    else:
                        stream.write(b"M %s inline %s\ndata %d\n%s\n"
                                     % (mode, quoted, len(data), data))
                stream.write(b"\n")
            if tag is not None:
                last = f":{len(self._steps)}" if self._steps else self.tip
                stream.write(f"reset refs/tags/{tag}\nfrom {last}\n\n".encode())
            stream.write(b"".join(b"get-mark :%d\n" % n
                                  for n in range(1, len(self._steps) + 1)))
            stream.seek(0)
            # one pack, not a loose file (and a folder) per object: fewer files to write,
            # and to remove with a scratch tree
            out = _run("-c", "fastimport.unpackLimit=0", "fast-import", "--quiet", "--force",
                       "--date-format=raw", cwd=self.repo, input=stream)
        made = out.split()
        want = [sha for sha, _text, _changes in self._steps]
        if made != want:
            raise GitError(["git", "fast-import"], 1, f"{self.repo}: fast-import made "
                           f"{made} where {want} was made in-process")
        with self._deadline():
            moved = [p for p, before in self._at_written.items() if before != self._entry(p)]
        if moved:
            _run("update-index", "--add", "--remove", "-z", "--stdin", cwd=self.repo,
                 input=b"".join(p.encode("utf-8", "surrogateescape") + b"\0" for p in moved))
        self._written, self._steps, self._at_written = self.tip, [], {}


_WHEN = "946684800 +0000"   # IDENTITY's date, as a commit records it


def _object_id(kind: bytes, data: bytes) -> bytes:
    """The binary id git gives an object of ``kind`` holding ``data``."""
    return hashlib.sha1(b"%s %d\0%s" % (kind, len(data), data)).digest()


def _tree_entries(data: bytes) -> dict[bytes, tuple[bytes, bytes]]:
    """A tree object's entries: name -> (mode, binary id), in its order."""
    out: dict[bytes, tuple[bytes, bytes]] = {}
    at = 0
    while at < len(data):
        space = data.index(b" ", at)
        nul = data.index(b"\0", space)
        out[data[space + 1:nul]] = (data[at:space], data[nul + 1:nul + 21])
        at = nul + 21
    return out


def _work_file(full: Path) -> tuple[bytes | None, bytes]:
    """A work-tree file's mode as git records it and its bytes (a link: its target); mode
    None when there is no file."""
    try:
        st = os.lstat(full)
    except (FileNotFoundError, NotADirectoryError):
        return None, b""
    if stat.S_ISLNK(st.st_mode):
        return b"120000", os.fsencode(os.readlink(full))
    if not stat.S_ISREG(st.st_mode):
        return None, b""
    return (b"100755" if st.st_mode & 0o100 else b"100644"), full.read_bytes()


def _files_under(root: Path, paths: Iterable[str]) -> list[str]:
    """``paths``, each folder among them replaced by the files under it (as ``git add``
    takes a folder)."""
    out: list[str] = []
    for path in dict.fromkeys(paths):
        full = root / path
        if full.is_dir() and not full.is_symlink():
            for dirpath, dirnames, filenames in os.walk(full):
                dirnames[:] = sorted(d for d in dirnames if d != ".git")
                rel = Path(dirpath).relative_to(root).as_posix()
                out += [f"{rel}/{f}" for f in sorted(filenames)]
        else:
            out.append(path)
    return out


def _stripspace(message: str) -> str:
    """The message as ``git commit -m`` records it: trailing blanks of each line off, blank
    lines at either end dropped, runs of them made one, a newline at the end."""
    lines: list[str] = []
    gap = False
    for line in message.split("\n"):
        line = line.rstrip(" \t\r\n")
        if not line:
            gap = bool(lines)
            continue
        if gap:
            lines.append("")
        lines.append(line)
        gap = False
    return "".join(f"{line}\n" for line in lines)


def _head_of_refs(repo: Path) -> str:
    """The commit HEAD names, read from the ref files (no process)."""
    git = _gitpython()
    with _translated(("rev-parse", "HEAD")):
        db = git.Repo(str(repo))
        try:
            return git.SymbolicReference.dereference_recursive(db, "HEAD")
        except ValueError as exc:  # GitPython's word for a ref it cannot follow
            raise GitError(["git", "rev-parse", "HEAD"], 128, str(exc)) from None
        finally:
            db.close()


def stage_all(repo: Path) -> None:
    _run("add", "-A", cwd=repo)


def unstage_all(repo: Path) -> None:
    """The index back at HEAD; the work tree as it is."""
    _run("reset", "--quiet", cwd=repo)


def discard_changes(repo: Path, rev: str = "HEAD", *, check: bool = True) -> None:
    """Work tree and index exactly at ``rev``: changes and untracked files thrown away."""
    for args in (("reset", "--quiet", "--hard", rev), ("clean", "-q", "-fd")):
        if check:
            _run(*args, cwd=repo)
        else:
            _try(*args, cwd=repo)


def dirty_paths(repo: Path) -> list[str]:
    """Every path of the work tree that differs from HEAD, staged or not, untracked included."""
    text = _run("status", "--porcelain=v1", "-z", "--untracked-files=all", "--no-renames", cwd=repo)
    return [entry[3:] for entry in text.split("\0") if len(entry) > 3]


def is_dirty(repo: Path) -> bool:
    return bool(_run("status", "--porcelain", "--untracked-files=all", cwd=repo).strip())


def has_uncommitted(repo: Path) -> bool:
    """Changes or untracked files outside .gitignore (git status' own default)."""
    return bool(_run("status", "--porcelain", cwd=repo).strip())


def untracked(repo: Path, pattern: str | None = None) -> list[str]:
    """Untracked files not ignored, optionally only those matching the pathspec ``pattern``."""
    args = ["ls-files", "--others", "--exclude-standard"] + (["--", pattern] if pattern else [])
    return _lines(_run(*args, cwd=repo))


def modified(repo: Path) -> list[str]:
    """Tracked files whose work-tree content differs from the index."""
    return _lines(_run("diff", "--name-only", cwd=repo))


def changed_files(repo: Path, old: str, new: str) -> list[tuple[str, str, str, str, str]]:
    """``(status, path, old_mode, new_mode, new_blob)`` for each file that differs between two
    commits, renames split into a deletion and an addition; status is A, M, D or T."""
    text = _line("diff", "--raw", "-z", "--no-renames", "--no-abbrev", old, new, cwd=repo)
    fields = text.split("\0")
    result = []
    for i in range(0, len(fields) - 1, 2):
        meta, path = fields[i], fields[i + 1]
        old_mode, new_mode, _old_blob, new_blob, status = meta.lstrip(":").split()
        result.append((status[0], path, old_mode, new_mode, new_blob))
    return result


# ------------------------------------------------------------------------------ diffs

def diff(repo: Path, *revs: str, cached: bool = False) -> str:
    """``git diff`` of ``revs`` (or of the index against ``revs[0]`` with ``cached``), with
    every output option pinned."""
    args = [*DIFF_ARGS] + (["--cached"] if cached else [])
    return _run(*args, *revs, "--", cwd=repo)


_HUNK_RE = re.compile(r"^@@ -\d+(?:,\d+)? \+(\d+)(?:,(\d+))? @@", re.M)


def changed_lines(repo: Path, base: str, path: str) -> list[int]:
    """The lines of ``path`` in the work tree of ``repo`` that differ from ``base`` (a line
    next to what was removed stands for the removal); [] when that cannot be told (no such
    rev, not a repository)."""
    r = _try(*DIFF_ARGS, "--unified=0", base, "--", f":(literal){path}", cwd=repo)
    if not r.ok:
        return []
    lines: list[int] = []
    for m in _HUNK_RE.finditer(r.stdout):
        start, count = int(m.group(1)), int(m.group(2) or 1)
        lines += range(start, start + count) if count else [max(start, 1)]
    return lines


def diff_paths(repo: Path, old: str, new: str, paths: Sequence[str]) -> str:
    """``git diff old new -- paths``, with every output option pinned; empty when no path
    differs (or none is given)."""
    if not paths:
        return ""
    return _run(*DIFF_ARGS, old, new, "--", *(f":(literal){p}" for p in paths), cwd=repo)


def apply(repo: Path, diff_file: Path, *, index: bool = False, check: bool = False,
          reverse: bool = False, context: int | None = None, three_way: bool = False,
          reject: bool = False, numstat: bool = False, verbose: bool = False) -> Result:
    """``git apply`` of ``diff_file`` in ``repo``; what it said, whether it took or not."""
    args = ["apply"]
    if numstat:
        args += ["--numstat", "-z"]
    else:
        args += (["--index"] if index else []) + (["--check"] if check else [])
        args += (["--reverse"] if reverse else []) + (["--3way"] if three_way else [])
        args += (["--reject"] if reject else []) + (["--verbose"] if verbose else [])
        args += [f"-C{context}"] if context is not None else []
        args.append("--whitespace=nowarn")
    return _try(*args, str(diff_file), cwd=repo)


def tree_with_diff(repo: Path, diff_file: Path, parent: str) -> tuple[str | None, str]:
    """The tree ``diff_file`` makes of commit ``parent``'s tree, in a throwaway index (the
    checkout is not touched), and what git said; None when it does not apply."""
    with tempfile.TemporaryDirectory(prefix="patchkit-index-") as tmp:
        env = {"GIT_INDEX_FILE": str(Path(tmp) / "index")}
        _run("read-tree", parent, cwd=repo, env=env)
        r = _try("apply", "--cached", "--verbose", "--whitespace=nowarn", str(diff_file),
                 cwd=repo, env=env)
        if not r.ok:
            return None, r.stderr
        return _line("write-tree", cwd=repo, env=env), r.stderr


def merge_file(ours: Path, base: Path, theirs: Path, labels: tuple[str, str, str]) -> int:
    """A three-way merge of one file into ``ours``: the number of conflicts, or -1 when git
    could not merge at all."""
    r = _try("merge-file", "-L", labels[0], "-L", labels[1], "-L", labels[2],
             str(ours), str(base), str(theirs))
    return r.code if 0 <= r.code <= 127 else -1


def commit_directory(repo: Path, folder: Path, message: str) -> str:
    """An orphan commit in ``repo`` of every file under ``folder``, with the fixed identity;
    the repository's own index and HEAD are not touched."""
    index = folder.parent / f"{folder.name}.index"
    env = dict(IDENTITY, GIT_INDEX_FILE=str(index), GIT_DIR=str(repo), GIT_WORK_TREE=str(folder))
    try:
        _run("add", "--all", "--force", ".", cwd=folder, env=env)
        tree = _line("write-tree", cwd=folder, env=env)
        return _line("commit-tree", tree, "-m", message, cwd=folder, env=env)
    finally:
        index.unlink(missing_ok=True)


@dataclass(frozen=True)
class TreeFile:
    """One file of a tree to commit: ``path`` relative to the tree's root, ``mode`` one of
    git's (0o100644, 0o100755, or 0o120000 with the link's target as ``data``).  ``same_as``
    names an earlier file of the same listing whose bytes this one has (a hard link)."""

    path: str
    mode: int
    data: bytes | None = None
    same_as: str | None = None


_MODES = {0o100644, 0o100755, 0o120000}


def _quoted(path: str) -> str:
    """A path as fast-import reads it: C-style quoted when it needs to be."""
    if not any(c in path for c in '"\\\n') and not path.startswith('"'):
        return path
    return '"' + path.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def commit_files(repo: Path, ref: str, files: Iterable[TreeFile], message: str) -> tuple[str, int]:
    """An orphan commit in the bare ``repo`` of exactly ``files``, with the fixed identity, at
    ``ref`` (created or moved); returns the commit id and how many files it holds.

    The files stream through ``git fast-import`` from a spooled file: nothing is laid out on
    disk, so no path of the listing is ever opened (links included), and the same files give
    the same commit id on every machine.
    """
    when = "946684800 +0000"  # IDENTITY's date
    marks: dict[str, int] = {}
    entries: list[bytes] = []
    with tempfile.TemporaryFile() as stream:
        for f in files:
            interrupt.check()
            if f.mode not in _MODES or not f.path or f.path.startswith("/") or \
                    ".." in f.path.split("/") or "\0" in f.path:
                raise ValueError(f"not a file git can commit: {f.path!r} (mode {f.mode:o})")
            if f.same_as is not None:
                if f.same_as not in marks:
                    raise ValueError(f"{f.path}: a hard link to {f.same_as}, which is not "
                                     "listed before it")
                mark = marks[f.same_as]
            else:
                data = f.data or b""
                mark = len(marks) + 2  # :1 is the commit
                stream.write(b"blob\nmark :%d\ndata %d\n" % (mark, len(data)))
                stream.write(data)
                stream.write(b"\n")
            marks[f.path] = mark
            entries.append(f"M {f.mode:o} :{mark} {_quoted(f.path)}\n"
                           .encode("utf-8", "surrogateescape"))
        stream.write(f"commit {ref}\nmark :1\n".encode())
        for who in ("author", "committer"):
            stream.write(f"{who} patchkit <patchkit@localhost> {when}\n".encode())
        text = message.rstrip("\n").encode() + b"\n"
        stream.write(b"data %d\n%s" % (len(text), text))
        stream.writelines(entries)
        stream.write(b"\nget-mark :1\n")
        stream.seek(0)
        out = _run("fast-import", "--quiet", "--force", "--date-format=raw", cwd=repo,
                   input=stream)
    return out.strip().splitlines()[-1], len(entries)


# ------------------------------------------------------------------------------ a user's work

def status(repo: Path) -> list[tuple[str, str]]:
    """``(XY, path)`` of each path that differs from HEAD, staged or not, and of each untracked
    file that no ignore rule covers (``??``); ignored files are not listed."""
    text = _run("status", "--porcelain=v1", "-z", "--untracked-files=all", "--no-renames",
                cwd=repo)
    return [(entry[:2], entry[3:]) for entry in text.split("\0") if len(entry) > 3]


def local_commits(repo: Path, known: str, tip: str | None = None) -> list[str]:
    """The commits of ``tip`` (default: HEAD and every local branch) that neither ``known`` nor
    any tag or remote branch (what the clone came with) reaches, oldest first: the commits
    made here."""
    tips = [tip] if tip else ["HEAD", "--branches"]
    return _run("rev-list", "--reverse", *tips, "--not", known, "--tags", "--remotes",
                cwd=repo).split()


def published(repo: Path, but: str) -> list[str]:
    """What every tag (except those under ``refs/tags/<but>``) and every remote branch
    points at: the history the clone came with."""
    text = _run("for-each-ref", "--format=%(refname)%00%(objectname)", "refs/tags/",
                "refs/remotes/", cwd=repo)
    pairs = [line.split("\0", 1) for line in _lines(text)]
    return sorted({obj for ref, obj in pairs if not ref.startswith(f"refs/tags/{but}")})


def local_branches(repo: Path) -> dict[str, str]:
    """Each local branch's name and commit."""
    text = _run("for-each-ref", "--format=%(refname:short)%00%(objectname)", "refs/heads/",
                cwd=repo)
    return dict(line.split("\0", 1) for line in _lines(text))


def snapshot_commit(repo: Path, message: str) -> str | None:
    """A commit on top of HEAD of the work tree as it is, changes and untracked files alike
    (what ``git stash create`` makes, untracked files included); the repository's index, work
    tree and refs are not touched.  None when the work tree is HEAD's tree."""
    with tempfile.TemporaryDirectory(prefix="patchkit-index-") as tmp:
        index = Path(tmp) / "index"
        env = dict(IDENTITY, GIT_INDEX_FILE=str(index))
        own = repo / ".git" / "index"
        if own.is_file():  # its stat data spares hashing every file again
            index.write_bytes(own.read_bytes())
        else:
            _run("read-tree", "HEAD", cwd=repo, env=env)
        _run("add", "--all", ".", cwd=repo, env=env)
        tree = _line("write-tree", cwd=repo, env=env)
        if tree == tree_of(repo, "HEAD"):
            return None
        return _line("commit-tree", tree, "-p", "HEAD", "-m", message, cwd=repo, env=env)


def write_bundle(repo: Path, dest: Path, refs: dict[str, str], known: Sequence[str]) -> None:
    """A bundle at ``dest`` holding ``refs`` (full ref name -> commit) and the commits they
    reach that no commit of ``known`` reaches (those are its prerequisites).  The refs are made
    in a throwaway repository borrowing ``repo``'s objects, so ``repo`` itself is not changed."""
    with tempfile.TemporaryDirectory(prefix="patchkit-bundle-") as tmp:
        side = Path(tmp) / "side.git"
        borrowing_repository(side, [repo / ".git"])
        for ref, commit in refs.items():
            _run("update-ref", ref, commit, cwd=side)
        _run("bundle", "create", "--quiet", str(dest), *refs, "--not", *known, cwd=side)


# ------------------------------------------------------------------------------ a bump's branch

def toplevel(path: Path) -> Path | None:
    """The work tree holding ``path``, or None outside any."""
    got = _try("rev-parse", "--show-toplevel", cwd=path)
    return Path(got.stdout.strip()) if got.ok else None


def add_worktree(repo: Path, dest: Path, commit: str) -> None:
    """A detached work tree of ``repo`` at ``dest``, checked out at ``commit``; the user's
    branches, index and work tree are not touched."""
    _run("worktree", "add", "--quiet", "--detach", str(dest), commit, cwd=repo)


def remove_worktree(repo: Path, dest: Path) -> None:
    """Drop the work tree at ``dest`` and git's record of it (gone already is fine)."""
    if dest.exists():
        _try("worktree", "remove", "--force", "--force", str(dest), cwd=repo)
    _try("worktree", "prune", cwd=repo)


def worktree_tree(repo: Path) -> str:
    """The tree of everything in ``repo``'s work tree, untracked files included, ignored files
    and patchkit's own folder (``.patchkit/``: checkouts, a rebase's state) left out; the
    work tree's index is updated to it, nothing is committed."""
    _run("add", "-A", cwd=repo)
    _run("rm", "-r", "-q", "--cached", "--ignore-unmatch", "--", ".patchkit", cwd=repo)
    return _line("write-tree", cwd=repo)


def user_commit_of(repo: Path, tree: str, parent: str, message: str) -> str:
    """A commit of ``tree`` on ``parent`` as the user (their configured identity, else
    patchkit's), dated as ``parent`` was committed: a change for a person to review whose id
    follows from its inputs alone, so the same change made twice, or on two machines with one
    identity, is the same commit.  No ref moves."""
    when = _line("show", "-s", "--format=%cI", parent, cwd=repo)
    env = {"GIT_AUTHOR_DATE": when, "GIT_COMMITTER_DATE": when}
    if not _try("config", "user.name", cwd=repo).stdout.strip():
        env.update({k: v for k, v in IDENTITY.items() if not k.endswith("_DATE")})
    return _line("commit-tree", tree, "-p", parent, "-m", message, cwd=repo, env=env)


def merged_tree(repo: Path, ours: str, theirs: str) -> tuple[str | None, list[str]]:
    """The three-way merge of two commits (their merge base the base), as a tree written to the
    object store; no ref, index or file moves.  ``(tree, [])`` when it is clean, ``(None,
    paths)`` with the paths that conflict when it is not."""
    r = _try("merge-tree", "--write-tree", "--name-only", "--no-messages", ours, theirs, cwd=repo)
    lines = [ln for ln in r.stdout.splitlines() if ln.strip()]
    if r.code == 0 and lines:
        return lines[0], []
    if r.code == 1 and lines:
        return None, sorted(dict.fromkeys(lines[1:]))
    raise GitError(["git", "merge-tree", "--write-tree", ours, theirs], r.code, r.stdout + r.stderr)


def move_worktree(repo: Path, commit: str, tree: str) -> None:
    """A detached work tree made to hold ``tree`` on ``commit``: its files and index are
    ``tree``'s (files it no longer tracks removed), its HEAD ``commit``; nothing is committed
    and no branch moves.  Untracked and ignored files stay."""
    _run("read-tree", "-u", "--reset", tree, cwd=repo)
    _run("update-ref", "--no-deref", "HEAD", commit, cwd=repo)


def parents(repo: Path, commit: str) -> list[str]:
    """The parents of ``commit``, in order."""
    return _line("show", "-s", "--format=%P", commit, cwd=repo).split()


def remote_branch(repo: Path, remote: str, branch: str, timeout: float) -> str | None:
    """What ``branch`` is at ``remote`` (None: no such branch there); a remote that cannot be
    reached within ``timeout`` seconds is a GitError."""
    out = _remote(timeout, "ls-remote", "--heads", remote, f"refs/heads/{branch}", cwd=repo)
    for line in _lines(out):
        sha, _, ref = line.partition("\t")
        if ref == f"refs/heads/{branch}":
            return sha
    return None


def fetch_commit(repo: Path, remote: str, branch: str, timeout: float) -> str:
    """Fetch ``branch`` of ``remote`` into FETCH_HEAD alone: no ref of the user's moves, a
    remote-tracking branch included."""
    # --refmap= : no remote-tracking ref moves either, so a fetch never changes what the user's
    # refs say is known
    _remote(timeout, "fetch", "--quiet", "--no-tags", "--refmap=", remote,
            f"refs/heads/{branch}", cwd=repo)
    return _line("rev-parse", "FETCH_HEAD", cwd=repo)


def push_branch(repo: Path, remote: str, branch: str, commit: str, expected: str | None,
                timeout: float) -> None:
    """Set ``branch`` at ``remote`` to ``commit``, only if it is still ``expected`` there (None:
    absent): one ref, all or nothing."""
    lease = f"--force-with-lease=refs/heads/{branch}:{expected or ''}"
    _remote(timeout, "push", "--quiet", "--porcelain", lease, remote,
            f"{commit}:refs/heads/{branch}", cwd=repo)


def _remote(timeout: float, *args: str, cwd) -> str:
    """A git command that talks to a user's remote: ssh never asks, and gives up connecting
    within ``timeout`` seconds, which is the command's deadline too."""
    env = {"GIT_SSH_COMMAND": os.environ.get("GIT_SSH_COMMAND", "ssh") +
           f" -o BatchMode=yes -o ConnectTimeout={max(1, int(timeout))}"}
    return _run(*args, cwd=cwd, env=env, timeout=timeout, network=True)
