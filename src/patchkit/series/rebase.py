"""The rebase engine: move a pin to a new ref, one patch at a time, stopping where a person decides.

The series is applied to a checkout of the target in ``.patchkit/rebase/tree`` with the same
``applier.apply_one`` as ``apply``.  Per patch (what a kind does is the kind's: ``kinds/``):

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
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from patchkit import filelocks

from patchkit import git
from patchkit import interrupt, kinds, manifest, source, versions
from patchkit.errors import PatchkitError, UsageError
from patchkit.files import write_if_changed
from patchkit.imageref import is_template, moved_to_release
from patchkit.kinds import Stop
from patchkit.kinds.common import ABORT
from patchkit.manifest import VLLM, Manifest, Patch, Retired
from patchkit.manifest.edit import ManifestText
from patchkit.run import RunSpec
from patchkit.report import PatchResult, Reason, Status, Word
from patchkit.series import applier, assertions, fates

STATE_FORMAT = 1
IGNORED = "__pycache__/\n*.pyc\n"  # byte code from running the checkout is never part of a patch


class Action(Word):
    """What the rebase did with one patch."""

    APPLIED = "applied"                   # it went in as it is
    REFRESHED = "refreshed"               # it went in, and its file was written again
    RESOLVED = "resolved"                 # a person resolved its stop
    UPSTREAM = "upstream"                 # the release has its change: its range marked
    DROPPED = "dropped"                   # upstream and removed, or removed by hand
    DROPPED_BY_HAND = "dropped-by-hand"   # a person resolved it to no change
    MADE_BY_EARLIER = "made-by-earlier"   # its change is made by an earlier patch
    SKIPPED = "skipped"                   # outside its range, or its package's pin stays


@dataclass(frozen=True)
class Step:
    """What the rebase did with one patch."""

    id: str
    action: Action
    detail: str = ""

    @classmethod
    def from_dict(cls, data: dict) -> Step:
        return cls(str(data["id"]), Action(data["action"]), str(data.get("detail") or ""))


@dataclass(frozen=True)
class RebaseResult:
    """Where one run of ``rebase`` left the move of a pin: stopped for a person (``stop``),
    done, or aborted (``restored``: the files written back as they were)."""

    done: bool
    from_ref: str
    to_ref: str
    steps: list[Step]
    stop: Stop | None = None
    tree: Path | None = None
    notes: list[str] = field(default_factory=list)
    label: str = VLLM.label   # the package whose pin moves, as messages name it
    restored: list[str] | None = None   # --abort: the files written back (None: no abort)

    @property
    def aborted(self) -> bool:
        return self.restored is not None

    @property
    def ok(self) -> bool:
        """Nothing is left for a person to decide (done, aborted, or going on)."""
        return self.stop is None


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
    def package(self) -> str:
        """The package whose pin moves (vLLM unless ``--package``)."""
        return self.data.get("package", VLLM.name)

    @property
    def id(self) -> source.PackageId:
        return manifest.identity(self.package, self.data.get("dist", self.package))

    @property
    def label(self) -> str:
        return self.id.label

    @property
    def found(self) -> dict[str, str | None]:
        """The version of every package the ranges are judged on: the target's for the
        package that moves, the pins of the others."""
        return {**self.data.get("others", {}), self.package: self.resolved.version}

    @property
    def tops(self) -> tuple[str, ...]:
        return tuple(self.data.get("tops", ()))

    def apply_one(self, m: Manifest, p: Patch, tree: Path, res: source.Resolved,
                  found: dict | None = None) -> PatchResult:
        return applier.apply_one(m, p, tree, res.commit, res.version, res.repo,
                                 package=self.package, found=found or self.found,
                                 tops=self.tops, memo=Path(self.data["cache"]))

    @property
    def steps(self) -> list[Step]:
        return [Step.from_dict(s) for s in self.data["steps"]]

    def add(self, step: Step) -> None:
        self.data["steps"].append(asdict(step))

    @property
    def stopped(self) -> Stop | None:
        s = self.data.get("stopped")
        return Stop(**{**s, "reason": Reason(s["reason"])}) if s else None

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


def _lock(sdir: Path):
    sdir.parent.mkdir(parents=True, exist_ok=True)
    return filelocks.held(sdir.parent / "rebase.lock", f"the rebase in {sdir.parent}")


def _patch_files(m: Manifest) -> list[str]:
    """Every file the series is made of, manifest-relative, the manifest first."""
    out = [m.path.name]
    for p in m.patches:
        out += kinds.get(p.kind).sources(m.root / p.path, p.path)
    return list(dict.fromkeys(out))


def _rel(path: Path) -> str:
    try:
        return os.path.relpath(path)
    except ValueError:
        return str(path)


# ------------------------------------------------------------------------------ commands

def start(m: Manifest, spec: RunSpec, to: str, *, drop_upstream: bool = False,
          package: str = VLLM.name, progress: applier.Progress | None = None) -> RebaseResult:
    """Begin moving the pin of ``package`` (default vLLM) of ``m`` to ``to``, with the sources
    and cache of the run ``spec``; runs until done or stopped."""
    progress = progress or applier.Progress()
    sdir = state_dir(m.root)
    with _lock(sdir):
        if in_progress(m.root):
            raise UsageError("a rebase is already in progress; go on with `patchkit rebase "
                             "--continue` or undo it with `patchkit rebase --abort`")
        pin = spec.pin(package)
        repos = pin.sources
        cache = spec.cache
        if (source.BASE_REF in (to, pin.ref)
                or any(source.kind_of(r).reads_base for r in repos)):
            raise UsageError("rebase moves the pin between refs of git or PyPI sources; a pin "
                             f"'{source.BASE_REF}' or the source 'image' follows the base image "
                             "instead: change image.base, then check with rebase-check")
        pid = pin.id
        resolved = source.resolve(repos, to, cache, progress.info, package=pid)
        _warn_if_backwards(pin.ref, to, resolved.version, pid.label, progress)
        series = [p for p in m.patches if p.package == package]
        if any(p.retired is not None for p in series):
            _, tags = source.list_tags(repos, cache, progress.info, package=pid)
            fates.check_retired_releases(m, series, tags, pid.label)
        _prove_retired(m, series, resolved)
        others = {name: r.version for name, r in applier.resolve_pins(
            spec, cache, progress.info, None, [q.name for q in spec.pins if q.name != package]
        ).items()}
        tops = applier.package_tops(resolved, pid)
        shutil.rmtree(sdir, ignore_errors=True)  # the leftovers of a start that never finished
        sdir.mkdir(parents=True)
        try:
            files = _patch_files(m)
            for rel in files:
                dest = sdir / "backup" / rel
                dest.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(m.root / rel, dest)
            source.checkout(resolved, sdir / "tree")
            git.exclude(sdir / "tree", IGNORED)
            state = _State(sdir, {
                "format": STATE_FORMAT, "manifest": str(m.path), "from": pin.ref, "to": to,
                "repos": list(repos), "cache": str(cache), "package": package,
                "dist": pin.dist, "others": others, "tops": list(tops),
                "resolved": {"source": resolved.source, "repo": str(resolved.repo),
                             "ref": resolved.ref, "commit": resolved.commit,
                             "version": resolved.version},
                "drop_upstream": drop_upstream, "head": resolved.commit, "steps": [],
                "stopped": None, "backup": files, "notes": []})
            state.save()
        except BaseException:
            shutil.rmtree(sdir, ignore_errors=True)
            raise
        return _run(state, m, progress)


def _prove_retired(m: Manifest, series: list[Patch], resolved: source.Resolved) -> None:
    """Every retirement that holds at ``resolved``, proven there before anything is written;
    one line naming what still exists when one is not."""
    for proof in fates.proofs_at(m, series, resolved).values():
        if not proof.ok:
            raise UsageError(proof.line)


def _warn_if_backwards(pinned: str, to: str, version: str | None, label: str,
                       progress: applier.Progress) -> None:
    """One line when ``to`` is an older release than the pin: moving it back is allowed (a
    regression hunt), but should never happen unnoticed."""
    old = versions.release_tag(pinned)
    new = versions.parse(version) or versions.release_tag(to)
    if old is not None and new is not None and new < old:
        progress.info(f"warning: {label} {to} ({new}) is older than the pin {pinned}: the pin "
                      "moves backwards")


def resume(manifest_path: Path, *, progress: applier.Progress | None = None) -> RebaseResult:
    """``--continue``: take the user's resolution of the stop, then go on."""
    progress = progress or applier.Progress()
    root = Path(os.path.abspath(manifest_path)).parent
    sdir = state_dir(root)
    with _lock(sdir):
        state = _State.load(sdir)
        stop = state.stopped
        # the person may have edited the manifest while stopped: it is loaded once, here
        m = manifest.load(state.manifest_path)
        if stop is not None:
            try:
                p = m.patch(stop.patch)
            except KeyError:
                p = None
            if p is not None and not p.takes_effect(state.found)[0]:
                # retired (or ranged out) by hand at the stop: proven, then passed over
                if p.retired is not None:
                    _prove_retired(m, [p], state.resolved)
                git.discard_changes(state.tree, state.data["head"])
                state.add(Step(p.id, Action.SKIPPED, p.takes_effect(state.found)[1]))
            elif stop.reason is Reason.ASSERTION or p is None:
                if p is None and stop.patch != "":
                    state.add(Step(stop.patch, Action.DROPPED, "removed from the manifest by hand"))
            else:
                rebase = _Rebase(state, m, progress)
                kinds.get(p.kind).resume(rebase, p, stop)
                m = rebase.manifest   # as the resolution left it
            state.stopped = None
            state.save()
        return _run(state, m, progress)


def abort(manifest_path: Path) -> RebaseResult:
    """``--abort``: write the manifest and every patch file back as they were; drop the state.
    The result's ``restored`` names the files that had changed."""
    root = Path(os.path.abspath(manifest_path)).parent
    sdir = state_dir(root)
    with _lock(sdir):
        if not sdir.exists():
            raise UsageError("no rebase in progress")
        restored: list[str] = []
        try:
            data = json.loads((sdir / "state.json").read_text())
            files = data["backup"]
        except (OSError, ValueError, KeyError, TypeError):
            data, files = {}, []  # a start that never got going changed nothing
        for rel in files:
            if write_if_changed(root / rel, (sdir / "backup" / rel).read_bytes()):
                restored.append(rel)
        shutil.rmtree(sdir)
        return RebaseResult(False, str(data.get("from") or ""), str(data.get("to") or ""), [],
                            label=_State(sdir, data).label, restored=restored)


def in_progress(root: Path) -> bool:
    return (state_dir(root) / "state.json").exists()


# ------------------------------------------------------------------------------ the run

def _run(state: _State, m: Manifest, progress: applier.Progress) -> RebaseResult:
    """Each patch not yet through, in order.  ``m`` is the manifest as loaded once; an edit of
    it (a patch marked or dropped as upstream) hands on the manifest it leaves, loaded once to
    prove it valid, so that no step loads it (and parses every diff) again."""
    tree = state.tree
    res = state.resolved
    # An interrupted run may have left a half-applied patch: start again from the last commit.
    git.discard_changes(tree, state.data["head"])
    while True:
        interrupt.check()
        done = {s.id for s in state.steps}
        p = next((q for q in m.patches if q.id not in done), None)
        if p is None:
            break
        if p.package != state.package:   # another package's pin does not move
            state.add(Step(p.id, Action.SKIPPED, f"it patches {p.package}, whose pin stays"))
            state.save()
            continue
        r = state.apply_one(m, p, tree, res)
        progress.patch(r)
        with interrupt.deferred():  # a step's files and its record in state.json together
            if r.status is Status.APPLIED:
                assert r.commit
                state.data["head"] = r.commit
                refreshed = kinds.get(p.kind).refresh(p, m.root / p.path, tree, r)
                state.add(Step(p.id, Action.REFRESHED, refreshed) if refreshed
                          else Step(p.id, Action.APPLIED))
            elif r.status is Status.UPSTREAM:
                earlier = _made_by(state, m, p)
                step, m = _mark_upstream(state, m, p, "already in the tree", made_by=earlier)
                state.add(step)
            elif r.status is Status.SKIPPED:
                state.add(Step(p.id, Action.SKIPPED, r.message))
            else:
                state.stopped = _stop(state, m, p, r, progress)
                state.save()
                return _result(state)
            state.save()
    return _finish(state, m)


def _result(state: _State, done: bool = False) -> RebaseResult:
    return RebaseResult(done, state.data["from"], state.data["to"], state.steps, state.stopped,
                        None if done else state.tree, list(state.data.get("notes", [])),
                        state.label)


def _made_by(state: _State, m: Manifest, p: Patch) -> str | None:
    """The earlier patch of the series whose change ``p`` found in the tree, when the release
    itself does not have it (``applier.made_by``)."""
    done = {s.id for s in state.steps if s.action in (Action.APPLIED, Action.REFRESHED,
                                                    Action.RESOLVED)}
    earlier = []
    for q in m.patches:
        if q.id == p.id:
            break
        if q.id in done and q.package == p.package:
            try:
                earlier.append((q.id, kinds.get(q.kind).touched(m.root / q.path)))
            except kinds.KindError:
                continue
    return applier.made_by(m, p, earlier, state.tree, state.resolved)


def _mark_upstream(state: _State, m: Manifest, p: Patch, why: str, *, by_hand: bool = False,
                   made_by: str | None = None) -> tuple[Step, Manifest]:
    """The step of ``p`` marked (or dropped) as upstream, and the manifest the edit leaves
    (loaded once: the edit must leave a valid manifest).  ``by_hand``: a person resolved it
    to no change; nothing proved the release has its change, so the words say what happened
    (dropped by hand at that release), never "upstream"."""
    version = state.resolved.version
    text = ManifestText.read(m.path)
    at = f"{state.label} {state.data['to']}"
    action = (Action.DROPPED_BY_HAND if by_hand else Action.MADE_BY_EARLIER if made_by
              else Action.UPSTREAM)
    if made_by:   # the tree has it only because an earlier patch made it: say which
        why = f"its change is made by {made_by}, earlier in the series (not by {at})"
    successors = [q.id for q in m.patches if p.id in q.supersedes]
    if successors:   # its entry stays, for the `supersedes:` that names it
        why += f"; kept for {', '.join(successors)}, which supersede{'s' if len(successors) == 1 else ''} it"
    if state.data["drop_upstream"] and not successors:
        comment = (f"{p.id}: dropped by hand at {at} ({why})" if by_hand else
                   f"{p.id}: dropped at {at}: {why}" if made_by else
                   f"{p.id}: dropped, upstream in {at} (it reported `upstream` there)")
        text.delete_item(("patches",), p.index, comment=comment)
        text.write(m.path)
        others = {q.path for q in m.patches if q.id != p.id}
        if p.path not in others:
            target = m.root / p.path
            shutil.rmtree(target) if target.is_dir() else target.unlink(missing_ok=True)
        return (Step(p.id, Action.DROPPED if action is Action.UPSTREAM else action,
                     f"{why}; entry and {p.path} removed"), manifest.load(m.path))
    key = state.package
    if version is None:
        return Step(p.id, action, f"{why}; left as is: the target's release is unknown, "
                                  f"so no {key}: range can be written"), m
    path = ("patches", p.index, key)
    if text.has(path):
        spec = f"{(text.value(path) or '').strip()},<{version}"
        text.set_scalar(path, spec)
    else:
        spec = f"<{version}"
        text.insert_key(("patches", p.index), key, spec, after=p.kind, style='"')
    text.write(m.path)
    return Step(p.id, action, f'{why}; marked {key}: "{spec}"'), manifest.load(m.path)


# ------------------------------------------------------------------------------ stopping

class _Rebase:
    """What a kind may see and do of the rebase in progress (``kinds.Rebase``)."""

    def __init__(self, state: _State, m: Manifest, progress: applier.Progress) -> None:
        self.state = state
        self.manifest = m
        self.progress = progress
        self.tree = state.tree
        self.to = state.data["to"]
        self.frm = state.data["from"]
        self.shown = _rel(state.tree)
        self.label = state.label
        self.base_commit = state.resolved.commit

    @contextmanager
    def old_pin(self, patch: Patch) -> Iterator[tuple[Path, PatchResult] | None]:
        """The old pin with the patches before ``patch``, then ``patch``, applied."""
        state = self.state
        backup = state.sdir / "backup" / Path(state.data["manifest"]).name
        try:
            old_m = manifest.load(backup)
            old_p = old_m.patch(patch.id)
            old_res = source.resolve(state.data["repos"], state.data["from"],
                                     Path(state.data["cache"]), self.progress.info,
                                     package=state.id)
        except (PatchkitError, KeyError):
            yield None
            return
        old = state.sdir / "old"
        shutil.rmtree(old, ignore_errors=True)
        try:
            source.checkout(old_res, old, applier.needed_paths(old_m, state.package))
            found = {**state.found, state.package: old_res.version}
            for q in old_m.patches:
                if q.id == patch.id:
                    break
                state.apply_one(old_m, q, old, old_res, found)
            r = state.apply_one(old_m, old_p, old, old_res, found)
            yield (old, r) if r.status is Status.APPLIED and r.commit else None
        finally:
            shutil.rmtree(old, ignore_errors=True)

    def mark_upstream(self, patch: Patch, why: str) -> None:
        step, self.manifest = _mark_upstream(self.state, self.manifest, patch, why)
        self.state.add(step)

    def dropped_by_hand(self, patch: Patch, why: str) -> None:
        step, self.manifest = _mark_upstream(self.state, self.manifest, patch, why, by_hand=True)
        self.state.add(step)

    def record_replaces(self, patch: Patch, drift: dict[str, str]) -> None:
        text = ManifestText.read(self.manifest.path)
        entry = ("patches", patch.index)
        for rel, blob in drift.items():
            if text.has((*entry, "replaces", rel)):
                text.set_scalar((*entry, "replaces", rel), blob)
            elif text.has((*entry, "replaces")):
                text.insert_key((*entry, "replaces"), rel, blob)
            else:
                text.insert_key(entry, "replaces", {rel: blob}, after=patch.kind)
        text.write(self.manifest.path)
        self.manifest = manifest.load(self.manifest.path)   # the edit must leave it valid

    def resolved(self, patch: Patch, commit: str, detail: str) -> None:
        self.state.data["head"] = commit
        self.state.add(Step(patch.id, Action.RESOLVED, detail))
        self.progress.info(f"resolved {patch.id}: {patch.path} rewritten")


def _stop(state: _State, m: Manifest, p: Patch, r: PatchResult,
          progress: applier.Progress) -> Stop:
    head = (f"{p.id} ({p.kind} {p.path}) does not apply to {state.label} {state.data['to']}: "
            f"{r.reason}: {r.message}")
    stop = kinds.get(p.kind).stop(_Rebase(state, m, progress), p, r, head)
    if r.reason in (Reason.CONFLICT, Reason.FUZZ, Reason.ANCHOR_MISSING):
        proof = fates.prove(m, replace(p, retired=Retired(state.data["to"], "")),
                            state.resolved)
        if proof.ok:   # the code it changes is gone: the honest way out is to retire it
            stop.instructions[1:1] = ["", f"The code it changes is gone from {state.label} "
                                          f"{state.data['to']} ({'; '.join(proof.remains.gone)}):",
                                      fates.retire_hint(p, state.label, state.data["to"])
                                      + ", then `patchkit rebase --continue`."]
    return stop


# ------------------------------------------------------------------------------ finishing

def _finish(state: _State, m: Manifest) -> RebaseResult:
    """Every patch through: the assertions on the tree, then the pin moved in ``m`` (the
    manifest as the run left it) and the result proven on a fresh checkout."""
    tree, res = state.tree, state.resolved
    active = [p for p in m.patches if p.package == state.package
              and p.takes_effect(state.found)[0]]
    failed = [a for a in assertions.run_assertions(active, assertions.tree_reader(tree)) if not a.ok]
    if failed:
        lines = [(f"every patch is through, but {len(failed)} assertion"
                  f"{'s do' if len(failed) > 1 else ' does'} not hold on {state.label} {res.ref}:")]
        lines += [f"  {a.failure_line()}" for a in failed]
        lines += ["", (f"Fix the `verify:` entries in {m.path.name} (or --abort and fix the "
                       "patches), then `patchkit rebase --continue` checks again."), ABORT]
        state.stopped = Stop("", "verify", Reason.ASSERTION, lines[0], [m.path.name], lines)
        state.save()
        return _result(state)
    notes = list(state.data.get("notes", []))
    text = ManifestText.read(m.path)
    old_ref = state.data["from"]
    if not state.id.primary:   # only that package's `ref:` line
        if m.package(state.package).ref != res.ref:
            text.set_scalar(("packages", state.package, "ref"), res.ref)
        text.write(m.path)
        _prove(state, manifest.load(m.path))
        steps = state.steps
        shutil.rmtree(state.sdir)
        return RebaseResult(True, old_ref, res.ref, steps, None, None, notes, state.label)
    if m.vllm.ref != res.ref:
        text.set_scalar((VLLM.name, "ref"), res.ref)
    base = text.value(("image", "base")) if text.has(("image", "base")) else None
    moved = moved_to_release(base, old_ref, res.ref) if base else None
    if base and moved:
        text.set_scalar(("image", "base"), moved)
        notes.append(f"image.base: {base} -> {moved}")
    elif base and old_ref.removeprefix("v") in base and not is_template(base):
        notes.append(f"image.base ({base}) still names vLLM {old_ref}: update it by hand")
    text.write(m.path)
    _prove(state, manifest.load(m.path))
    steps = state.steps
    shutil.rmtree(state.sdir)
    return RebaseResult(True, old_ref, res.ref, steps, None, None, notes)


def _prove(state: _State, m: Manifest) -> None:
    """The rebased manifest on a fresh checkout: every patch of the package must apply exactly
    and give the tree the rebase built."""
    res = state.resolved
    proof = state.sdir / "proof"
    shutil.rmtree(proof, ignore_errors=True)
    try:
        # sparse, like rebase-check: commit trees hold every file either way
        source.checkout(res, proof, applier.needed_paths(m, state.package))
        results = [state.apply_one(m, p, proof, res) for p in m.patches
                   if p.package == state.package]
        bad = [f"{r.id}: {r.status} {r.reason or ''} {r.message} {'; '.join(map(str, r.offsets))}".strip()
               for r in results if r.status is Status.FAILED or r.offsets]
        same = git.tree_of(proof, "HEAD") == git.tree_of(state.tree, "HEAD")
        if bad or not same:
            detail = "; ".join(bad) if bad else "it gives another tree than the rebase built"
            raise PatchkitError(f"the rebased series does not apply exactly to {state.label} "
                                f"{res.ref}: {detail}; `patchkit rebase --abort` puts "
                                "everything back")
    finally:
        shutil.rmtree(proof, ignore_errors=True)
