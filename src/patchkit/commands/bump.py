"""bump: the series ported to a package's newest release, written as one change to review.

What Renovate and Dependabot do for a dependency, for the pin of a patch series.  Per package
(vLLM and each entry of ``packages:``) with a newer release:

1. in a scratch work tree of the project (``.patchkit/bump/<package>-<version>``, detached at
   HEAD: the user's branch, index and files are never touched), ``rebase`` moves the pin:
   offsets refreshed, patches the release already has dropped (a comment names the release),
   every patch proven to apply exactly on a fresh checkout, the assertions run;
2. the manifest's ``bump.probes`` run there (behaviour tests, a support table's refresh): each
   must exit 0 within ``bump.timeout``; files they change are part of the change;
3. one commit, on ``patchkit/bump-<package>-<version>``, and with ``--push REMOTE`` that branch
   at the remote (only if it is still what it was there: one ref, all or nothing).

A patch that cannot be ported, an assertion that stops holding or a probe that fails ends the
bump as "needs a hand" (``EXIT_NEEDS_A_HAND``): no branch is written, and the scratch tree is left
as ``rebase`` leaves a stop, for a person to finish there (``patchkit rebase --continue``, then
``patchkit bump --package NAME`` again).  The pull request body (``render.bump``) says every
patch's fate, what needs a hand and how the series was proven.  ``--dry-run`` does all of it in
a throwaway tree and writes nothing.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from patchkit import git as g
from patchkit import manifest, process, source, versions
from patchkit.series import rebase
from patchkit.errors import CommandError, PatchkitError, UsageError
from patchkit.kinds import Stop
from patchkit.manifest import Manifest
from patchkit.manifest.runspec import RunSpec, run_spec
from patchkit.series import applier
from patchkit.series.releases import release_targets

EXIT_NEEDS_A_HAND = 4
TRAILER = "Patchkit-Bump"
REMOTE_TIMEOUT = 60.0


@dataclass
class Probe:
    command: str
    returncode: int | None     # None: killed at the deadline
    seconds: float
    output: str                # the last lines it wrote

    @property
    def ok(self) -> bool:
        return self.returncode == 0


@dataclass
class BumpResult:
    """One package's bump."""

    package: str               # the manifest's name for it (vllm, flashinfer, ...)
    label: str                 # as messages name it (vLLM)
    from_ref: str
    to_ref: str | None         # None: nothing newer
    status: str                # bumped | dry-run | current | needs-a-hand
    branch: str | None = None
    commit: str | None = None
    pushed: str | None = None  # the remote the branch went to
    steps: list[rebase.Step] = field(default_factory=list)
    stop: Stop | None = None
    probes: list[Probe] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)   # files of the change
    worktree: str | None = None    # where a person finishes a bump that needs a hand
    notes: list[str] = field(default_factory=list)
    assertions: int = 0
    dry_run: bool = False
    untried: list[str] = field(default_factory=list)   # after the patch that stopped the port

    @property
    def needs_a_hand(self) -> bool:
        return self.status == "needs-a-hand"

    def to_dict(self) -> dict:
        data = asdict(self)
        data["needs_a_hand"] = self.needs_a_hand
        data["probes"] = [dict(asdict(p), ok=p.ok) for p in self.probes]
        return data


def branch_name(package: str, version: str) -> str:
    return f"patchkit/bump-{package}-{version}"


def run(manifest_path: Path, *, package: str | None = None, to: str | None = None,
        dry_run: bool = False, push: str | None = None, repos: Sequence[str] | None = None,
        progress: applier.Progress | None = None) -> list[BumpResult]:
    """Bump ``package`` (default: every package of the manifest, vLLM first)."""
    progress = progress or applier.Progress()
    if to and not package:
        raise UsageError("--to names a release of one package: give --package too")
    if dry_run and push:
        raise UsageError("--dry-run writes nothing, so it pushes nothing: drop --push")
    m = manifest.load(manifest_path)
    names = [package] if package else [p.name for p in m.packages]
    # an unknown package: one line, with "did you mean"
    spec = run_spec(m, repos=repos, only=names)
    if repos and not all(m.package(n).id.primary for n in names):
        raise UsageError("--vllm-repo goes with vLLM's bump (--package vllm)")
    project = _project(m)
    ask = Ask(to, dry_run, push, repos)
    return [_bump_one(m, project, spec, name, ask, progress) for name in names]


@dataclass(frozen=True)
class Ask:
    """What a bump was asked: the release to move to (default the newest), whether only to
    try it, where to push the branch, and vLLM's sources (``--vllm-repo``)."""

    to: str | None
    dry_run: bool
    push: str | None
    repos: Sequence[str] | None


def _project(m: Manifest) -> Path:
    top = g.toplevel(m.root)
    if top is None:
        raise UsageError(f"{m.path} is not in a git work tree: bump writes its change as a "
                         "commit on a branch")
    # patchkit's own folder (checkouts, a bump left for a person) is not the user's work
    dirty = [path for _xy, path in g.status(top) if not path.startswith(".patchkit/")]
    if dirty:
        more = f" and {len(dirty) - 1} more" if len(dirty) > 1 else ""
        raise UsageError(f"the work tree {top} has changes ({dirty[0]}{more}): commit or stash "
                         "them first; bump writes the port as a commit of its own")
    return top


def _bump_one(m: Manifest, project: Path, spec: RunSpec, name: str, ask: Ask,
              progress: applier.Progress) -> BumpResult:
    pin = spec.pin(name)
    label = pin.id.label
    target = ask.to or _newest(m, spec, name, progress)
    if target is None:
        return BumpResult(name, label, pin.ref, None, "current")
    version = _version(spec, name, target, progress)
    dry_run, push = ask.dry_run, ask.push
    branch = branch_name(name, version)
    remote_was = _check_branches(project, branch, name, version, push)
    rel = m.path.relative_to(project)
    scratch = Path(tempfile.mkdtemp(prefix="patchkit-bump-")) / "tree" if dry_run \
        else project / ".patchkit" / "bump" / f"{name}-{version}"
    resumed = scratch.exists() and _finished_by_hand(scratch, rel, label, version)
    if not resumed:
        scratch.parent.mkdir(parents=True, exist_ok=True)
        g.add_worktree(project, scratch, "HEAD")
    result = BumpResult(name, label, pin.ref, target, "dry-run" if dry_run else "bumped",
                        branch=None if dry_run else branch, dry_run=dry_run)
    keep = False
    try:
        if resumed:
            result.notes.append(f"the port was finished by hand in {scratch}")
            keep = _probe_all(scratch / rel, result, name, target)
        else:
            keep = _port(scratch / rel, spec, result, name, target, progress)
        if not (result.needs_a_hand or dry_run):
            _commit(project, scratch, result, version, remote_was, push)
        return result
    except CommandError as exc:
        if push and result.commit and not result.pushed:
            raise PatchkitError(f"could not push {branch} to {push}: {_last_line(exc)}; the "
                                f"branch is written here, push it by hand") from None
        raise
    finally:
        if keep and not dry_run:
            result.worktree = str(scratch)
        else:
            g.remove_worktree(project, scratch)
            if dry_run:
                shutil.rmtree(scratch.parent, ignore_errors=True)


def _version(spec: RunSpec, name: str, target: str, progress) -> str:
    """The release ``target`` of package ``name`` names, once it is known to be newer than
    the pin."""
    pin = spec.pin(name)
    label = pin.id.label
    resolved = source.resolve(pin.sources, target, spec.cache, progress.info, package=pin.id)
    version = resolved.version or target.removeprefix("v")
    if (versions.release_tag(pin.ref) is not None and versions.release_tag(target) is not None
            and versions.release_tag(target) <= versions.release_tag(pin.ref)):
        raise UsageError(f"{label} {target} is not newer than the pin {pin.ref}: bump only "
                         "moves a pin forwards")
    return version


def _commit(project: Path, scratch: Path, result: BumpResult, version: str, remote_was,
            push: str | None) -> None:
    """The port as one commit on the bump branch (pushed with ``push``)."""
    head = g.head(scratch)
    result.commit = g.user_commit(scratch, _message(result, version))
    result.changed = [path for _s, path, *_ in g.changed_files(scratch, head, result.commit)]
    g.update_ref(project, f"refs/heads/{result.branch}", result.commit)
    if push:
        g.push_branch(project, push, result.branch, result.commit, remote_was, REMOTE_TIMEOUT)
        result.pushed = push


def _newest(m: Manifest, spec: RunSpec, name: str, progress) -> str | None:
    targets = release_targets(m, spec, log=progress.info, package=name)
    return targets[-1] if targets else None


def _check_branches(project: Path, branch: str, name: str, version: str,
                    push: str | None) -> str | None:
    """Refuse a branch (here, or at ``push``) that holds other commits than an earlier bump to
    the same release; what the remote's branch is now (None: absent)."""
    mine = g.resolve_commit(project, f"refs/heads/{branch}")
    if mine is not None:
        _only_bump_commits(project, mine, branch, name, version, "here")
    if not push:
        return None
    try:
        theirs = g.remote_branch(project, push, branch, REMOTE_TIMEOUT)
        if theirs is not None:
            g.fetch_commit(project, push, branch, REMOTE_TIMEOUT)
    except CommandError as exc:
        raise UsageError(f"cannot reach the remote {push!r}: {_last_line(exc)}") from None
    if theirs is not None:
        _only_bump_commits(project, theirs, branch, name, version, f"at {push}")
    return theirs


def _only_bump_commits(project: Path, tip: str, branch: str, name: str, version: str,
                       where: str) -> None:
    own = g.local_commits(project, "HEAD", tip)
    foreign = [c for c in own
               if (TRAILER, f"{name} {version}") not in g.commit_info(project, c).trailers]
    if foreign or len(own) > 1:
        count = len(foreign) or len(own)
        raise UsageError(f"the branch {branch} {where} has {count} commit"
                         f"{'s' if count != 1 else ''} that are not this bump's: merge or "
                         "delete it first; bump replaces only its own commit")


def _finished_by_hand(scratch: Path, rel: Path, label: str, version: str) -> bool:
    """A port left for a person: True once they finished it (the bump goes on from there);
    one line while it still needs them, or when it holds nothing."""
    drop = f"drop it with `git worktree remove --force {scratch}`"
    if rebase.in_progress((scratch / rel).parent):
        raise UsageError(f"the port of {label} to {version} in {scratch} still needs a hand: "
                         f"resolve it there (`patchkit rebase --continue`), then run this bump "
                         f"again; or {drop}")
    if not [p for _xy, p in g.status(scratch) if not p.startswith(".patchkit/")]:
        raise UsageError(f"the port of {label} to {version} in {scratch} holds no change (was "
                         f"its rebase aborted?): {drop}")
    return True


def _port(manifest_path: Path, spec: RunSpec, result: BumpResult, name: str, target: str,
          progress) -> bool:
    """Rebase, assertions and probes in the scratch tree (its manifest a copy of the run's);
    True when a person must finish it there (the tree is kept)."""
    done = rebase.start(manifest.load(manifest_path), spec, target, drop_upstream=True,
                        package=name, progress=progress)
    ours = [p.id for p in manifest.load(manifest_path).patches if p.package == name]
    # the body speaks of this package's series: the others' patches keep their pins
    result.steps = [s for s in done.steps if s.id in ours or s.action == "dropped"]
    result.notes = done.notes
    if done.stop is not None:
        result.status = "needs-a-hand"
        result.stop = done.stop
        seen = {s.id for s in result.steps} | {done.stop.patch}
        result.untried = [pid for pid in ours if pid not in seen]
        return True
    return _probe_all(manifest_path, result, name, target)


def _probe_all(manifest_path: Path, result: BumpResult, name: str, target: str) -> bool:
    """The manifest's probes, in order, until one fails; True when one did (a person's)."""
    m = manifest.load(manifest_path)
    result.assertions = sum(len(p.verify) for p in m.patches if p.package == name)
    for command in m.bump.probes:
        probe = _probe(command, m, name, result, target)
        result.probes.append(probe)
        if not probe.ok:
            result.status = "needs-a-hand"
            return True
    return False


def _probe(command: str, m: Manifest, name: str, result: BumpResult, target: str) -> Probe:
    # PATCHKIT_PYTHON: the interpreter patchkit runs in, which can import it (and its tests)
    env = {"PATCHKIT_BUMP_PACKAGE": name, "PATCHKIT_BUMP_FROM": result.from_ref,
           "PATCHKIT_BUMP_REF": target, "PATCHKIT_PYTHON": sys.executable}
    done = process.run_user(["sh", "-c", command], env=env, timeout=m.bump.timeout, cwd=m.root)
    tail = "\n".join(done.output.rstrip().splitlines()[-20:])
    return Probe(command, done.returncode, round(done.seconds, 1), tail)


def _message(result: BumpResult, version: str) -> str:
    lines = [f"Bump {result.label} from {result.from_ref} to {result.to_ref}", ""]
    lines += [f"- {s.id}: {s.action}" + (f" ({s.detail})" if s.detail else "")
              for s in result.steps if s.action != "skipped"]
    lines += ["", f"{TRAILER}: {result.package} {version}"]
    return "\n".join(lines)


def _last_line(exc: CommandError) -> str:
    lines = [ln.strip() for ln in exc.output.splitlines() if ln.strip()]
    return lines[-1] if lines else f"exit {exc.returncode}"


def exit_code(results: Sequence[BumpResult]) -> int:
    return EXIT_NEEDS_A_HAND if any(r.needs_a_hand for r in results) else 0


