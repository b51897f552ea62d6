"""New diff patches taken in from outside (``add-pr``, ``import``): proven first, then written.

A new patch is only text until it has been proven: the series with the new patches at its end
is applied at the pin in a scratch checkout (sparse: the files the series and the new diffs
touch), for the default build and each declared variant.  Only when every build applies are
``patches/<id>.diff`` and the manifest entries written, and a failure while writing puts
everything back, so the project is either as it was or has all of the new patches.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from patchkit import git
from patchkit import interrupt, kinds, manifest, source
from patchkit.errors import PatchkitError, UsageError
from patchkit.files import write_if_changed
from patchkit.manifest import ID_RE, VLLM, Manifest, Patch, capped_id, id_problem, shown_id
from patchkit.manifest.edit import ManifestText
from patchkit.run import RunSpec
from patchkit.manifest.variants import describe
from patchkit.report import ApplyReport, PatchResult, Status
from patchkit.series import applier

PATCH_DIR = "patches"
DIFF = "diff"  # the manifest key of the entries written here
OWN_SUBJECT = re.compile(r"^patchkit: ([a-z0-9][a-z0-9-]*): (.+)$")


class NotAppliedError(PatchkitError):
    """The new patches do not apply at the pin; nothing was written."""

    exit_code = 1


@dataclass
class NewPatch:
    """A diff patch to add at the end of the series."""

    id: str
    summary: str
    text: str
    upstream: str | None = None
    sha256: str | None = None
    source: str = ""     # where it came from, for messages (a URL, a commit)
    package: source.PackageId = VLLM  # the package it patches; its paths are from its root

    @property
    def path(self) -> str:
        return diff_path(self.id, self.package)

    def entry(self) -> list[tuple[str, str]]:
        out = [("id", self.id), ("summary", self.summary or self.id)]
        if not self.package.primary:   # a patch patches vLLM unless it says otherwise
            out.append(("package", self.package.name))
        if self.upstream:
            out.append(("upstream", self.upstream))
        out.append((DIFF, self.path))
        if self.sha256:
            out.append(("sha256", self.sha256))
        return out


def diff_path(pid: str, package: source.PackageId = VLLM) -> str:
    """Where a new diff patch goes: ``patches/<id>.diff``, another package's under its name
    (``patches/flashinfer/<id>.diff``)."""
    return f"{package.beside(PATCH_DIR)}/{pid}.diff"


# ------------------------------------------------------------------------------ commits

def summary(c: git.CommitInfo) -> str:
    """The summary a commit gives its patch: the subject, a ``patchkit: <id>: `` prefix taken
    off."""
    own = OWN_SUBJECT.match(c.subject.strip())
    return (own.group(2) if own else c.subject).strip()


def _trailer(c: git.CommitInfo, key: str) -> str | None:
    return next((v for k, v in c.trailers if k.lower() == key), None)


def claimed_id(c: git.CommitInfo) -> str | None:
    """A ``Patchkit-Id:`` trailer, else the id of a ``patchkit: <id>: ...`` subject."""
    own = OWN_SUBJECT.match(c.subject.strip())
    return _trailer(c, "patchkit-id") or (own.group(1) if own else None)


def upstream_of(c: git.CommitInfo) -> str | None:
    """An ``Upstream:`` trailer."""
    return _trailer(c, "upstream")


def slug(text: str, limit: int = 48) -> str:
    """A patch id from free text: lowercase words joined by '-', cut at a word boundary."""
    words = re.findall(r"[a-z0-9]+", text.lower())
    out = ""
    for w in words:
        nxt = f"{out}-{w}" if out else w
        if len(nxt) > limit:
            break
        out = nxt
    return out or (words[0][:limit] if words else "")


def wanted_id(c: git.CommitInfo) -> str:
    """The id a commit asks for: its own when it has a valid one, else a slug of its summary."""
    pid = claimed_id(c)
    if pid and ID_RE.match(pid):
        return capped_id(pid)
    return slug(summary(c)) or "patch"


def free_id(base: str, m: Manifest, unavailable: set[str], *, reuse: bool,
            package: source.PackageId = VLLM) -> str:
    """``base``, else ``base-2``, ``base-3`` ...: the first id no entry and no file under
    patches/ has (of ``package``).  With ``reuse``, an entry whose diff is that file counts as
    free: it is the same patch, written before, to be updated in place."""
    taken = {p.id: p for p in m.patches}
    pid, n = base, 1
    while True:
        if pid not in unavailable:
            existing = taken.get(pid)
            rel = diff_path(pid, package)
            if existing is None and not os.path.lexists(m.root / rel):
                return pid
            if reuse and existing is not None and existing.path == rel:  # only a diff is a .diff
                return pid
        n += 1
        pid = f"{capped_id(base, len(str(n)) + 1)}-{n}"


# ------------------------------------------------------------------------------ new patches

def from_commit(c: git.CommitInfo, pid: str, text: str) -> NewPatch:
    return NewPatch(pid, summary(c) or pid, text, upstream=upstream_of(c), source=c.sha)


def check_new_id(m: Manifest, patch_id: str, flag: str = "--id",
                 package: source.PackageId = VLLM) -> str:
    """``patch_id`` when it can name a new patch of ``package``: a valid id, not in the series,
    no file there."""
    problem = id_problem(patch_id)
    if problem:
        raise UsageError(f"{flag} {shown_id(patch_id)!r}: {problem}")
    for p in m.patches:
        if p.id == patch_id:
            raise UsageError(f"{flag} {patch_id}: the series has that id already "
                             f"({m.path.name}:{p.line}); give another with --id")
    rel = diff_path(patch_id, package)
    if os.path.lexists(m.root / rel):
        raise UsageError(f"{flag} {patch_id}: {rel} exists already and is no entry of the "
                         "series; remove it or give another id")
    return patch_id


def prove(m: Manifest, new: Sequence[NewPatch], run: RunSpec, *,
          progress: applier.Progress | None = None) -> list[ApplyReport]:
    """Apply the series with ``new`` at its end at the run's pins (vLLM's, and each package's
    the new patches patch), for the default build and each variant; NotAppliedError (exit 1)
    naming the first failure when one does not apply."""
    progress = progress or applier.Progress()
    with tempfile.TemporaryDirectory(prefix="patchkit-intake-") as tmp:
        candidate = _candidate(m, new, Path(tmp))
        for p in candidate.patches[len(m.patches):]:
            problem = kinds.get(DIFF).check(Path(p.path), p.path)
            if problem:
                raise NotAppliedError(f"{p.id}: {problem.replace(p.path, 'the diff')}; nothing "
                                      "was written")
        names = list(dict.fromkeys([VLLM.name, *(p.package.name for p in new)]))
        pins = applier.resolve_pins(run, run.cache, progress.info, None)  # every range is judged
        reports = []
        for n, variant in enumerate([None, *m.variants]):
            trees = {}
            try:
                for name in names:
                    tree = Path(tmp) / f"t{n}" / name
                    source.checkout(pins[name], tree, applier.needed_paths(candidate, name),
                                    scratch=True)
                    tops = applier.package_tops(pins[name], m.package(name).id)
                    trees[name] = applier.Tree(tree, pins[name], tops, keep=False,
                                               memo=run.cache, timeout=run.timeout)
                report = applier.run_stack(candidate, trees, variant=variant, pins=pins)
            finally:
                shutil.rmtree(Path(tmp) / f"t{n}", ignore_errors=True)
            if not report.ok:
                raise NotAppliedError(_failure(m, report, new, variant))
            reports.append(report)
        return reports


def _candidate(m: Manifest, new: Sequence[NewPatch], tmp: Path) -> Manifest:
    """The manifest with ``new`` at the end, their diffs in ``tmp`` (an absolute path joins
    the manifest's folder as itself)."""
    added = []
    for n, p in enumerate(new):
        file = tmp / f"{p.id}.diff"
        file.write_text(p.text, encoding="utf-8", errors="surrogateescape")
        added.append(Patch(id=p.id, summary=p.summary or p.id, kind=DIFF, path=str(file),
                           upstream=p.upstream, package=p.package.name, index=len(m.patches) + n))
    return dataclasses.replace(m, patches=(*m.patches, *added))


def _failure(m: Manifest, report: ApplyReport, new: Sequence[NewPatch],
             variant: str | None) -> str:
    new_ids = {p.id for p in new}
    failed: list[PatchResult] = [r for r in report.patches if r.status is Status.FAILED]
    first = next((r for r in failed if r.id in new_ids), failed[0] if failed else None)
    where = pin_label(report, m.package(first.package).id if first else new[0].package)
    if m.variants:
        where += f", {describe(variant)}"
    if first is None:
        bad = next(a for a in report.verify if not a.ok)
        return f"the series does not verify at {where}: {bad.failure_line()}; nothing was written"
    what = first.id if first.id in new_ids else f"the series ({first.id})"
    return f"{what} does not apply at {where}: {first.reason}: {first.message}; nothing was written"


def pin_label(report: ApplyReport, package: source.PackageId = VLLM) -> str:
    """A package's pin in a report as a message names it: ``vLLM v0.33.0 (1a2b3c4d5e6f)``,
    ``flashinfer v0.6.15 (...)``."""
    info = report.packages.get(package.name) or report.vllm
    return f"{package.label} {info.ref} ({info.commit[:12]})"


def write(m: Manifest, new: Sequence[NewPatch]) -> None:
    """Write each new diff and append its entry (only those lines are added to the manifest);
    on any failure put the manifest back and remove what was written.  A signal waits for the
    end: the files and the entry are written together or not at all."""
    names = ", ".join(p.path for p in new)
    with interrupt.deferred(done=f"{names} and {m.path.name} were written"):
        _write(m, new)


def _write(m: Manifest, new: Sequence[NewPatch]) -> None:
    text = ManifestText.read(m.path)
    text.append_items(("patches",), [p.entry() for p in new])
    before = m.path.read_bytes()
    made_dir = not (m.root / PATCH_DIR).exists()
    made_subdirs = {d for d in {(m.root / p.path).parent for p in new} if not d.exists()}
    written: list[Path] = []
    try:
        for p in new:
            file = m.root / p.path
            file.parent.mkdir(parents=True, exist_ok=True)
            write_if_changed(file, p.text.encode("utf-8", "surrogateescape"))
            written.append(file)
        text.write(m.path)
        manifest.load(m.path)  # what was written must load
    except BaseException:
        m.path.write_bytes(before)
        for file in written:
            file.unlink(missing_ok=True)
        for d in made_subdirs:
            shutil.rmtree(d, ignore_errors=True)
        if made_dir:
            shutil.rmtree(m.root / PATCH_DIR, ignore_errors=True)
        raise
