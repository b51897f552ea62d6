"""``patchkit verify``: the AST assertions alone, on an applied checkout or inside an image."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

from patchkit import paths, versions
from patchkit.errors import ImageError, UsageError
from patchkit.manifest import Manifest, Patch, variants
from patchkit.report import AssertionResult
from patchkit.series import checkout, verify

if TYPE_CHECKING:  # the image modules are imported only when an image is looked at
    from patchkit.image.build import Holds


@dataclass
class VerifyReport:
    target: str
    verify: list[AssertionResult]
    holds: Holds | None = None    # what the image holds, for --image

    @property
    def ok(self) -> bool:
        return all(a.ok for a in self.verify)

    def to_dict(self) -> dict:
        data = {"ok": self.ok, "target": self.target,
                "verify": [a.to_dict() for a in self.verify]}
        if self.holds is not None:
            data["holds"] = self.holds.to_dict()
        return data


def active_patches(manifest: Manifest, skipped: set[str], version: str | None,
                   variant: str | None = None) -> list[Patch]:
    """The patches whose assertions apply: in the build of ``variant``, neither skipped by the
    apply nor outside the range of the release found (when one was found)."""
    return [p for p in variants.selected(manifest, variant)
            if p.id not in skipped and (not version or versions.in_range(p.vllm, version)[0])]


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


def verify_tree(manifest: Manifest, tree: Path, variant: str | None = None,
                version: str | None = None) -> list[AssertionResult]:
    """The manifest's assertions on a patched tree, leaving out patches the tree's release is
    outside of and those of other variants (known from the apply report, when the tree has
    one; ``version`` instead of the tree's release when given)."""
    if not tree.is_dir():
        raise UsageError(f"--tree {tree}: no such directory")
    report = checkout.read_report(tree)
    variant = built_variant(manifest, variant, report.variant if report else None,
                            report is not None, f"--tree {tree}")
    version = version or (report.vllm.version if report else None)
    skipped = report.skipped() if report else set()
    return verify.run_assertions(active_patches(manifest, skipped, version, variant),
                                 verify.tree_reader(tree))


def verify_image(manifest: Manifest, image: str, *, engine=None, variant: str | None = None
                 ) -> list[AssertionResult]:
    """The manifest's assertions on the files inside ``image``, read without running it."""
    return check_image(manifest, image, engine=engine, variant=variant)[0]


def check_image(manifest: Manifest, image: str, *, engine=None, variant: str | None = None):
    """The assertions on the files inside ``image``, and what it holds (image.build.Holds)."""
    from patchkit.image import layer, package
    from patchkit.image.build import Holds, ImageFacts
    from patchkit.image.engine import Engine
    from patchkit.imageref import Platform, check_reference

    check_reference("--image", image)
    engine = engine or Engine.connect()
    attrs = engine.inspect(image)
    if attrs is None:
        plat = Platform.parse(manifest.image.platform or "linux/arm64")
        try:
            engine.resolve_base(image, plat)
        except ImageError as exc:
            raise ImageError(str(exc).replace("base image ", "image ", 1)) from exc
        attrs = engine.inspect(image)
    if attrs is None:
        raise ImageError(f"image {image} not found on the engine at {engine.host}")
    config = attrs.get("Config") or {}
    facts = ImageFacts.from_labels(config.get("Labels") or {})
    variant = built_variant(manifest, variant, facts.variant, facts.variant_known,
                            f"image {image}")
    env = dict(item.partition("=")[::2] for item in config.get("Env") or ())
    with engine.files(attrs["Id"], image) as files:
        hinted = facts.vllm_dir
        if hinted and files.exists(hinted.rstrip("/") + "/__init__.py"):
            pkg = package.Package(str(PurePosixPath(hinted).parent), None)
        else:
            pkg = package.find_package(files, env)
        version = facts.installed or package.installed_version(files, pkg, None)
        holds = Holds.of(version, facts.source, layer.fingerprint(attrs))
        active = active_patches(manifest, facts.skipped(), version, variant)
        cache: dict[str, str | None] = {}

        def read(rel: str) -> str | None:
            paths.check_relative(rel)
            if rel not in cache:
                data = files.read(pkg.path_of(rel))
                cache[rel] = None if data is None else data.decode("utf-8")
            return cache[rel]

        return verify.run_assertions(active, read), holds


def run(manifest: Manifest, *, tree: Path | None = None, image: str | None = None,
        default_tree: Path, variant: str | None = None, base: str | None = None,
        log=lambda m: None) -> VerifyReport:
    """``base`` (with a tree): judge the patches' ranges on the vLLM that base image holds,
    the one the tree is to be laid on, instead of the tree's own version."""
    if tree and image:
        raise UsageError("give --tree or --image, not both")
    variants.check(manifest, variant)
    if image:
        if base:
            raise UsageError("--base goes with --tree: an image's own files say what it holds")
        results, holds = check_image(manifest, image, variant=variant)
        return VerifyReport(image, results, holds)
    where = tree or default_tree
    version = None
    if base:
        from patchkit.image import basevllm
        from patchkit.image.engine import Engine
        from patchkit.imageref import Platform, check_reference

        check_reference("--base", base)
        held = basevllm.open_base(Engine.connect(), base,
                                  Platform.parse(manifest.image.platform or "linux/arm64"), log)
        version = held.version
    return VerifyReport(str(where), verify_tree(manifest, Path(where), variant, version))
