"""The repository's own patchset, applied by the engine to real vLLM releases from PyPI.

``patched`` is one applied checkout per release, made once per session: tests read the patched
files (HEAD) and the upstream ones (the ``patchkit/base`` tag) from it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from patchkit import manifest
from patchkit.series import applier
from patchkit.run import run_spec
from testing import REPO_ROOT, release_cache

from testing.lift import base_text
from testing.releases import RELEASES, STATUSES, since


@dataclass(frozen=True)
class Applied:
    release: str
    tree: Path
    statuses: dict[str, str]   # patch id -> applied | upstream | skipped

    def text(self, rel: str) -> str:
        return (self.tree / rel).read_text(encoding="utf-8")

    def base(self, rel: str) -> str:
        return base_text(self.tree, rel)

    def since(self, first: str) -> bool:
        """Whether this is release ``first`` or a later one: what a test expects follows
        from it, not from what the tree holds."""
        return since(self.release, first)


@pytest.fixture(scope="session",
                params=[pytest.param(r, marks=pytest.mark.real_vllm) for r in RELEASES])
def patched(request, tmp_path_factory) -> Applied:
    """The whole series on one real release: each patch applied, upstream or out of range,
    as releases.STATUSES says for that release."""
    release = request.param
    series = manifest.load(REPO_ROOT / "patchset.yaml")
    workdir = tmp_path_factory.mktemp(f"vllm-{release}") / "tree"
    report = applier.apply_series(series,
                                  run=run_spec(series, ref=release, repos=("pypi",),
                                  cache=release_cache()), workdir=workdir)
    failed = [(p.id, p.status, p.reason, p.message) for p in report.patches
              if p.status not in ("applied", "upstream", "skipped")]
    assert report.ok and not failed, failed or [v for v in report.verify if not v.ok]
    statuses = {p.id: p.status for p in report.patches}
    assert statuses == STATUSES[release]
    return Applied(release, workdir, statuses)
