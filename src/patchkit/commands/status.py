"""``patchkit status``: what each package's checkout holds, as ``git status`` and ``quilt
applied`` say it.

For each package of the manifest: whether its checkout is there, the pin, version and commit
it was made from, the variant, each patch's fate at that apply, the work a person did in it
since (commits not yet exported, changed and untracked files), and what changed in the
manifest since (patches added, edited, removed; the pin moved; a setting outside ``patches:``
changed, said once for the manifest).  Each patch is compared on what it is (its entry and
its files, ``manifest/digest.py``), never on where it stands in patchset.yaml.  It reads,
never writes."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

from patchkit import manifest as manifest_
from patchkit.errors import UsageError
from patchkit.manifest import Manifest, digest, discovery
from patchkit.report import Status
from patchkit.report import ApplyReport
from patchkit.series import checkout



@dataclass
class ManifestChanges:
    """How the manifest's patches of one package differ from those the checkout was made
    from.  ``edited`` is None when the checkout's report predates patch digests."""

    added: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    edited: list[str] | None = field(default_factory=list)
    pin: tuple[str, str] | None = None   # (the checkout's ref, the manifest's ref) when moved

    def __bool__(self) -> bool:
        return bool(self.added or self.removed or self.edited or self.pin)


@dataclass
class PackageStatus:
    name: str
    workdir: Path
    applied: bool                      # an applied checkout is there
    report: ApplyReport | None = None
    work: checkout.UserWork = field(default_factory=checkout.UserWork)
    changes: ManifestChanges = field(default_factory=ManifestChanges)
    patches: dict[str, list[str]] = field(default_factory=dict)   # status -> ids, series order
    remedies: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        info = self.report.packages.get(self.name) if self.report else None
        pin = info if info is not None else (self.report.vllm if self.report else None)
        return {"name": self.name, "workdir": str(self.workdir), "applied": self.applied,
                "ref": pin.ref if pin else None, "commit": pin.commit if pin else None,
                "version": pin.version if pin else None,
                "variant": self.report.variant if self.report else None,
                "patches": self.patches,
                "work": {k: v for k, v in asdict(self.work).items()} if self.applied else None,
                "manifest_changes": ({"added": self.changes.added,
                                      "removed": self.changes.removed,
                                      "edited": self.changes.edited,
                                      "pin": list(self.changes.pin) if self.changes.pin
                                      else None} if self.applied else None),
                "advice": self.remedies}


@dataclass
class ProjectStatus:
    manifest: Path
    name: str
    packages: list[PackageStatus]
    # the settings outside `patches:` that changed since the apply (`name`, `bump.probes`),
    # as patchset.yaml names them; None when no checkout's report records them
    settings: list[str] | None = None

    def to_dict(self) -> dict:
        return {"ok": True, "manifest": str(self.manifest), "name": self.name,
                "settings_changed": self.settings,
                "packages": [p.to_dict() for p in self.packages]}


def run(manifest_path: Path | None, workdir: Path | None) -> ProjectStatus:
    """The status of every package's checkout: vLLM's at ``workdir`` (default: the project's
    ``.patchkit/vllm``), each other package's beside it under its name."""
    if manifest_path is None:
        found = discovery.find()
        if found is None:
            raise UsageError("not inside a patchset project (no patchset.yaml here or in any "
                             "folder above); cd into one, or give --manifest")
        manifest_path = Path(discovery.shown(found))
    m = manifest_.load(manifest_path)
    workdir = Path(workdir) if workdir is not None else m.root / discovery.WORKDIR
    places = {p.name: p.checkout(workdir) for p in m.packages}
    packages = [_package(m, name, place) for name, place in places.items()]
    return ProjectStatus(manifest_path, m.name, packages, _settings(m, packages))


def _settings(m: Manifest, packages: list[PackageStatus]) -> list[str] | None:
    """The settings outside ``patches:`` that differ from those of the first applied
    checkout that recorded them."""
    then = next((p.report.settings for p in packages
                 if p.report is not None and p.report.settings), None)
    if then is None:
        return None
    now = digest.settings(m)
    return [k for k in sorted(set(now) | set(then)) if now.get(k) != then.get(k)]


def _package(m: Manifest, name: str, place: Path) -> PackageStatus:
    if not checkout.is_checkout(place):
        what = "is not a patchkit checkout" if place.exists() else "is not there"
        return PackageStatus(name, place, False,
                             remedies=[f"{place} {what}; run 'patchkit apply'"])
    report = checkout.read_report(place)
    if report is None:
        return PackageStatus(name, place, False,
                             remedies=[f"{place} holds no readable apply report; run "
                                       "'patchkit apply --discard'"])
    own = [r for r in report.patches if r.package == name]
    patches = {str(s): [r.id for r in own if r.status is s] for s in Status}
    work = checkout.user_work(place)
    changes = _changes(m, name, report)
    remedies = work.remedies(place)
    if changes:
        remedies.append("run 'patchkit apply' to rebuild the checkout from the manifest"
                        + (" (export or discard the work first)" if work else ""))
    return PackageStatus(name, place, True, report, work, changes, patches, remedies)


def _changes(m: Manifest, name: str, report: ApplyReport) -> ManifestChanges:
    now = [p for p in m.patches if p.package == name]
    then = [r.id for r in report.patches if r.package == name]
    ids = {p.id for p in now}
    out = ManifestChanges(added=[p.id for p in now if p.id not in then],
                          removed=[i for i in then if i not in ids])
    if report.digests and all(d.startswith(digest.SCHEME) for d in report.digests.values()):
        current = digest.digests(m, [p for p in now if p.id in then])
        out.edited = [i for i, d in current.items() if report.digests.get(i) != d]
    else:
        out.edited = None
    pin = report.packages.get(name) or (report.vllm if m.package(name).id.primary else None)
    wanted = m.package(name).ref
    if pin is not None and pin.ref != wanted:
        out.pin = (pin.ref, wanted)
    return out
