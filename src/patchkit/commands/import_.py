"""``patchkit import``: a fork branch's commits, or an overlay tree, become diff patches.

``import REF [--from REPO]`` takes the commits ``merge-base(pin, REF)..REF``, oldest first, as
``export`` takes the commits of an applied checkout: the id from a ``Patchkit-Id:`` trailer or a
``patchkit: <id>: ...`` subject, else a slug of the subject; the summary from the subject; an
``Upstream:`` trailer as ``upstream:``.  The fork (``--from``: a git URL or path, mirrored like
any source; else the manifest's own sources) and the pin's repository meet in a scratch
repository that borrows both object stores, so nothing is copied.

``import --overlay DIR [--onto REF]`` turns a tree of whole files into one diff, or one per file
or folder (``--split``): a copy of ``dist-packages/vllm``, a tree laid out as the checkout (a
``vllm/`` folder at its top, ``__init__.py`` or not), or one such tree one level down; files
beside the package folder (LICENSE, README) are left out.  The diff is made against the commit
the files were copied from (``--onto REF``, else what an ``upstream.lock`` names: the package's
own commit, else its tag or version, else the pin), so that upstream changes made since are
kept, not undone; new files are added; files of the base the tree lacks are left alone.
``--from REPO@REF`` reads DIR inside a fork's repository at REF, from its objects.

Both prove the series applies with the new patches at the pin before anything is written.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from patchkit import git
from patchkit import manifest, paths, source
from patchkit.errors import PatchkitError, UsageError
from patchkit.manifest import VLLM, Manifest, capped_id, identity, summary_problem
from patchkit.run import RunSpec, run_spec
from patchkit.report import ApplyReport, Status
from patchkit.series import applier, intake
from patchkit.source import mirror

LOCK = "upstream.lock"
# Never part of a source tree: byte-code, VCS and tool data (folder -> why it is left out).
_SKIP_DIRS = {"__pycache__": "byte-code", ".git": "version control data",
              ".mypy_cache": "tool caches", ".pytest_cache": "tool caches"}
_SKIP_SUFFIXES = (".pyc", ".pyo")
MAX_FILE = 16 * 1024 * 1024   # bytes of a file taken into a diff; a larger one is no source
# Written by a package's build into what it installs; a checkout has none (by package name).
_GENERATED = {VLLM.name: {f"{VLLM.top}/_version.py"}}
_SHA = re.compile(r"\b[0-9a-f]{40}\b")
_KEYED = re.compile(r"^\s*[\"']?(?:commit|sha|revision|rev|ref|tag|version)[\"']?\s*[:=]\s*"
                    r"[\"']?([^\s\"',}]+)", re.IGNORECASE | re.MULTILINE)


@dataclass
class Imported:
    """What ``import`` took in."""

    patches: list[intake.NewPatch] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    base: str = ""          # the merge base, or the commit the overlay was diffed against
    reports: list[ApplyReport] = field(default_factory=list)

    def statuses(self) -> dict[str, Status]:
        report = self.reports[0] if self.reports else None
        return {p.id: (report.status_of(p.id) if report else None) or Status.APPLIED
                for p in self.patches}

    def to_dict(self) -> dict:
        statuses = self.statuses()
        return {"ok": True, "base": self.base,
                "pin": self.reports[0].vllm.ref if self.reports else None,
                "patches": [{"id": p.id, "path": p.path, "summary": p.summary,
                             "upstream": p.upstream, "from": p.source, "status": statuses[p.id]}
                            for p in self.patches],
                "notes": self.notes}


def _log(progress: applier.Progress | None):
    return (progress or applier.Progress()).info


# ------------------------------------------------------------------------------ a fork branch

def run(manifest_path: Path, ref: str, *, from_repo: str | None = None,
        progress: applier.Progress | None = None, cache: Path | None = None) -> Imported:
    """The commits ``merge-base(pin, REF)..REF`` as new diff patches at the end of the series."""
    m = manifest.load(manifest_path)
    log = _log(progress)
    _check_ref(ref, from_repo)
    spec = run_spec(m, cache=cache)
    pin = source.resolve(spec.sources, spec.ref, spec.cache, log)
    if from_repo is not None:
        fork = mirror.resolve(_from_path(from_repo, m), ref, spec.cache, log)
    else:
        fork = source.resolve(spec.sources, ref, spec.cache, log)
    result = Imported()
    with tempfile.TemporaryDirectory(prefix="patchkit-import-") as tmp:
        repo = Path(tmp) / "both.git"
        git.borrowing_repository(repo, [pin.repo, fork.repo])
        base = git.merge_base(repo, pin.commit, fork.commit)
        if base is None:
            gap = source.kind_of(pin.source).no_history_why
            why = f" (the pin comes from {pin.source}: {gap})" if gap else ""
            raise UsageError(f"{ref} ({fork.commit[:12]}) shares no history with the pin "
                             f"{spec.ref} ({pin.commit[:12]}){why}")
        result.base = base
        _take_commits(m, repo, ref, fork.commit, spec.ref, result)
    if not result.patches:
        return result  # nothing new: nothing to prove, nothing written
    result.reports = intake.prove(m, result.patches, spec, progress=progress)
    intake.write(m, result.patches)
    return result


def _check_ref(ref: str, from_repo: str | None) -> None:
    problem = source.ref_problem(ref)
    if problem:
        raise UsageError(f"REF: {problem}")
    if from_repo is not None:
        problem = source.source_problem(from_repo)
        if problem:
            raise UsageError(f"--from: {problem}")


def _take_commits(m: Manifest, repo: Path, ref: str, tip: str, pinned: str,
                  result: Imported) -> None:
    """The commits from ``result.base`` to ``tip`` in ``repo`` as new patches in ``result``;
    what is empty, or in the series already, as notes."""
    base = result.base
    merges = git.commits_between(repo, base, tip, merges_only=True)
    if merges:
        raise UsageError(f"{ref}: merge commit {merges[-1][:12]} after the merge base "
                         f"{base[:12]}; import takes a straight line of commits (rebase the "
                         "branch first)")
    commits = git.commits_between(repo, base, tip)
    if not commits:
        result.notes.append(f"{ref} ({tip[:12]}) has no commit after its merge base "
                            f"with the pin {pinned}")
    claimed: set[str] = set()
    for sha in commits:
        c = git.commit_info(repo, sha)
        summary = intake.summary(c)
        text = git.diff(repo, f"{sha}~1", sha)
        if not text.strip():
            result.notes.append(f"{sha[:12]} {summary!r} changes nothing; not imported")
            continue
        same = _already_there(m, intake.wanted_id(c), text)
        if same:
            result.notes.append(f"{sha[:12]} {summary!r} is in the series already as "
                                f"{same}; not imported again")
            continue
        pid = intake.free_id(intake.wanted_id(c), m, claimed, reuse=False)
        claimed.add(pid)
        result.patches.append(intake.from_commit(c, pid, text))


def _from_path(repo: str, m: Manifest) -> str:
    """A relative local path is taken from the current folder, as a user types it."""
    if repo.startswith(("./", "../")) or (os.path.exists(repo) and not os.path.isabs(repo)):
        return str(Path(repo).absolute())
    return repo


def _already_there(m: Manifest, base: str, text: str) -> str | None:
    """The id of the entry (``base``, ``base-2`` ...) whose diff file holds exactly ``text``."""
    candidates = [p for p in m.patches if p.id == base or re.fullmatch(
        re.escape(base) + r"-\d+", p.id)]
    for p in candidates:
        try:
            if (m.root / p.path).read_text(encoding="utf-8", errors="surrogateescape") == text:
                return p.id
        except OSError:
            continue
    return None


# ------------------------------------------------------------------------------ an overlay tree

@dataclass(frozen=True)
class OverlayTree:
    root: Path
    prefix: str                 # "" (laid out as the checkout) or "vllm/" (a package copy)
    files: dict[str, Path]      # checkout-relative path -> file in the tree
    left_out: dict[str, list[str]]  # why -> the files and folders (ending in /) left out
    lock: Lock | None           # what upstream.lock names
    lock_path: Path | None = None

    def notes(self) -> list[str]:
        """One note per reason, naming every file and folder left out for it."""
        return [f"left out, {why}: {', '.join(rels)}" for why, rels in self.left_out.items()]


def _beside(package: str) -> str:
    return f"beside the package folder (not part of {_label(package)})"


def _label(package: str) -> str:
    """The package as a message names it: vLLM, flashinfer."""
    return identity(package, package).label


def _layout(folder: Path, package: str) -> tuple[Path, str, list[str]]:
    """Where the tree's files are (the folder, or the one folder below it that holds the
    package), the prefix its paths take, and what lies beside that folder (left out)."""
    if (folder / package).is_dir() and not (folder / package).is_symlink():
        return folder, "", []
    if (folder / "__init__.py").is_file() or folder.resolve().name == package:
        return folder, f"{package}/", []
    below = sorted(d for d in folder.iterdir() if d.is_dir() and not d.is_symlink()
                   and d.name not in _SKIP_DIRS and (d / package).is_dir())
    if len(below) > 1:
        found = ", ".join(f"{d.name}/{package}/" for d in below)
        raise UsageError(f"--overlay {folder}: {found} are {package} folders one level down; "
                         "give the one to import")
    if not below:
        raise UsageError(f"--overlay {folder}: holds no {package}/ folder (at its top or one "
                         f"level down) and is no copy of the {package} package (no __init__.py "
                         "at its top)")
    beside = sorted(c.name + ("/" if c.is_dir() else "") for c in folder.iterdir()
                    if c != below[0] and c.name != LOCK)
    return below[0], "", beside


def read_overlay(folder: Path, package: str = VLLM.name) -> OverlayTree:
    if not folder.is_dir():
        raise UsageError(f"--overlay {folder}: no such directory")
    root, prefix, beside = _layout(folder, package)
    files: dict[str, Path] = {}
    left_out: dict[str, list[str]] = {_beside(package): beside} if beside else {}
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath)
        kept = []
        for d in sorted(dirnames):
            if (here / d).is_symlink():
                rel = (here / d).relative_to(root).as_posix()
                raise UsageError(f"--overlay {root}: {prefix}{rel} is a link to a folder; an "
                                 "overlay holds regular files only")
            why = _SKIP_DIRS.get(d)
            if why:
                left_out.setdefault(why, []).append(
                    prefix + (here / d).relative_to(root).as_posix() + "/")
            else:
                kept.append(d)
        dirnames[:] = kept
        for name in sorted(filenames):
            full = here / name
            rel = full.relative_to(root).as_posix()
            if rel == LOCK:
                continue
            if not prefix and "/" not in rel:  # LICENSE, README: beside the package folder
                left_out.setdefault(_beside(package), []).append(rel)
                continue
            target = prefix + rel
            why = _left_out_why(root, full, rel, target)
            if why:
                left_out.setdefault(why, []).append(target)
            else:
                files[target] = full
    if not files:
        raise UsageError(f"--overlay {folder}: holds no text files")
    lock_path = next((d / LOCK for d in (root, folder) if (d / LOCK).is_file()), None)
    lock = _read_lock(lock_path, package) if lock_path else None
    return OverlayTree(root, prefix, files, left_out, lock, lock_path)


def _left_out_why(folder: Path, full: Path, rel: str, target: str) -> str | None:
    """Why the tree's file ``rel`` is no source file of the patch, or None to take it."""
    if full.name.endswith(_SKIP_SUFFIXES):
        return "byte-code"
    if full.is_symlink() or not full.is_file():
        raise UsageError(f"--overlay {folder}: {rel} is not a regular file; an overlay "
                         "holds regular files only")
    try:
        paths.check_relative(target)
    except paths.UnsafePathError as exc:
        raise UsageError(f"--overlay {folder}: {exc}") from None
    if full.stat().st_size > MAX_FILE:
        return f"larger than {MAX_FILE >> 20} MiB (no source file is)"
    with open(full, "rb") as fh:
        head = fh.read(8192)
        if b"\0" in head or not _is_utf8(head + fh.read()):
            return "not text"
    return None


def _is_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


@dataclass(frozen=True)
class Lock:
    """What an ``upstream.lock`` names, each as (how the lock says it, the ref), best first:
    the commit, then the tag or release it was taken from."""

    refs: tuple[tuple[str, str], ...]


_ASSIGN = re.compile(r"^\s*(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)\s*=\s*(.*?)\s*$")


def _read_lock(path: Path, package: str = VLLM.name) -> Lock:
    """``KEY=VALUE`` lines (the package's own ``<PKG>_COMMIT``, ``_TAG``, ``_VERSION``, never
    another package's), else a full sha anywhere in it, else the value of a
    ``commit``/``ref``/``tag``/``version`` key, else its only word."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise UsageError(f"{path}: cannot read: {exc.strerror}") from None
    lines = [ln for ln in (raw.split("#", 1)[0] for raw in text.splitlines()) if ln.strip()]
    assigned = [m for m in map(_ASSIGN.match, lines) if m]
    if lines and len(assigned) == len(lines):
        values = {m.group(1).upper(): m.group(2).strip("\"'") for m in assigned}
        keys = [f"{package.upper()}_{k}" for k in ("COMMIT", "TAG", "VERSION")]
        refs = tuple((k, values[k]) for k in keys if values.get(k))
        if not refs:
            raise UsageError(f"{path}: names no {package} commit, tag or version "
                             f"(keys tried: {', '.join(keys)})")
        return Lock(refs)
    body = "\n".join(lines)
    sha = _SHA.search(body.lower())
    if sha:
        return Lock((("commit", sha.group(0)),))
    keyed = _KEYED.search(body)
    if keyed:
        return Lock((("ref", keyed.group(1)),))
    words = body.split()
    if len(words) == 1:
        return Lock((("ref", words[0]),))
    raise UsageError(f"{path}: names no commit (expected a 40-digit sha, or `commit: REF`)")


def _lock_ref(word: str) -> str:
    """A bare release number in a lock (``0.33.0``) names its tag."""
    from patchkit import versions

    return f"v{word}" if re.fullmatch(r"\d+\.\d+(\.\d+)?([a-z]+\d*)?", word) and \
        versions.tag_version(f"v{word}") else word


SPLITS = ("one", "file", "dir")


@dataclass(frozen=True)
class Overlay:
    """How an overlay is imported: the ref it is diffed against (``--onto``, default the
    lock's or the pin), the new patch's id and summary, the ``split``, the fork it is read
    from (``REPO@REF``) and the package it patches (default vLLM)."""

    onto: str | None = None
    patch_id: str | None = None
    summary: str | None = None
    split: str = "one"
    from_repo: str | None = None
    package: str | None = None

    def check(self) -> None:
        problem = summary_problem(self.summary) if self.summary is not None else None
        if problem:  # said of the option: the manifest it would go in is not written yet
            raise UsageError(f"--summary: {problem}")
        if self.split not in SPLITS:
            raise UsageError(f"--split {self.split!r}: expected one of {', '.join(SPLITS)}")


def run_overlay(manifest_path: Path, folder: Path, how: Overlay = Overlay(), *,
                progress: applier.Progress | None = None, cache: Path | None = None) -> Imported:
    """The overlay tree at ``folder`` (a path inside ``how.from_repo`` when given,
    ``REPO@REF``) as new diff patches of the package (default vLLM) at the end of the series:
    one, or one per file or folder (``how.split``)."""
    m = manifest.load(manifest_path)
    # an unknown package is one line, with "did you mean"
    run = run_spec(m, only=[how.package] if how.package else (), cache=cache)
    how.check()
    if how.from_repo is None:
        return _import_tree(m, Path(folder), str(folder), how, run, progress)
    repo, ref = _repo_at(how.from_repo)
    inside = _inside_path(str(folder))
    fork = mirror.resolve(_from_path(repo, m), ref, run.cache, _log(progress))
    with tempfile.TemporaryDirectory(prefix="patchkit-fork-") as tmp:
        where = Path(tmp) / (Path(inside).name or Path(repo.rstrip("/")).name.removesuffix(".git"))
        lock_said = _extract(fork, inside, where, f"--from {how.from_repo}")
        return _import_tree(m, where, f"{how.from_repo}:{inside}", how, run, progress,
                            lock_said=lock_said and f"{how.from_repo}:{LOCK}")


def _repo_at(text: str) -> tuple[str, str]:
    """``REPO@REF`` split at its last ``@`` (a URL's ``git@host:`` keeps its own)."""
    repo, at, ref = text.rpartition("@")
    if not at or not repo or not ref or ":" in ref:  # git@host:x/y.git alone has no REF
        raise UsageError(f"--from {text}: with --overlay, give the fork as REPO@REF "
                         "(a git URL or path, and the branch, tag or commit holding the overlay)")
    problem = source.ref_problem(ref) or source.source_problem(repo)
    if problem:
        raise UsageError(f"--from {text}: {problem}")
    return repo, ref


def _inside_path(text: str) -> str:
    rel = text.strip().strip("/") or "."
    try:
        if rel != ".":
            paths.check_relative(rel)
    except paths.UnsafePathError as exc:
        raise UsageError(f"--overlay {text}: {exc}") from None
    return rel


def _extract(fork: source.Resolved, inside: str, dest: Path, said: str) -> bool:
    """The files under ``inside`` at the fork's commit, written to ``dest`` from the object
    store (no checkout); a link or submodule there is refused.  True when the lock was taken
    from the repository's top (a fork keeps it beside its overlay)."""
    entries = git.list_tree(fork.repo, fork.commit, "" if inside == "." else inside)
    if not entries:
        raise UsageError(f"{said}: no folder {inside} at {fork.ref} ({fork.commit[:12]})")
    for mode, _kind, rel in entries:
        if mode not in ("100644", "100755"):
            what = "a link" if mode == "120000" else "no regular file"
            raise UsageError(f"{said}: {rel} at {fork.ref} is {what}; an overlay holds regular "
                             "files only")
    prefix = "" if inside == "." else inside + "/"
    blobs = git.read_blobs(fork.repo, [f"{fork.commit}:{rel}" for _m, _k, rel in entries])
    for mode, _kind, rel in entries:
        out = dest / rel[len(prefix):]
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_bytes(blobs[f"{fork.commit}:{rel}"] or b"")
        if mode == "100755":
            os.chmod(out, 0o755)
    lock = f"{fork.commit}:{LOCK}"
    if prefix and not (dest / LOCK).exists():
        data = git.read_blobs(fork.repo, [lock])[lock]
        if data is not None:
            (dest / LOCK).write_bytes(data)
            return True
    return False


def _import_tree(m: Manifest, folder: Path, shown: str, how: Overlay, run: RunSpec, progress,
                 lock_said: str | None = None) -> Imported:
    onto, patch_id, summary, split = how.onto, how.patch_id, how.summary, how.split
    package, log = how.package or m.vllm.name, _log(progress)
    name = Path(folder).resolve().name
    wanted = patch_id if patch_id is not None else (intake.slug(name) or "overlay")
    pid = (intake.check_new_id(m, wanted, package=m.package(package).id)
           if split == "one" or patch_id is not None else wanted)
    tree = read_overlay(Path(folder), package)
    result = Imported(notes=tree.notes())
    said = lock_said or _lock_said(tree, Path(folder), shown)
    base, base_ref = _overlay_base(m, tree, said, onto, result.notes, log, run, package)
    result.base = base.commit
    text = _diff_against(base, tree, result.notes, package)
    if not text.strip():  # as for a branch with nothing new: nothing failed, nothing written
        result.notes.append(f"every file of {shown} is as {_label(package)} {base_ref} "
                            f"({base.commit[:12]}) has it")
        return result
    label = base.commit[:12] if _SHA.fullmatch(base_ref) else base_ref
    label = f"{_label(package)} {label}"
    if split == "one":
        result.patches.append(intake.NewPatch(
            pid, summary or f"the files of {name}, against {label}", text, source=shown,
            package=m.package(package).id))
    else:
        result.patches += _split(m, text, split, pid if patch_id is not None else None,
                                 summary, label, shown, package)
    result.reports = intake.prove(m, result.patches, run, progress=progress)
    intake.write(m, result.patches)
    return result


def _lock_said(tree: OverlayTree, folder: Path, shown: str) -> str:
    """The lock as the user knows it: in the folder given, or in the one below it."""
    if tree.lock_path is None:
        return ""
    return f"{shown}/{tree.lock_path.relative_to(folder).as_posix()}"


def _overlay_base(m: Manifest, tree: OverlayTree, said_lock: str, onto: str | None,
                  notes: list[str], log, run: RunSpec,
                  package: str = VLLM.name) -> tuple[source.Resolved, str]:
    """The commit the tree's files were copied from: --onto, else the first of the lock's
    commit, tag, version that a source of ``package`` has (a note when it is not the first),
    else its pin."""
    pin = run.pin(package)
    pid = pin.id
    if onto is not None:
        problem = source.ref_problem(onto)
        if problem:
            raise UsageError(f"--onto: {problem}")
        if tree.lock:
            notes.append(f"{LOCK} names {tree.lock.refs[0][1]}; --onto {onto} is used instead")
        tries = [("--onto", onto)]
    elif tree.lock:
        tries = [(f"{said_lock}", _lock_ref(ref)) for _key, ref in tree.lock.refs]
    else:
        tries = [("the pin", pin.ref)]
    failed: list[str] = []
    for n, (said, ref) in enumerate(tries):
        try:
            base = source.resolve(pin.sources, ref, run.cache, log, package=pid)
        except PatchkitError as exc:
            failed.append(f"{ref}: {exc}")
            continue
        if n:
            missed = ", ".join(f"{k}={v}" for k, v in tree.lock.refs[:n])
            notes.append(f"{said_lock}: {missed} is in no source of {m.path.name}; the files "
                         f"are diffed against {tree.lock.refs[n][0]}={tree.lock.refs[n][1]} "
                         "instead")
        return base, ref
    said, what = tries[0][0], _label(package)
    if len(tries) == 1:
        raise UsageError(f"{said} names {what} {tries[0][1]}, which no source of {m.path.name} "
                         f"has: {failed[0].split(': ', 1)[1]}")
    raise UsageError(f"{said} names {what} " + ", ".join(f"{k}={v}" for k, v in tree.lock.refs) +
                     f", none of which a source of {m.path.name} has (tried " +
                     "; ".join(failed) + ")")


def _file_diffs(text: str) -> list[tuple[str, str]]:
    """``text`` cut into (path, the file's diff), in the diff's order."""
    parts = re.split(r"(?m)^(?=diff --git )", text)
    out = []
    for part in parts:
        if not part.startswith("diff --git "):
            continue
        header = part.split("\n", 1)[0][len("diff --git "):]
        half = (len(header) - 1) // 2   # "a/X b/X": both halves the same path
        rel = header[2:half] if header[:half] == "a/" + header[half + 3:] else header
        out.append((rel.strip('"'), part))
    return out


def _split(m: Manifest, text: str, split: str, prefix: str | None, summary: str | None,
           label: str, shown: str, package: str = VLLM.name) -> list[intake.NewPatch]:
    """One patch per changed file (``file``) or per folder holding changed files (``dir``),
    in path order; ids from the path (the package's own name left off), capped, unique."""
    groups: dict[str, list[str]] = {}
    for rel, part in _file_diffs(text):
        key = rel if split == "file" else (rel.rsplit("/", 1)[0] if "/" in rel else ".")
        groups.setdefault(key, []).append(part)
    claimed: set[str] = set()
    out = []
    for key in sorted(groups):
        stem = key.removeprefix(f"{package}/") if key != package else key
        if split == "file":
            stem = stem.rsplit(".", 1)[0] if "." in stem.rsplit("/", 1)[-1] else stem
        words = "-".join(re.findall(r"[a-z0-9]+", stem.lower())) or "top"
        base = capped_id(f"{prefix}-{words}" if prefix else words)
        pid = intake.free_id(base, m, claimed, reuse=False, package=m.package(package).id)
        claimed.add(pid)
        what = key + ("/" if split == "dir" else "")
        said = f"{summary}: {what}" if summary else f"{what} from {Path(shown).name}, " \
                                                    f"against {label}"
        out.append(intake.NewPatch(pid, said, "".join(groups[key]), source=shown,
                                   package=m.package(package).id))
    return out


def _diff_against(base: source.Resolved, tree: OverlayTree, notes: list[str],
                  package: str = VLLM.name) -> str:
    """The diff that turns ``base``'s files into the tree's (a sparse checkout of just them)."""
    with tempfile.TemporaryDirectory(prefix="patchkit-overlay-") as tmp:
        work = Path(tmp) / "t"
        source.checkout(base, work, sorted(tree.files))
        generated = []
        for rel, full in tree.files.items():
            dest = work / rel
            if dest.exists():  # the content only: a copy's file modes say nothing
                dest.write_bytes(full.read_bytes())
                continue
            if rel in _GENERATED.get(package, ()):
                generated.append(rel)
                continue
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(full, dest)
            os.chmod(dest, 0o755 if os.access(full, os.X_OK) else 0o644)
        if generated:
            notes.append(f"{', '.join(generated)}: written by vLLM's build, not in the source; "
                         "left out")
        git.stage_all(work)
        return git.diff(work, "HEAD", cached=True)
