"""``patchkit import``: a fork branch's commits, or an overlay tree, become diff patches.

``import REF [--from REPO]`` takes the commits ``merge-base(pin, REF)..REF``, oldest first, as
``export`` takes the commits of an applied checkout: the id from a ``Patchkit-Id:`` trailer or a
``patchkit: <id>: ...`` subject, else a slug of the subject; the summary from the subject; an
``Upstream:`` trailer as ``upstream:``.  The fork (``--from``: a git URL or path, mirrored like
any source; else the manifest's own sources) and the pin's repository meet in a scratch
repository that borrows both object stores, so nothing is copied.

``import --overlay DIR [--onto REF]`` turns a tree of whole files into one diff: a copy of
``dist-packages/vllm`` (``__init__.py`` at its top) or a tree laid out as the checkout
(``vllm/__init__.py`` at its top).  The diff is made against the commit the files were copied
from (``--onto REF``, else the commit an ``upstream.lock`` in DIR names, else the pin), so that
upstream changes made since are kept, not undone; new files are added; files of the base the
tree lacks are left alone.

Both prove the series applies with the new patches at the pin before anything is written.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from patchkit import git as g
from patchkit import manifest, paths, source
from patchkit.cache import cache_dir
from patchkit.errors import PatchkitError, UsageError
from patchkit.manifest import Manifest, summary_problem
from patchkit.manifest.runspec import run_spec
from patchkit.report import ApplyReport
from patchkit.series import applier, intake
from patchkit.source import mirror

LOCK = "upstream.lock"
PACKAGE = "vllm"
# Never part of a source tree: byte-code, VCS and tool data (folder -> why it is left out).
_SKIP_DIRS = {"__pycache__": "byte-code", ".git": "version control data",
              ".mypy_cache": "tool caches", ".pytest_cache": "tool caches"}
_SKIP_SUFFIXES = (".pyc", ".pyo")
MAX_FILE = 16 * 1024 * 1024   # bytes of a file taken into a diff; a larger one is no source
# Written by vLLM's build into an installed package; a checkout has none.
_GENERATED = {"vllm/_version.py"}
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

    def statuses(self) -> dict[str, str]:
        report = self.reports[0] if self.reports else None
        return {p.id: (report.status_of(p.id) if report else None) or "applied"
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
    cache = cache or cache_dir()
    problem = source.ref_problem(ref)
    if problem:
        raise UsageError(f"REF: {problem}")
    if from_repo is not None:
        problem = source.source_problem(from_repo)
        if problem:
            raise UsageError(f"--from: {problem}")
    spec = run_spec(m)
    pin = source.resolve(spec.sources, spec.ref, cache, log)
    if from_repo is not None:
        fork = mirror.resolve(_from_path(from_repo, m), ref, cache, log)
    else:
        fork = source.resolve(spec.sources, ref, cache, log)
    result = Imported()
    with tempfile.TemporaryDirectory(prefix="patchkit-import-") as tmp:
        repo = Path(tmp) / "both.git"
        g.borrowing_repository(repo, [pin.repo, fork.repo])
        base = g.merge_base(repo, pin.commit, fork.commit)
        if base is None:
            gap = source.kind_of(pin.source).no_history_why
            why = f" (the pin comes from {pin.source}: {gap})" if gap else ""
            raise UsageError(f"{ref} ({fork.commit[:12]}) shares no history with the pin "
                             f"{spec.ref} ({pin.commit[:12]}){why}")
        result.base = base
        merges = g.commits_between(repo, base, fork.commit, merges_only=True)
        if merges:
            raise UsageError(f"{ref}: merge commit {merges[-1][:12]} after the merge base "
                             f"{base[:12]}; import takes a straight line of commits (rebase the "
                             "branch first)")
        commits = g.commits_between(repo, base, fork.commit)
        if not commits:
            result.notes.append(f"{ref} ({fork.commit[:12]}) has no commit after its merge base "
                                f"with the pin {spec.ref}")
        claimed: set[str] = set()
        for sha in commits:
            c = g.commit_info(repo, sha)
            summary = intake.summary(c)
            text = g.diff(repo, f"{sha}~1", sha)
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
    if not result.patches:
        return result  # nothing new: nothing to prove, nothing written
    result.reports = intake.prove(m, result.patches, progress=progress, cache=cache)
    intake.write(m, result.patches)
    return result


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
    lock: str | None            # the ref or commit upstream.lock names

    def notes(self) -> list[str]:
        """One note per reason, naming every file and folder left out for it."""
        return [f"left out, {why}: {', '.join(rels)}" for why, rels in self.left_out.items()]


def read_overlay(folder: Path) -> OverlayTree:
    if not folder.is_dir():
        raise UsageError(f"--overlay {folder}: no such directory")
    if (folder / PACKAGE / "__init__.py").is_file():
        prefix = ""
    elif (folder / "__init__.py").is_file():
        prefix = f"{PACKAGE}/"
    else:
        raise UsageError(f"--overlay {folder}: neither {PACKAGE}/__init__.py (a tree laid out as "
                         "the checkout) nor __init__.py (a copy of the installed vllm package) "
                         "at its top")
    files: dict[str, Path] = {}
    left_out: dict[str, list[str]] = {}
    for dirpath, dirnames, filenames in os.walk(folder):
        here = Path(dirpath)
        kept = []
        for d in sorted(dirnames):
            why = (_SKIP_DIRS.get(d) or
                   ("a link to a folder (an overlay holds regular files)"
                    if (here / d).is_symlink() else None))
            if why:
                left_out.setdefault(why, []).append(
                    prefix + (here / d).relative_to(folder).as_posix() + "/")
            else:
                kept.append(d)
        dirnames[:] = kept
        for name in sorted(filenames):
            full = here / name
            rel = full.relative_to(folder).as_posix()
            if rel == LOCK:
                continue
            target = prefix + rel
            why = _left_out_why(folder, full, rel, target)
            if why:
                left_out.setdefault(why, []).append(target)
            else:
                files[target] = full
    if not files:
        raise UsageError(f"--overlay {folder}: holds no text files")
    return OverlayTree(folder, prefix, files, left_out, _read_lock(folder / LOCK))


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


def _read_lock(path: Path) -> str | None:
    """The commit (or ref) an ``upstream.lock`` names: a full sha anywhere in it, else the value
    of a ``commit``/``ref``/``tag``/``version`` key, else its only word."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise UsageError(f"{path}: cannot read: {exc.strerror}") from None
    body = "\n".join(line.split("#", 1)[0] for line in text.splitlines())
    sha = _SHA.search(body.lower())
    if sha:
        return sha.group(0)
    keyed = _KEYED.search(body)
    if keyed:
        return keyed.group(1)
    words = body.split()
    if len(words) == 1:
        return words[0]
    raise UsageError(f"{path}: names no commit (expected a 40-digit sha, or `commit: REF`)")


def _lock_ref(word: str) -> str:
    """A bare release number in a lock (``0.33.0``) names its tag."""
    from patchkit import versions

    return f"v{word}" if re.fullmatch(r"\d+\.\d+(\.\d+)?([a-z]+\d*)?", word) and \
        versions.tag_version(f"v{word}") else word


def run_overlay(manifest_path: Path, folder: Path, *, onto: str | None = None,
                patch_id: str | None = None, summary: str | None = None,
                progress: applier.Progress | None = None, cache: Path | None = None) -> Imported:
    """The overlay tree at ``folder`` as one new diff patch at the end of the series."""
    m = manifest.load(manifest_path)
    problem = summary_problem(summary) if summary is not None else None
    if problem:  # said of the option: the manifest it would go in is not written yet
        raise UsageError(f"--summary: {problem}")
    log = _log(progress)
    cache = cache or cache_dir()
    name = Path(folder).resolve().name
    pid = intake.check_new_id(m, patch_id if patch_id is not None else
                              (intake.slug(name) or "overlay"))
    tree = read_overlay(Path(folder))
    result = Imported(notes=tree.notes())
    spec = run_spec(m)
    if onto is not None:
        problem = source.ref_problem(onto)
        if problem:
            raise UsageError(f"--onto: {problem}")
        base_ref, said = onto, "--onto"
        if tree.lock:
            result.notes.append(f"{LOCK} names {tree.lock}; --onto {onto} is used instead")
    elif tree.lock:
        base_ref, said = _lock_ref(tree.lock), f"{folder}/{LOCK}"
    else:
        base_ref, said = spec.ref, "the pin"
    try:
        base = source.resolve(spec.sources, base_ref, cache, log)
    except PatchkitError as exc:
        raise UsageError(f"{said} names vLLM {base_ref}, which no source of {m.path.name} has: "
                         f"{exc}") from None
    result.base = base.commit
    text = _diff_against(base, tree, result.notes)
    if not text.strip():  # as for a branch with nothing new: nothing failed, nothing written
        result.notes.append(f"every file of {folder} is as vLLM {base_ref} "
                            f"({base.commit[:12]}) has it")
        return result
    label = base.commit[:12] if _SHA.fullmatch(base_ref) else base_ref
    new = intake.NewPatch(pid, summary or f"the files of {name}, against vLLM {label}", text,
                          source=str(folder))
    result.patches.append(new)
    result.reports = intake.prove(m, [new], progress=progress, cache=cache)
    intake.write(m, [new])
    return result


def _diff_against(base: source.Resolved, tree: OverlayTree, notes: list[str]) -> str:
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
            if rel in _GENERATED:
                generated.append(rel)
                continue
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(full, dest)
            os.chmod(dest, 0o755 if os.access(full, os.X_OK) else 0o644)
        if generated:
            notes.append(f"{', '.join(generated)}: written by vLLM's build, not in the source; "
                         "left out")
        g.stage_all(work)
        return g.diff(work, "HEAD", cached=True)
