"""The artifact kind: a compiled file from a pinned wheel, placed in the image.

It changes nothing in the checkout (its work is the image's: ``image/artifact.py``), so it
applies as ``applied`` with no commit and touches no checkout path.
"""

from __future__ import annotations

from pathlib import Path

from patchkit.kinds.base import Rebase, Reader, Remains, Stop, Target
from patchkit.kinds.common import ABORT
from patchkit.report import Outcome, PatchResult, Reason, Status


class ArtifactKind:
    name = "artifact"
    is_folder = False
    replaces_files = False
    writes_only_named = True
    reads_whole = False   # a wheel of modules is hashed in chunks, never read whole

    def check(self, full: Path, rel: str) -> str | None:
        return None if rel.endswith(".whl") else f"{rel} is not a wheel (.whl)"

    def sources(self, full: Path, rel: str) -> list[str]:
        return [] if rel.startswith("https://") else [rel]

    def touched(self, full: Path) -> list[str]:
        return []

    def compile(self, full: Path, rel: str) -> str:
        # the wheel's pins and ELF header are validate's to prove (image/artifact.py)
        return "a pinned wheel" if rel.startswith("https://") else "a wheel beside the manifest"

    def apply(self, patch, full: Path, target: Target) -> Outcome:
        a = patch.artifact
        return Outcome(Status.APPLIED, None, f"{a.member} from {a.wheel.rsplit('/', 1)[-1]} goes "
                                        f"into the image, where the base installed {a.dist}")

    def apply_together(self, fulls, target: Target) -> None:
        return None

    def refresh(self, patch, full: Path, tree: Path, result: PatchResult) -> str | None:
        return None

    def stop(self, rebase: Rebase, patch, result: PatchResult, head: str) -> Stop:
        return Stop(patch.id, self.name, result.reason or Reason.ERROR, result.message,
                    [patch.path],
                    [head, "", f"Change {patch.path} or the artifact's pins, then "
                               "`patchkit rebase --continue`.", ABORT])

    def resume(self, rebase: Rebase, patch, stop: Stop) -> None:
        return None

    def changes(self, full: Path) -> frozenset[tuple[str, ...]]:
        return frozenset()

    def remains(self, full: Path, read: Reader, version: str | None) -> Remains:
        # it changes no source file: nothing of the release can be gone to prove it unneeded
        return Remains(still=("an artifact changes no source file, so nothing of the release "
                              "proves it unneeded; remove its entry instead",))


KIND = ArtifactKind()
