"""export: commits made on top of an applied checkout become patches of the series.

``patchkit apply`` leaves ``patchkit/applied`` at the last patch; a developer commits fixes on
top and ``export`` turns each commit, oldest first, into ``patches/<id>.diff`` and a manifest
entry appended to ``patches:``.  The id comes from a ``Patchkit-Id:`` trailer, else from a
``patchkit: <id>: ...`` subject, else from the subject itself; the summary is the subject, and
an ``Upstream:`` trailer becomes ``upstream:``.  The diff text is pinned (see ``diffwrite``) and
an entry that is already there is updated in place, so exporting the same commits again
changes no byte.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from patchkit import git
from patchkit import interrupt, manifest
from patchkit.errors import UsageError
from patchkit.files import write_if_changed
from patchkit.manifest.edit import ManifestText
from patchkit.report import Word
from patchkit.series import checkout, intake

DIFF = intake.DIFF
PATCH_DIR = intake.PATCH_DIR
slug = intake.slug  # export's ids are the ones every new patch gets


class ExportAction(Word):
    """What an export did with one commit's patch."""

    ADDED = "added"            # a new entry and its diff
    UPDATED = "updated"        # an entry of an earlier export: its diff or summary changed
    UNCHANGED = "unchanged"    # an entry of an earlier export, written again byte for byte


@dataclass(frozen=True)
class Exported:
    id: str
    commit: str
    path: str
    summary: str
    action: ExportAction


@dataclass(frozen=True)
class ExportResult:
    exported: list[Exported] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return any(e.action is not ExportAction.UNCHANGED for e in self.exported)


def _commits(workdir: Path) -> list[git.CommitInfo]:
    if not checkout.has_applied_tag(workdir):
        raise UsageError(f"{workdir} has no tag {checkout.APPLIED_TAG}: it is not a checkout "
                         "`patchkit apply` made")
    merges = checkout.commits_after_series(workdir, merges_only=True)
    if merges:
        raise UsageError(f"{workdir}: merge commit {merges[-1][:12]} after "
                         f"{checkout.APPLIED_TAG}; export takes a straight line of commits "
                         "(rebase them first)")
    return [git.commit_info(workdir, sha) for sha in checkout.commits_after_series(workdir)]


def export(manifest_path: Path, workdir: Path) -> ExportResult:
    """Turn the commits after ``patchkit/applied`` in ``workdir`` (vLLM's checkout) and in each
    other package's checkout beside it (``.patchkit/flashinfer``) into patches of that package."""
    m = manifest.load(manifest_path)
    workdir = Path(workdir)
    places = {p.name: p.checkout(workdir) for p in m.packages}
    places = {name: place for name, place in places.items()
              if place == workdir or (place / ".git").exists()}
    if not (workdir / ".git").exists():
        if len(places) == 1:
            raise UsageError(f"--workdir {workdir}: not a checkout (run `patchkit apply` first)")
        del places[m.vllm.name]   # `apply --package` made the other packages' checkouts alone
    exported: list[Exported] = []
    notes: list[str] = []
    commits = {name: _commits(place) for name, place in places.items()}
    below: set[str] = set()
    for name, place in places.items():
        if git.has_uncommitted(place):
            notes.append(f"{place} has uncommitted changes; only commits are exported")
        report = checkout.read_report(place)
        applied = [p.id for p in report.patches] if report else []
        if applied and applied != [p.id for p in m.patches][:len(applied)]:
            notes.append(f"{place} was applied from another series than "
                         f"{m.path.name} holds now; the exported patches go at its end")
        below |= _applied_ids(place) | set(applied)
    text = ManifestText.read(m.path)
    claimed: set[str] = set()
    # the diffs and the manifest are written together: a signal waits for the end
    with interrupt.deferred(done=f"the export to {PATCH_DIR}/ and {m.path.name}"):
        new_entries: list[list[tuple[str, str]]] = []
        for name, place in places.items():
            new_entries += _export_commits(m, text, place, name, commits[name],
                                           (exported, notes), claimed, below)
        for entry in new_entries:
            text.append_item(("patches",), entry)
        text.write(m.path)
        manifest.load(m.path)  # what was written must load
        for name, place in places.items():
            if commits[name]:   # they are the series' now: apply may replace the checkout
                checkout.mark_exported(place, commits[name][-1].sha)
    return ExportResult(exported, notes)


def _export_commits(m, text: ManifestText, place: Path, package: str,
                    commits: list[git.CommitInfo], said: tuple[list[Exported], list[str]],
                    claimed: set[str], below: set[str]) -> list[list[tuple[str, str]]]:
    """Write each commit of ``package``'s checkout at ``place`` as its diff, each told in
    ``said`` (what was exported, the notes); the entries of the new ones, to append."""
    exported, notes = said
    taken = {p.id: p for p in m.patches}
    identity = m.package(package).id
    new_entries = []
    for c in commits:
        summary = intake.summary(c)
        diff = git.diff(place, f"{c.sha}~1", c.sha)
        if not diff.strip():
            notes.append(f"{c.sha[:12]} {summary!r} changes nothing; not exported")
            continue
        # an entry of an earlier export (its diff file, not in the applied series) is this
        # commit's own, and is updated in place
        pid = intake.free_id(intake.wanted_id(c), m, claimed | below, reuse=True,
                             package=identity)
        claimed.add(pid)
        rel = intake.diff_path(pid, identity)
        existing = taken.get(pid)
        (m.root / rel).parent.mkdir(parents=True, exist_ok=True)
        file_changed = write_if_changed(m.root / rel, diff.encode("utf-8", "surrogateescape"))
        if existing is not None:
            action = ExportAction.UPDATED if file_changed else ExportAction.UNCHANGED
            if existing.summary != summary and summary:
                text.set_scalar(("patches", existing.index, "summary"), summary)
                action = ExportAction.UPDATED
        else:
            new = intake.from_commit(c, pid, diff)
            new.package = identity
            new_entries.append(new.entry())
            action = ExportAction.ADDED
        exported.append(Exported(pid, c.sha, rel, summary, action))
    return new_entries


def _applied_ids(workdir: Path) -> set[str]:
    """Ids of the patches below ``patchkit/applied``: the series the checkout was made from."""
    return {m.group(1) for m in map(intake.OWN_SUBJECT.match, checkout.series_subjects(workdir))
            if m}


run = export
