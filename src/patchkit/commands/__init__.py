"""One function per subcommand that needs more than a call into the core."""

from __future__ import annotations

from pathlib import Path

from patchkit import engine, verify
from patchkit.errors import UsageError
from patchkit.manifest import Manifest, Patch
from patchkit.report import AssertionResult


def verify_tree(manifest: Manifest, tree: Path) -> list[AssertionResult]:
    """The manifest's assertions on a patched tree, leaving out patches the tree's release is
    outside of (known from the apply report, when the tree has one)."""
    if not tree.is_dir():
        raise UsageError(f"--tree {tree}: no such directory")
    report = engine.read_report(tree) or {}
    version = (report.get("vllm") or {}).get("version")
    skipped = {p["id"] for p in report.get("patches", []) if p.get("status") == "skipped"}
    return verify.run_assertions(active_patches(manifest, skipped, version),
                                 verify.tree_reader(tree))


def active_patches(manifest: Manifest, skipped: set[str], version: str | None) -> list[Patch]:
    """The patches whose assertions apply: neither skipped by the apply nor outside the range
    of the release found (when one was found)."""
    return [p for p in manifest.patches
            if p.id not in skipped and (not version or engine.in_range(p, version)[0])]
