"""``patchkit verify``: the AST assertions, on an applied checkout or inside an image; with
``--log`` or ``--container``, also the runtime markers of the patches that are in, judged
against the server's logs."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, BinaryIO

from patchkit import paths
from patchkit.errors import ImageError, LogError, UsageError
from patchkit.engines.docker import Engine
from patchkit.manifest import VLLM, Manifest, Patch, variants
from patchkit.run import RunSpec, run_spec
from patchkit.report import AssertionResult, Word
from patchkit import jitrules
from patchkit.series import assertions, checkout
from patchkit.serving import runtime
from patchkit.serving.runtime import MarkerResult
from patchkit.timeouts import DEFAULT_TIMEOUT

if TYPE_CHECKING:  # the image modules are imported only when an image is looked at
    from patchkit.image.build import Holds

CHUNK = 64 * 1024   # bytes read from a log file at a time

# The exit code of a verify whose only open question is an acceptance floor the server has had
# no traffic to show yet (a launch checked at startup).  0 ok, 1 failed, 2 usage, 3 unexpected,
# 130/143 interrupted are the others; 4 is kept for "needs a hand".
NOT_YET_JUDGED = 5


class VerifyStatus(Word):
    """How a verify came out: a floor with no traffic yet is ``not yet judged`` (exit 5)."""

    OK = "ok"
    FAILED = "failed"
    PENDING = "not yet judged"


OK, FAILED, PENDING = VerifyStatus.OK, VerifyStatus.FAILED, VerifyStatus.PENDING


@dataclass(frozen=True)
class VerifyReport:
    target: str
    verify: list[AssertionResult]
    runtime: list[MarkerResult] | None = None   # None when no log was given
    logs: list[str] = field(default_factory=list)
    starts: list[runtime.Start] = field(default_factory=list)  # the start judged in each log
    holds: Holds | None = None                  # what the image holds, for --image
    notes: list[str] = field(default_factory=list)  # how the logs were read (lines cut)
    locked: list[str] | None = None             # --locked: how the image differs from the lock
    packages: list[PackageCheck] = field(default_factory=list)  # --image: each package checked
    require_traffic: bool = False   # a floor not yet judged fails instead of waiting
    # --image: where each JIT package keeps its JIT cache and its cubins there
    jit: dict[str, dict[str, str]] = field(default_factory=dict)
    evidence: object | None = None   # evidence.Kept: the runtime verdict recorded on the build
    evidence_said: list[str] = field(default_factory=list)   # what became of the evidence

    @property
    def assertions_ok(self) -> bool:
        return all(a.ok for a in self.verify)

    @property
    def waiting(self) -> list[MarkerResult]:
        """The acceptance floors not yet judged (no traffic served); none when traffic is
        required (``runtime.traffic_required`` made them failures)."""
        return [r for r in self.runtime or () if r.pending]

    @property
    def runtime_ok(self) -> bool:
        """No marker failed (those that may wait aside)."""
        waiting = self.waiting
        return all(r.ok or r in waiting for r in self.runtime or ())

    @property
    def status(self) -> VerifyStatus:
        if not (self.assertions_ok and self.runtime_ok) or self.locked:
            return FAILED
        return PENDING if self.waiting else OK

    @property
    def ok(self) -> bool:
        return self.status is OK

    @property
    def exit_code(self) -> int:
        return {OK: 0, FAILED: 1, PENDING: NOT_YET_JUDGED}[self.status]

    def to_dict(self) -> dict:
        out = {"ok": self.ok, "status": self.status, "target": self.target,
               "verify": [a.to_dict() for a in self.verify]}
        if self.runtime is not None:
            out["runtime"] = [r.to_dict() for r in self.runtime]
            out["starts"] = [s.to_dict() for s in self.starts]
        if self.holds is not None:
            out["holds"] = self.holds.to_dict()
        if self.notes:
            out["notes"] = self.notes
        if self.locked is not None:
            out["locked"] = {"ok": not self.locked, "differences": self.locked}
        if self.packages:
            out["packages"] = {p.name: p.to_dict() for p in self.packages}
        if self.jit:
            out["jit"] = self.jit
        if self.evidence is not None or self.evidence_said:
            out["evidence"] = {**(self.evidence.to_dict() if self.evidence else {}),
                               "said": self.evidence_said}
        return out


@dataclass(frozen=True)
class PackageCheck:
    """One package's assertions inside an image: where its files were read, and how they did."""

    name: str
    version: str | None
    site: str                  # the folder its paths are read from (its dist-info's, for
                               # packages other than vLLM)
    results: tuple[AssertionResult, ...]

    @property
    def passed(self) -> int:
        return sum(a.ok for a in self.results)

    def to_dict(self) -> dict:
        return {"version": self.version, "site": self.site, "assertions": len(self.results),
                "passed": self.passed}


@dataclass
class _Checked:
    """The assertions' results on a tree or image, and what it says of the patches in it."""

    results: list[AssertionResult]
    statuses: Mapping[str, str]     # patch id -> status, from the report or the labels
    version: str | None
    variant: str | None
    holds: Holds | None = None
    trees: list[Path] = field(default_factory=list)   # the checkouts a tree's check read
    locked: list[str] | None = None
    packages: list[PackageCheck] = field(default_factory=list)
    jit: dict[str, dict[str, str]] = field(default_factory=dict)


def active_patches(manifest: Manifest, skipped: set[str], version: str | None,
                   variant: str | None = None,
                   found: Mapping[str, str | None] | None = None) -> list[Patch]:
    """The patches whose assertions apply: in the build of ``variant``, neither skipped by the
    apply nor outside the ranges of the releases ``found`` (package name -> version; default:
    vLLM's ``version``, when one was found)."""
    found = {n: v for n, v in (found or {VLLM.name: version}).items() if v}
    return [p for p in variants.selected(manifest, variant)
            if p.id not in skipped and p.takes_effect(found)[0]]


def built_variant(manifest: Manifest, asked: str | None, recorded: str | None, known: bool,
                  what: str) -> str | None:
    """The variant to verify: the one ``what`` was built as when that is ``known`` (asking for
    another is a usage error), else the one asked for."""
    variants.check(manifest, asked)
    if not known:
        return asked
    if asked is not None and asked != recorded:
        raise UsageError(f"--variant {asked}: {what} was built as "
                         f"{variants.describe(recorded)}; verify it as that (drop --variant"
                         + (f" or give --variant {recorded})" if recorded else ")"))
    return recorded


def verify_tree(manifest: Manifest, tree: Path, variant: str | None = None
                ) -> list[AssertionResult]:
    """The manifest's assertions on a patched tree, leaving out patches the tree's release is
    outside of and those of other variants (known from the apply report, when the tree has
    one)."""
    return _check_tree(manifest, tree, variant).results


def package_trees(manifest: Manifest, tree: Path,
                  packages: Sequence[str] | None = None) -> dict[str, Path]:
    """Where apply put each package (of ``packages``, default all): vLLM at ``tree``, every
    other package beside it under its name."""
    return {p.name: p.checkout(tree) for p in manifest.packages
            if packages is None or p.name in packages}


def _check_tree(manifest: Manifest, tree: Path, variant: str | None,
                version: str | None = None, packages: Sequence[str] | None = None) -> _Checked:
    """Each package's assertions on its checkout (``tree`` for vLLM, the others beside it).
    ``version``, when given, judges vLLM's ranges instead of the tree's own release."""
    trees = package_trees(manifest, tree, packages)
    first = next(iter(trees.values()))
    if not first.is_dir():
        raise UsageError(f"--tree {first}: no such directory")
    report = checkout.read_report(first)
    variant = built_variant(manifest, variant, report.variant if report else None,
                            report is not None, f"--tree {first}")
    found: dict[str, str | None] = {n: p.version for n, p in report.packages.items()} if report \
        else {}
    found[VLLM.name] = version or (report.vllm.version if report else None)
    results: list[AssertionResult] = []
    statuses: dict[str, str] = {}
    checked: list[Path] = []
    for name, path in trees.items():
        own = report if path == first else checkout.read_report(path)
        mine = [p for p in active_patches(manifest, own.skipped() if own else set(), None,
                                          variant, found) if p.package == name]
        if not mine:
            continue
        if not path.is_dir():
            raise UsageError(f"{name} has {len(mine)} patch{'es' if len(mine) > 1 else ''} with "
                             f"assertions but no checkout at {path}; run 'patchkit apply'")
        if own is None:
            _check_is_checkout(path, manifest.package(name).label, mine, first)
        results += assertions.run_assertions(mine, assertions.tree_reader(path))
        checked.append(path)
        statuses.update({p.id: p.status for p in own.patches if p.package == name} if own
                        else {})
    return _Checked(results, statuses, found[VLLM.name], variant, trees=checked)


def _check_is_checkout(path: Path, label: str, patches: Sequence[Patch], first: Path) -> None:
    """A tree patchkit did not make must hold at least one file the assertions read, else it
    is no checkout of the package at all: one line, not a "no such file" per assertion."""
    files = sorted({a.file for p in patches for a in p.verify})
    if not files or any((path / f).is_file() for f in files):
        return
    what = "--tree" if path == first else f"{label}'s checkout"
    shown = ", ".join(files[:3]) + (f" and {len(files) - 3} more" if len(files) > 3 else "")
    raise UsageError(f"{what} {path}: no {label} checkout there (no "
                     f"apply report, and none of the {len(files)} files the assertions read: "
                     f"{shown})")


def verify_image(manifest: Manifest, image: str, *, engine: Engine | None = None,
                 variant: str | None = None) -> list[AssertionResult]:
    """The manifest's assertions on the files inside ``image``, read without running it."""
    spec = run_spec(manifest, variant=variant,
                    engine=engine or Engine.connect(timeout=DEFAULT_TIMEOUT))
    return _check_image(manifest, image, spec).results


def _image_attrs(engine, image: str, platform):
    """What the engine says of ``image``, pulled for ``platform`` when it is missing."""
    from patchkit.errors import Origin
    from patchkit.imageref import check_reference

    check_reference(Origin("image"), image)
    held = engine.inspect(image)
    if held is None:
        engine.resolve_base(image, platform, what="image")
        held = engine.inspect(image)
    if held is None:
        raise ImageError(f"image {image} not found on the engine at {engine.host}")
    return held


def _check_image(manifest: Manifest, image: str, run: RunSpec, *, lock=None,
                 workdir: Path | None = None) -> _Checked:
    """Each package's assertions on the files ``image`` holds: vLLM's where its package is,
    every other package's at the site its ``dist`` is installed in (its dist-info); ranges are
    judged on the versions installed there.  The run's packages (``--package``) limit them."""
    from patchkit.image import package
    from patchkit.engines.facts import fingerprint
    from patchkit.image.build import Holds
    from patchkit.image.labels import ImageFacts

    engine = run.the_engine(f"image {image}")
    held = _image_attrs(engine, image, run.platform)
    facts = ImageFacts.from_labels(held.labels)
    variant = built_variant(manifest, run.variant, facts.variant, facts.variant_known,
                            f"image {image}")
    env = held.env
    with engine.files(held.id, image) as files:
        hinted = facts.vllm_dir
        if hinted and files.exists(hinted.rstrip("/") + "/__init__.py"):
            pkg = package.Package(str(PurePosixPath(hinted).parent), None)
        else:
            pkg = package.find_package(files, env)
        version = facts.installed or package.installed_version(files, pkg, None)
        # where ids are not config digests only an export of the whole image would tell it
        holds = Holds.of(version, facts.source,
                         fingerprint(engine.content(held.id))
                         if engine.store().ids_are_config_digests else None,
                         facts.commit, facts.created)
        installed = _installed(manifest, files, env, lock)
        locked = _stack_checks(manifest, installed, facts, lock, image)
        sites = _image_sites(manifest, installed, pkg.site, version)
        found = {name: v for name, (_, v) in sites.items()}
        active = active_patches(manifest, facts.skipped(), version, variant, found)
        checks = _package_checks(manifest, image, files, sites, active, installed, run.only)
        proofs = _artifact_proofs([p for p in active if p.artifact is not None], files, env,
                                  image)
        judged = [p for p in active if run.in_run(p.package)]
        compiled, jit = _jit_proofs(manifest, files, installed, judged, facts, held, image,
                                    workdir)
        # a manifest of vLLM alone reports as it always has: one package needs no naming
        return _Checked([a for c in checks for a in c.results] + proofs + compiled,
                        facts.statuses, version, variant, holds=holds, locked=locked,
                        packages=checks if manifest.others else [], jit=jit)


def _package_checks(manifest: Manifest, image: str, files, sites, active: Sequence[Patch],
                    installed, packages: Sequence[str] | None) -> list[PackageCheck]:
    """Each package's active assertions read at its site in the image (of ``packages``,
    default all); a package with assertions whose dist the image lacks is one line."""
    checks = []
    for name, (site, pversion) in sites.items():
        mine = [p for p in active if p.package == name]
        if packages is not None and name not in packages or not mine and site is None:
            continue
        if site is None:
            dist = manifest.package(name).dist
            raise ImageError(f"image {image} has no {dist} installed "
                             f"({installed.missing(dist)}); {name} has {len(mine)} "
                             f"patch{'es' if len(mine) > 1 else ''} with assertions")
        results = assertions.run_assertions(mine, _image_reader(files, site))
        checks.append(PackageCheck(name, pversion, site, tuple(results)))
    return checks


def _artifact_proofs(patches: Sequence[Patch], files, env: dict[str, str], image: str
                     ) -> list[AssertionResult]:
    """Each artifact's member in the image, where its dist is installed, proven by its
    pinned sha256: one result per artifact, as assertions report."""
    if not patches:
        return []
    import hashlib

    from patchkit.image import distinfo

    installed = distinfo.installed(files, env)
    out = []
    for patch in patches:
        a = patch.artifact
        assert a is not None
        dist = installed.get(a.dist)
        where = f"{dist.site.rstrip('/')}/{a.member}" if dist is not None else a.member
        data = files.read(where) if dist is not None else None
        if dist is None:
            ok, message = False, f"image {image} has no {a.dist} installed"
        elif data is None:
            ok, message = False, f"{where} is not in image {image}"
        else:
            got = hashlib.sha256(data).hexdigest()
            ok = got == a.member_sha256
            message = (f"{where} has the pinned sha256 {got[:12]}" if ok else
                       f"{where} has sha256 {got[:12]}, the artifact pins {a.member_sha256[:12]}")
        out.append(AssertionResult(patch.id, a.member, None, None, ok, message))
    return out


def _jit_proofs(manifest: Manifest, files, installed, active: Sequence[Patch], facts, held,
                image: str, workdir: Path | None
                ) -> tuple[list[AssertionResult], dict[str, dict[str, str]]]:
    """Each JIT module a patched file feeds, judged in the image: a result that fails where a
    prebuilt module would still load in its place, naming both; and where each such package
    keeps its JIT cache and cubins there."""
    from patchkit.image import prebuilt

    if installed is None:
        return [], {}
    env = held.env
    wanted, modules, owners, places = {}, {}, {}, {}
    for package in manifest.others:
        mine = [p for p in active if p.package == package.name]
        if not mine or installed.get(package.dist) is None or not jitrules.rules_for(package.dist):
            continue
        owners.update({(package.name, f): p.id for p in mine for f in _touched(manifest, p)})
        fed = _fed(package, files, installed, mine, facts, workdir, manifest)
        where = prebuilt.places(files, installed, env, held.config.get("User"), package.dist)
        if where is not None:
            places[package.name] = where.to_dict()
        if fed:
            wanted[package.name] = (package.dist, manifest.image.cuda_arch)
            modules[package.name] = fed
    shipped = {(p.artifact.dist, p.artifact.member) for p in active if p.artifact is not None}
    found, _ = prebuilt.prove(files, installed, env, wanted, modules, image, shipped)
    return [AssertionResult(owners.get((p.package, p.file), p.package), p.file, None, None, p.ok,
                            p.message(image)) for p in found], places


def _touched(manifest: Manifest, patch: Patch) -> list[str]:
    from patchkit import kinds

    try:
        return kinds.get(patch.kind).touched(manifest.root / patch.path)
    except kinds.KindError:
        return []


def _fed(package, files, installed, mine: Sequence[Patch], facts, workdir: Path | None,
         manifest: Manifest) -> dict[str, list[str]]:
    """The JIT modules each patched file of ``package`` feeds in the image: as its labels
    record them (an image patchkit built), else as the applied checkout's report does, else
    read from the package as the image holds it."""
    if facts.jit_modules is not None:
        return facts.jit_modules.get(package.name, {})
    for path in ([workdir, package.checkout(workdir)] if workdir is not None else []):
        report = checkout.read_report(path) if path.is_dir() else None
        if report is not None and package.name in report.jit_modules:
            return report.jit_modules[package.name]
    import tempfile

    from patchkit.image import prebuilt

    paths = sorted({f for p in mine for f in _touched(manifest, p)})
    if not paths:
        return {}
    with tempfile.TemporaryDirectory(prefix="patchkit-jit-") as scratch:
        return prebuilt.modules_in_image(files, installed.get(package.dist).site, package.dist,
                                         paths, scratch)


def _image_reader(files, site: str):
    """An assertion reader over the image's files, paths taken from ``site``."""
    cache: dict[str, str | None] = {}

    def read(rel: str) -> str | None:
        paths.check_relative(rel)
        if rel not in cache:
            data = files.read(site.rstrip("/") + "/" + rel)
            cache[rel] = None if data is None else data.decode("utf-8")
        return cache[rel]

    return read


def _installed(manifest: Manifest, files, env: dict[str, str], lock):
    """The image's installed distributions (its dist-info), when anything needs them: another
    package (its site, and its version for the ranges), ``image.requires`` or the lock.  None
    when nothing does."""
    from patchkit.image import distinfo

    if lock is None and not manifest.image.requires and not manifest.others:
        return None
    return distinfo.installed(files, env)


def _image_sites(manifest: Manifest, installed, vllm_site: str, vllm_version: str | None
                 ) -> dict[str, tuple[str | None, str | None]]:
    """Each package -> (the site its files are read from, its installed version); a package
    whose ``dist`` the image lacks (or whose dist-info were not read) has neither."""
    out: dict[str, tuple[str | None, str | None]] = {VLLM.name: (vllm_site, vllm_version)}
    for p in manifest.others:
        dist = installed.get(p.dist) if installed is not None else None
        out[p.name] = (dist.site, dist.version) if dist else (None, None)
    return out


def _stack_checks(manifest: Manifest, installed, facts, lock, image: str) -> list[str] | None:
    """``image.requires`` on the image's installed distributions (else one line, exit 1); with
    ``lock``, how the image's stack differs from it."""
    from patchkit.image import lockfile

    if installed is None:
        return None
    problems = lockfile.requires_problems(manifest, installed, image, what="image")
    if problems:
        raise ImageError("; ".join(problems))
    if lock is None:
        return None
    found = lockfile.base_differences(lock, facts.base_digest or "(not recorded)",
                                   installed.versions())
    if facts.packages is None:
        return [*found, f"the labels of {image} do not record its packages' versions and "
                        "commits (it was not built by this patchkit)"]
    pinned = {name: lockfile.Pinned(p.get("version", ""), p.get("commit", ""), p.get("source", ""))
              for name, p in facts.packages.items()}
    return found + lockfile.package_differences(lock, pinned)


@dataclass(frozen=True)
class Request:
    """What verify is asked: a tree or an image, the logs and containers whose runtime markers
    to judge, and the options the run value is made of."""

    default_tree: Path
    tree: Path | None = None
    image: str | None = None
    base: str | None = None
    variant: str | None = None
    logs: tuple[str, ...] = ()
    containers: tuple[str, ...] = ()
    packages: Sequence[str] = ()
    locked: bool = False
    require_traffic: bool = False
    timeout: float = DEFAULT_TIMEOUT
    engine: Engine | None = None   # an engine handed in (else one is connected when needed)
    build: str | None = None       # the build the logs' server ran (else a container's)
    node: str | None = None        # the engine holding --build (else DOCKER_HOST's)

    def check(self) -> None:
        if self.tree and self.image:
            raise UsageError("give --tree or --image, not both")
        if self.node and not self.build:
            raise UsageError("--node goes with --build: the engine that holds the build")
        if self.build and not (self.logs or self.containers):
            raise UsageError("--build goes with --log or --container: the server's verdict is "
                             "what is recorded against it")
        if self.locked and not self.image:
            raise UsageError("--locked goes with --image: it compares an image's stack with "
                             "the lock")
        if self.image and self.base:
            raise UsageError("--base goes with --tree: an image's own files say what it holds")


def run(manifest: Manifest, request: Request, *, stdin=None,
        log=lambda m: None) -> VerifyReport:
    """The assertions on the tree or the image; with logs (paths, ``-`` for ``stdin``) or
    containers (names or ids on the engine), the runtime markers too.  A log that cannot be
    had stops the command before anything is checked.  ``base`` (with a tree): judge the
    patches' ranges on the vLLM that base image holds, the one the tree is to be laid on.
    ``timeout`` bounds each silence of the engine, connected once.  With a tree, each
    package's assertions are checked on its checkout beside the tree; ``packages``
    (``--package``) limits them.  With an image, each package's assertions are read at the
    site its ``dist`` is installed in there.  ``locked`` (with an image): also say how the
    stack it was built on differs from ``patchset.lock``.  ``require_traffic``: an acceptance
    floor the logs hold no spec-decode metrics line for fails, instead of being not yet judged
    (exit 5)."""
    r = request
    r.check()
    named = _named_build(r)   # before anything is judged: a --build naming no image is exit 2
    lock = None
    if r.locked:
        from patchkit.image.lockfile import read_lock

        lock = read_lock(manifest)
    variants.check(manifest, r.variant)
    engine = r.engine or (Engine.connect(timeout=r.timeout)
                          if r.image or r.base or r.containers else None)
    spec = run_spec(manifest, variant=r.variant, only=r.packages, timeout=r.timeout,
                    base=r.base, engine=engine)
    version = _base_version(spec, log) if r.base else None
    with _Logs(r.logs, r.containers, stdin=stdin, engine=engine) as sources:
        if r.image:
            target, checked = r.image, _check_image(manifest, r.image, spec, lock=lock,
                                                    workdir=r.default_tree)
        else:
            target = str(r.tree or r.default_tree)
            checked = _check_tree(manifest, Path(target), r.variant, version, spec.only)
            if len(checked.trees) > 1:   # vLLM's and the checkouts beside it
                target = " and ".join(str(t) for t in checked.trees)
        report = VerifyReport(target, checked.results, holds=checked.holds,
                              locked=checked.locked, packages=checked.packages,
                              require_traffic=r.require_traffic, jit=checked.jit,
                              **_judged(manifest, r, sources, checked))
    if report.runtime is not None:   # the verdict made, then recorded against the build
        report = replace(report, **_record(report, r, engine, named))
    return report


def _judged(manifest: Manifest, r: Request, sources: _Logs, checked) -> dict:
    """What the logs say, as the report's fields: the markers judged, the start in each log,
    the logs' names and how they were read; nothing when no log was given."""
    if not sources.logs:
        return {}
    judgment = sources.judge(manifest, checked)
    results = judgment.results
    if r.require_traffic:
        results = [runtime.traffic_required(m) for m in results]
    return {"runtime": results, "starts": judgment.starts, "logs": sources.names,
            "notes": sources.notes() + [n for n in map(runtime.Start.note, judgment.starts)
                                        if n]}


def _named_build(r: Request):
    from patchkit.nodes import evidence

    if not r.build:
        return None
    build, held = evidence.which(r.node, None, r.build,
                                 lambda url: Engine.connect(url, timeout=r.timeout))
    held.close()
    return build


def _record(report: VerifyReport, r: Request, engine, named) -> dict:
    """The runtime verdict recorded against the build the server ran: ``--build``, else the
    first container's image; not yet judged, or unknown, records nothing (and says so).
    Returns the report's fields it gives: the evidence kept and what became of it."""
    import time

    from patchkit.nodes import evidence

    if named is not None:
        build = named
    elif r.containers and engine is not None:
        build = evidence.of_container(engine, r.containers[0]) if _running(
            engine, r.containers[0]) else None
        if build is None:
            return {"evidence_said": [f"evidence: --container {r.containers[0]} is not "
                                      "running: nothing recorded (--build TAG names the "
                                      "build)"]}
    else:
        return {"evidence_said": [evidence.UNKNOWN]}
    if report.status is PENDING:
        return {"evidence_said": ["evidence: not yet judged (no traffic served): nothing "
                                  "recorded"]}
    verdicts = [evidence.Verdict("assertions", "ok" if report.assertions_ok else "failed",
                                 f"{sum(a.ok for a in report.verify)} of {len(report.verify)} "
                                 "assertions hold")]
    verdicts += [evidence.Verdict(f"runtime {m.patch or '(patchset)'}",
                                  "ok" if m.ok else "failed", m.message)
                 for m in report.runtime or ()]
    accepted = next((m.acceptance.rate for m in report.runtime or ()
                     if m.acceptance is not None and m.acceptance.rate is not None), None)
    record = evidence.Record("verify", build.image_id, build.tag, build.node, time.time(),
                             report.ok, tuple(verdicts), build.patchset, acceptance=accepted)
    kept = evidence.Store(timeout=r.timeout).record(record, build)
    return {"evidence": kept, "evidence_said": list(kept.lines(build))}


def _running(engine, name: str) -> bool:
    found = engine.container_image(name)
    return found is not None and found[1] == "running"


def _base_version(run: RunSpec, log) -> str | None:
    from patchkit.image import base as base_
    from patchkit.image import basevllm

    with base_.opened(run.the_engine("the base"), run.the_base("the base"), run.platform,
                      log) as held:
        return basevllm.vllm_of(held, log).version


class _Logs:
    """The logs to judge, each checked to be there when the command starts: files (``-`` is
    stdin) and containers' logs through the image border.  Read once, while judging."""

    def __init__(self, paths_: tuple[str, ...], containers: tuple[str, ...], *,
                 stdin: BinaryIO | None, engine=None) -> None:
        self.engine = engine
        self.logs: list[runtime.Log] = []
        self._open: list[BinaryIO] = []
        try:
            self._add_files(paths_, stdin)
            self._add_containers(containers)
        except BaseException:
            self.close()
            raise

    @property
    def names(self) -> list[str]:
        return [log.name for log in self.logs]

    def _add_files(self, paths_: tuple[str, ...], stdin: BinaryIO | None) -> None:
        if list(paths_).count("-") > 1:
            raise LogError("--log -: standard input can be read only once; give it once")
        for path in paths_:
            if path == "-":
                if stdin is None:
                    raise LogError("--log -: no standard input to read")
                self.logs.append(runtime.Log("<stdin>", runtime.LogLines(
                    _file_chunks(stdin, "--log -"), "--log -")))
                continue
            try:
                fh = open(path, "rb")
            except FileNotFoundError:
                raise LogError(f"--log {path}: no such file") from None
            except IsADirectoryError:
                raise LogError(f"--log {path}: is a directory, not a log file") from None
            except OSError as exc:
                raise LogError(f"--log {path}: cannot read: {exc.strerror}") from None
            self._open.append(fh)
            self.logs.append(runtime.Log(path, runtime.LogLines(
                _file_chunks(fh, f"--log {path}"), f"--log {path}")))

    def _add_containers(self, containers: tuple[str, ...]) -> None:
        for name in containers:
            try:
                chunks = self.engine.container_log(name)
            except ImageError as exc:
                raise LogError(f"--container {name}: {exc}") from exc
            if chunks is None:
                raise LogError(f"--container {name}: no such container on the engine at "
                               f"{self.engine.host}")
            what = f"--container {name}"
            self.logs.append(runtime.Log(f"container:{name}",
                                         runtime.LogLines(_engine_chunks(chunks, what), what)))

    def judge(self, manifest: Manifest, checked: _Checked) -> runtime.Judgment:
        """The markers of the patches in the build ``checked`` looked at, on the last start of
        every log."""
        built = {p.id for p in variants.selected(manifest, checked.variant)}
        ids = runtime.patches_in(manifest, checked.statuses, checked.version) & built
        return runtime.assess(runtime.markers_of(manifest, ids), self.logs)

    def notes(self) -> list[str]:
        """After judging: a note for each log with lines cut to the bound."""
        notes = (log.lines.note(log.name) for log in self.logs
                 if isinstance(log.lines, runtime.LogLines))
        return [n for n in notes if n]

    def close(self) -> None:
        for fh in self._open:
            fh.close()
        self._open = []

    def __enter__(self) -> _Logs:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _file_chunks(stream: BinaryIO, what: str) -> Iterator[bytes]:
    try:
        while chunk := stream.read(CHUNK):
            yield chunk
    except OSError as exc:
        raise LogError(f"{what}: cannot read: {exc.strerror or exc}") from None


def _engine_chunks(chunks: Iterable[bytes], what: str) -> Iterator[bytes]:
    try:
        yield from chunks
    except ImageError as exc:
        raise LogError(f"{what}: {exc}") from exc
