"""rebase: move the pin to a new vLLM ref, one patch at a time, stopping where a person decides.

The series is applied to a checkout of the target in ``.patchkit/rebase/tree`` with the same
``engine.apply_one`` as ``apply``.  Per patch:

- applied exactly: kept as is; applied at an offset: its hunk headers are moved so that it
  applies exactly (proved in a throwaway index; git's own diff of the commit otherwise);
- upstream: marked with a ``vllm:`` range that ends before the target (or dropped with
  ``drop_upstream``);
- failed: the rebase stops.  A diff is merged into the checkout with conflict markers (a
  three-way merge against the old pin with the same patches before it, else ``git apply
  --3way``, else ``--reject``) and ``--continue`` turns the edited checkout into the new diff.
  For a transform or overlay the stop says which file to change, and ``--continue`` retries.

Everything needed to go on or go back lives in ``.patchkit/rebase/``: ``state.json``, the
checkout, and ``backup/`` with the manifest and every patch file as they were, which ``--abort``
writes back byte for byte.  When the series is through, the assertions run, the pin moves (only
``vllm.ref`` and a matching ``image.base`` tag), and the new manifest is proved on a fresh
checkout: every patch applies exactly, with no offset.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from filelock import FileLock

from patchkit import diffwrite, engine, interrupt, manifest, overlay, rebasecheck, source, verify
from patchkit import git as g
from patchkit.errors import PatchkitError, UsageError
from patchkit.manifest import Manifest, Patch
from patchkit.manifestedit import ManifestText, write_if_changed
from patchkit.report import PatchResult
from patchkit.util import cache_dir

STATE_FORMAT = 1
IGNORED = "__pycache__/\n*.pyc\n"  # byte code from running the checkout is never part of a patch
ABORT = "`patchkit rebase --abort` puts the manifest and every patch file back as they were."


@dataclass
class Step:
    """What the rebase did with one patch."""

    id: str
    action: str      # applied | refreshed | resolved | upstream | dropped | skipped
    detail: str = ""


@dataclass
class Stop:
    """Where the rebase stopped and what the user is to do."""

    patch: str
    kind: str
    reason: str
    message: str
    edit: list[str] = field(default_factory=list)          # the files to change
    instructions: list[str] = field(default_factory=list)  # lines for a person
    drift: dict[str, str] = field(default_factory=dict)    # overlay file -> new upstream blob


@dataclass
class RebaseResult:
    done: bool
    from_ref: str
    to_ref: str
    steps: list[Step]
    stop: Stop | None = None
    tree: Path | None = None
    notes: list[str] = field(default_factory=list)


def state_dir(root: Path) -> Path:
    return root / ".patchkit" / "rebase"


class _State:
    """``state.json``: enough to go on after a stop, an interruption or a new process."""

    def __init__(self, sdir: Path, data: dict) -> None:
        self.sdir = sdir
        self.data = data

    @property
    def tree(self) -> Path:
        return self.sdir / "tree"

    @property
    def manifest_path(self) -> Path:
        return Path(self.data["manifest"])

    @property
    def resolved(self) -> source.Resolved:
        r = self.data["resolved"]
        return source.Resolved(r["source"], Path(r["repo"]), r["ref"], r["commit"], r["version"])

    @property
    def steps(self) -> list[Step]:
        return [Step(**s) for s in self.data["steps"]]

    def add(self, step: Step) -> None:
        self.data["steps"].append(asdict(step))

    @property
    def stopped(self) -> Stop | None:
        s = self.data.get("stopped")
        return Stop(**s) if s else None

    @stopped.setter
    def stopped(self, stop: Stop | None) -> None:
        self.data["stopped"] = asdict(stop) if stop else None

    def save(self) -> None:
        write_if_changed(self.sdir / "state.json",
                         (json.dumps(self.data, indent=2) + "\n").encode())

    @classmethod
    def load(cls, sdir: Path) -> _State:
        try:
            data = json.loads((sdir / "state.json").read_text())
        except FileNotFoundError:
            raise UsageError("no rebase in progress (start one with `patchkit rebase --to REF`)"
                             ) from None
        except ValueError as exc:
            raise UsageError(f"{sdir / 'state.json'} is unreadable ({exc}); "
                             "`patchkit rebase --abort` cleans up") from None
        if data.get("format") != STATE_FORMAT:
            raise UsageError(f"{sdir} was written by another patchkit version; "
                             "`patchkit rebase --abort` cleans up")
        return cls(sdir, data)


def _lock(sdir: Path) -> FileLock:
    sdir.parent.mkdir(parents=True, exist_ok=True)
    return FileLock(str(sdir.parent / "rebase.lock"))


def _patch_files(m: Manifest) -> list[str]:
    """Every file the series is made of, manifest-relative, the manifest first."""
    out = [m.path.name]
    for p in m.patches:
        full = m.root / p.path
        if p.kind == "overlay":
            out += [f"{p.path}/{rel}" for rel in overlay.files_of(full)]
        else:
            out.append(p.path)
    return list(dict.fromkeys(out))


def _rel(path: Path) -> str:
    try:
        return os.path.relpath(path)
    except ValueError:
        return str(path)


# ------------------------------------------------------------------------------ commands

def start(manifest_path: Path, to: str, *, repos: Sequence[str] | None = None,
          drop_upstream: bool = False, cache: Path | None = None,
          progress: engine.Progress | None = None) -> RebaseResult:
    """Begin moving the pin of ``manifest_path`` to ``to``; runs until done or stopped."""
    progress = progress or engine.Progress()
    m = manifest.load(manifest_path)
    sdir = state_dir(m.root)
    with _lock(sdir):
        if in_progress(m.root):
            raise UsageError("a rebase is already in progress; go on with `patchkit rebase "
                             "--continue` or undo it with `patchkit rebase --abort`")
        repos = tuple(repos or engine.manifest_sources(m))
        cache = cache or cache_dir()
        resolved = source.resolve(repos, to, cache, progress.info)
        shutil.rmtree(sdir, ignore_errors=True)  # the leftovers of a start that never finished
        sdir.mkdir(parents=True)
        try:
            files = _patch_files(m)
            for rel in files:
                dest = sdir / "backup" / rel
                dest.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(m.root / rel, dest)
            source.checkout(resolved, sdir / "tree")
            (sdir / "tree" / ".git" / "info").mkdir(exist_ok=True)
            (sdir / "tree" / ".git" / "info" / "exclude").write_text(IGNORED)
            state = _State(sdir, {
                "format": STATE_FORMAT, "manifest": str(m.path), "from": m.vllm.ref, "to": to,
                "repos": list(repos), "cache": str(cache),
                "resolved": {"source": resolved.source, "repo": str(resolved.repo),
                             "ref": resolved.ref, "commit": resolved.commit,
                             "version": resolved.version},
                "drop_upstream": drop_upstream, "head": resolved.commit, "steps": [],
                "stopped": None, "backup": files, "notes": []})
            state.save()
        except BaseException:
            shutil.rmtree(sdir, ignore_errors=True)
            raise
        return _run(state, progress)


def resume(manifest_path: Path, *, progress: engine.Progress | None = None) -> RebaseResult:
    """``--continue``: take the user's resolution of the stop, then go on."""
    progress = progress or engine.Progress()
    root = Path(os.path.abspath(manifest_path)).parent
    sdir = state_dir(root)
    with _lock(sdir):
        state = _State.load(sdir)
        stop = state.stopped
        if stop is not None:
            m = manifest.load(state.manifest_path)
            try:
                p = m.patch(stop.patch)
            except KeyError:
                p = None
            if stop.reason == "assertion" or p is None:
                if p is None and stop.patch != "":
                    state.add(Step(stop.patch, "dropped", "removed from the manifest by hand"))
            elif p.kind == "diff":
                _take_resolution(state, m, p, progress)
            elif p.kind == "overlay" and stop.drift:
                _record_replaces(m, p, stop.drift)
            elif _dirty(state.tree):
                raise UsageError(
                    f"the checkout {_rel(state.tree)} has changes, but {p.id} is a {p.kind}: "
                    f"change {p.path} instead (`git -C {_rel(state.tree)} reset --hard` and "
                    "`git clean -fd` there drop the checkout's changes)")
            state.stopped = None
            state.save()
        return _run(state, progress)


def abort(manifest_path: Path) -> list[str]:
    """``--abort``: write the manifest and every patch file back as they were; drop the state.
    Returns the files that had changed."""
    root = Path(os.path.abspath(manifest_path)).parent
    sdir = state_dir(root)
    with _lock(sdir):
        if not sdir.exists():
            raise UsageError("no rebase in progress")
        restored: list[str] = []
        try:
            files = json.loads((sdir / "state.json").read_text())["backup"]
        except (OSError, ValueError, KeyError):
            files = []  # a start that never got going changed nothing
        for rel in files:
            if write_if_changed(root / rel, (sdir / "backup" / rel).read_bytes()):
                restored.append(rel)
        shutil.rmtree(sdir)
        return restored


def in_progress(root: Path) -> bool:
    return (state_dir(root) / "state.json").exists()


# ------------------------------------------------------------------------------ the run

def _run(state: _State, progress: engine.Progress) -> RebaseResult:
    tree = state.tree
    res = state.resolved
    # An interrupted run may have left a half-applied patch: start again from the last commit.
    g.git("reset", "--quiet", "--hard", state.data["head"], cwd=tree)
    g.git("clean", "-q", "-fd", cwd=tree)
    while True:
        interrupt.check()
        m = manifest.load(state.manifest_path)
        done = {s.id for s in state.steps}
        p = next((q for q in m.patches if q.id not in done), None)
        if p is None:
            break
        r = engine.apply_one(m, p, tree, res.commit, res.version, res.repo)
        progress.patch(r)
        if r.status == "applied":
            assert r.commit
            state.data["head"] = r.commit
            if r.offsets and p.kind == "diff":
                state.add(Step(p.id, "refreshed", _refresh(m, p, tree, r)))
            else:
                state.add(Step(p.id, "applied"))
        elif r.status == "upstream":
            state.add(_mark_upstream(state, m, p, "already in the tree"))
        elif r.status == "skipped":
            state.add(Step(p.id, "skipped", r.message))
        else:
            state.stopped = _stop(state, m, p, r, progress)
            state.save()
            return _result(state)
        state.save()
    return _finish(state)


def _result(state: _State, done: bool = False) -> RebaseResult:
    return RebaseResult(done, state.data["from"], state.data["to"], state.steps, state.stopped,
                        None if done else state.tree, list(state.data.get("notes", [])))


def _refresh(m: Manifest, p: Patch, tree: Path, r: PatchResult) -> str:
    """Rewrite the diff of ``p``, which applied at an offset, to apply exactly at its commit's
    parent.  Moving the hunk headers keeps every other byte; git's own diff of the commit is
    the fallback when that is not exact."""
    file = m.root / p.path
    old = file.read_text(encoding="utf-8", errors="surrogateescape")
    new = diffwrite.shift_hunks(old, diffwrite.parse_offsets(r.offsets))
    how = "hunk headers moved"
    if not diffwrite.applies_exactly(tree, new, f"{r.commit}~1", r.commit):
        new = diffwrite.preamble(old) + diffwrite.diff_text(tree, f"{r.commit}~1", r.commit)
        how = "rewritten from the commit"
        if not diffwrite.applies_exactly(tree, new, f"{r.commit}~1", r.commit):
            raise PatchkitError(f"{p.path}: could not rewrite it to apply exactly")
    write_if_changed(file, new.encode("utf-8", errors="surrogateescape"))
    return f"{how}: " + "; ".join(r.offsets)


def _mark_upstream(state: _State, m: Manifest, p: Patch, why: str) -> Step:
    version = state.resolved.version
    text = ManifestText.read(m.path)
    if state.data["drop_upstream"]:
        text.delete_item(("patches",), p.index)
        text.write(m.path)
        others = {q.path for q in m.patches if q.id != p.id}
        if p.path not in others:
            target = m.root / p.path
            shutil.rmtree(target) if target.is_dir() else target.unlink(missing_ok=True)
        manifest.load(m.path)
        return Step(p.id, "dropped", f"{why}; entry and {p.path} removed")
    if version is None:
        return Step(p.id, "upstream", f"{why}; left as is: the target's release is unknown, "
                                      "so no vllm: range can be written")
    path = ("patches", p.index, "vllm")
    if text.has(path):
        spec = f"{(text.value(path) or '').strip()},<{version}"
        text.set_scalar(path, spec)
    else:
        spec = f"<{version}"
        text.insert_key(("patches", p.index), "vllm", spec, after=p.kind, style='"')
    text.write(m.path)
    manifest.load(m.path)  # the edit must leave a valid manifest
    return Step(p.id, "upstream", f'{why}; marked vllm: "{spec}"')


def _dirty(tree: Path) -> bool:
    return bool(g.out("status", "--porcelain", "--untracked-files=all", cwd=tree))


# ------------------------------------------------------------------------------ stopping

def _stop(state: _State, m: Manifest, p: Patch, r: PatchResult,
          progress: engine.Progress) -> Stop:
    tree, to = state.tree, state.data["to"]
    shown = _rel(tree)
    head = f"{p.id} ({p.kind} {p.path}) does not apply to vLLM {to}: {r.reason}: {r.message}"
    tail = [ABORT]
    if p.kind == "diff" and r.reason in ("conflict", "fuzz", "anchor-missing"):
        marked, notes = _merge_into(state, m, p, progress)
        lines = [head, "",
                 (f"The checkout {shown} holds vLLM {to} with the patches before {p.id}, and "
                  f"{p.id} merged in as far as it goes:")]
        lines += [f"  {f}: {n} conflict{'s' if n != 1 else ''} between <<<<<<< and >>>>>>>"
                  for f, n in marked.items()]
        lines += [f"  {n}" for n in notes]
        lines += ["", (f"Edit the checkout until it makes the change {p.id} should make (no "
                       "conflict marker left), then"),
                  f"`patchkit rebase --continue` writes that change to {p.path} and goes on.",
                  ("Leaving the checkout as upstream has it (no change) marks the patch as "
                   "upstream.")] + tail
        return Stop(p.id, p.kind, r.reason or "error", r.message,
                    [f"{shown}/{f}" for f in marked] or [shown], lines)
    if p.kind == "transform":
        what = {"anchor-missing": "its anchor is not in the file any more",
                "ambiguous-anchor": "its anchor matches more than one place now"}.get(
                    r.reason or "", "it fails on the new code")
        files = ", ".join(f"{shown}/{f}" for f in r.files) or shown
        lines = [head, "",
                 (f"The checkout {shown} holds vLLM {to} with the patches before {p.id} (left "
                  "unchanged)."),
                 f"Change {p.path}: {what}.  Match its anchors against {files}, then",
                 f"`patchkit rebase --continue` runs {p.path} again and goes on."] + tail
        return Stop(p.id, p.kind, r.reason or "error", r.message, [p.path], lines)
    if p.kind == "overlay" and r.reason == "overlay-drift":
        drift = _drift(m, p, tree, state.resolved.commit)
        lines = [f"{p.id} (overlay {p.path}) replaces files that upstream changed in vLLM {to}:"]
        for rel, new in drift.items():
            old = p.replaces.get(rel)
            if old:
                lines.append(f"  {rel}: upstream blob {old[:12]} -> {new[:12]}; the upstream "
                             f"change: git -C {shown} diff {old[:12]} {new[:12]}")
            else:
                lines.append(f"  {rel}: replaces upstream blob {new[:12]}, recorded nowhere; "
                             f"upstream's file: git -C {shown} show {new[:12]}")
        lines += ["", "Carry those upstream changes into "
                      + ", ".join(f"{p.path}/{rel}" for rel in drift) + ", then",
                  "`patchkit rebase --continue` records `replaces:` "
                  + ", ".join(f"{rel}: {new}" for rel, new in drift.items())
                  + f" in {m.path.name} and goes on."] + tail
        return Stop(p.id, p.kind, "overlay-drift", r.message,
                    [f"{p.path}/{rel}" for rel in drift], lines, drift)
    lines = [head, "", f"Fix {p.path}, then `patchkit rebase --continue` tries it again."] + tail
    return Stop(p.id, p.kind, r.reason or "error", r.message, [p.path], lines)


def _drift(m: Manifest, p: Patch, tree: Path, base: str) -> dict[str, str]:
    """Overlay file -> the upstream blob it now replaces, for each file the record misses."""
    out: dict[str, str] = {}
    for rel in overlay.files_of(m.root / p.path):
        blob = g.blob_id(tree, base, rel)
        if blob is None or p.replaces.get(rel) == blob:
            continue
        if g.hash_file(m.root / p.path / rel) == blob:
            continue  # the overlay already holds upstream's bytes
        out[rel] = blob
    return out


def _merge_into(state: _State, m: Manifest, p: Patch, progress: engine.Progress
                ) -> tuple[dict[str, int], list[str]]:
    """Merge the diff of ``p`` into the checkout with conflict markers.  Returns the files with
    markers (and how many) and notes about files that could not be merged."""
    marked, notes = _merge_from_old_pin(state, p, progress)
    if marked is not None:
        return marked, notes
    tree, diff = state.tree, m.root / p.path
    proc = g.git("apply", "--3way", "--whitespace=nowarn", str(diff), cwd=tree, check=False)
    if "lacks the necessary blob" not in proc.stderr and "--3way" not in proc.stderr:
        g.git("reset", "--quiet", cwd=tree)  # leave the index at HEAD, the markers in the files
        found = _count_markers(tree)
        if found or proc.returncode == 0:
            return found, []
    g.git("reset", "--quiet", "--hard", cwd=tree)
    g.git("apply", "--reject", "--whitespace=nowarn", str(diff), cwd=tree, check=False)
    rejects = g.out("ls-files", "--others", "--exclude-standard", "--", "*.rej", cwd=tree)
    return {}, ([f"{r}: the hunks that did not apply (delete the .rej file when done)"
                 for r in rejects.splitlines()] or ["nothing of the diff applies"])


def _count_markers(tree: Path) -> dict[str, int]:
    out: dict[str, int] = {}
    changed = g.out("diff", "--name-only", cwd=tree).splitlines()
    for rel in changed:
        try:
            text = (tree / rel).read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        n = sum(1 for line in text.splitlines() if line.startswith("<<<<<<< "))
        if n:
            out[rel] = n
    return out


def _merge_from_old_pin(state: _State, p: Patch, progress: engine.Progress
                        ) -> tuple[dict[str, int] | None, list[str]]:
    """Three-way merge per file: base = the file at the old pin with the patches before ``p``,
    theirs = that with ``p``, ours = the new checkout.  None when the old pin cannot give it."""
    backup = state.sdir / "backup" / Path(state.data["manifest"]).name
    try:
        old_m = manifest.load(backup)
        old_p = old_m.patch(p.id)
        old_res = source.resolve(state.data["repos"], state.data["from"],
                                 Path(state.data["cache"]), progress.info)
    except (PatchkitError, KeyError):
        return None, []
    old = state.sdir / "old"
    shutil.rmtree(old, ignore_errors=True)
    try:
        source.checkout(old_res, old, rebasecheck.needed_paths(old_m))
        for q in old_m.patches:
            if q.id == p.id:
                break
            engine.apply_one(old_m, q, old, old_res.commit, old_res.version, old_res.repo)
        r = engine.apply_one(old_m, old_p, old, old_res.commit, old_res.version, old_res.repo)
        if r.status != "applied" or not r.commit:
            return None, []
        tree, to, frm = state.tree, state.data["to"], state.data["from"]
        marked: dict[str, int] = {}
        notes: list[str] = []
        for rel in r.files:
            base = g.show(old, f"HEAD~1:{rel}")
            theirs = g.show(old, f"HEAD:{rel}")
            ours = tree / rel
            if not ours.exists():
                if base is None and theirs is not None:
                    ours.parent.mkdir(parents=True, exist_ok=True)
                    ours.write_text(theirs)
                elif base is not None:
                    notes.append(f"{rel}: not in vLLM {to} any more; make the change {p.id} "
                                 f"made there (see {p.path}) wherever that code went")
                continue
            if theirs is None:
                if ours.read_text(errors="replace") == base:
                    ours.unlink()
                else:
                    notes.append(f"{rel}: {p.id} deletes it, but upstream changed it; delete "
                                 "it if that is still right")
                continue
            b, t = state.sdir / "merge-base", state.sdir / "merge-theirs"
            b.write_text(base or "")
            t.write_text(theirs)
            proc = g.git("merge-file", "-L", f"vLLM {to}", "-L", f"vLLM {frm}", "-L",
                         f"{p.id}", str(ours), str(b), str(t), check=False)
            b.unlink()
            t.unlink()
            if proc.returncode < 0 or proc.returncode > 127:
                return None, []
            if proc.returncode:
                marked[rel] = proc.returncode
        return marked, notes
    finally:
        shutil.rmtree(old, ignore_errors=True)


# ------------------------------------------------------------------------------ continuing

def _take_resolution(state: _State, m: Manifest, p: Patch, progress: engine.Progress) -> None:
    tree = state.tree
    leftovers = [f for f in g.out("ls-files", "--others", "--exclude-standard", cwd=tree
                                  ).splitlines() if f.endswith((".rej", ".orig"))]
    if leftovers:
        raise UsageError(f"remove {', '.join(leftovers)} from {_rel(tree)} first "
                         "(what they hold must be in the files by now)")
    g.git("add", "-A", cwd=tree)
    text = diffwrite.diff_text(tree, "HEAD", cached=True)
    markers = diffwrite.conflict_markers(text)
    if markers:
        g.git("reset", "--quiet", cwd=tree)
        raise UsageError(f"conflict markers left in {_rel(tree)}: {', '.join(markers[:5])}"
                         f"{' ...' if len(markers) > 5 else ''}; resolve them, then "
                         "`patchkit rebase --continue`")
    if not text.strip():
        state.add(_mark_upstream(state, m, p, "resolved to no change"))
        return
    file = m.root / p.path
    old = file.read_text(encoding="utf-8", errors="surrogateescape")
    new = diffwrite.preamble(old) + text
    commit = g.commit_all(tree, engine.commit_message(p))
    assert commit
    if not diffwrite.applies_exactly(tree, new, f"{commit}~1", commit):
        raise PatchkitError(f"{p.path}: the resolution does not turn into a clean diff")
    write_if_changed(file, new.encode("utf-8", errors="surrogateescape"))
    state.data["head"] = commit
    state.add(Step(p.id, "resolved", f"{p.path} rewritten from the checkout"))
    progress.info(f"resolved {p.id}: {p.path} rewritten")


def _record_replaces(m: Manifest, p: Patch, drift: dict[str, str]) -> None:
    text = ManifestText.read(m.path)
    for rel, blob in drift.items():
        entry = ("patches", p.index)
        if text.has((*entry, "replaces", rel)):
            text.set_scalar((*entry, "replaces", rel), blob)
        elif text.has((*entry, "replaces")):
            text.insert_key((*entry, "replaces"), rel, blob)
        else:
            text.insert_key(entry, "replaces", {rel: blob}, after="overlay")
    text.write(m.path)
    manifest.load(m.path)


# ------------------------------------------------------------------------------ finishing

def _finish(state: _State) -> RebaseResult:
    tree, res = state.tree, state.resolved
    m = manifest.load(state.manifest_path)
    active = [p for p in m.patches if engine.in_range(p, res.version)[0]]
    failed = [a for a in verify.run_assertions(active, verify.tree_reader(tree)) if not a.ok]
    if failed:
        lines = [(f"every patch is through, but {len(failed)} assertion"
                  f"{'s do' if len(failed) > 1 else ' does'} not hold on vLLM {res.ref}:")]
        lines += [f"  {verify.format_failure(a)}" for a in failed]
        lines += ["", (f"Fix the `verify:` entries in {m.path.name} (or --abort and fix the "
                       "patches), then `patchkit rebase --continue` checks again."), ABORT]
        state.stopped = Stop("", "verify", "assertion", lines[0], [m.path.name], lines)
        state.save()
        return _result(state)
    notes = list(state.data.get("notes", []))
    text = ManifestText.read(m.path)
    old_ref = state.data["from"]
    if m.vllm.ref != res.ref:
        text.set_scalar(("vllm", "ref"), res.ref)
    base = text.value(("image", "base")) if text.has(("image", "base")) else None
    if base and "@" not in base and base.endswith(f":{old_ref}"):
        text.set_scalar(("image", "base"), base[:-len(old_ref)] + res.ref)
        notes.append(f"image.base: {base} -> {base[:-len(old_ref)] + res.ref}")
    elif base and old_ref in base:
        notes.append(f"image.base ({base}) still names vLLM {old_ref}: update it by hand")
    text.write(m.path)
    _prove(state, manifest.load(m.path))
    steps = state.steps
    shutil.rmtree(state.sdir)
    return RebaseResult(True, old_ref, res.ref, steps, None, None, notes)


def _prove(state: _State, m: Manifest) -> None:
    """The rebased manifest on a fresh checkout: every patch must apply exactly and give the
    tree the rebase built."""
    res = state.resolved
    proof = state.sdir / "proof"
    shutil.rmtree(proof, ignore_errors=True)
    try:
        # sparse, like rebase-check: commit trees hold every file either way
        source.checkout(res, proof, rebasecheck.needed_paths(m))
        report = engine.run_series(m, proof, res)
        bad = [f"{r.id}: {r.status} {r.reason or ''} {r.message} {'; '.join(r.offsets)}".strip()
               for r in report.patches if r.status == "failed" or r.offsets]
        same = (g.out("rev-parse", "HEAD^{tree}", cwd=proof)
                == g.out("rev-parse", "HEAD^{tree}", cwd=state.tree))
        if bad or not same:
            detail = "; ".join(bad) if bad else "it gives another tree than the rebase built"
            raise PatchkitError(f"the rebased series does not apply exactly to vLLM {res.ref}: "
                                f"{detail}; `patchkit rebase --abort` puts everything back")
    finally:
        shutil.rmtree(proof, ignore_errors=True)
