"""Applied checkouts as values, for the tests of code that reads one without asking git: the
image plan reads the report's JIT modules and the blobs of the changed files."""

from __future__ import annotations

from pathlib import Path

from patchkit.report import ApplyReport, PackageInfo
from patchkit.series.checkout import AppliedCheckout, Change


def applied(modules: dict[str, list[str]], package: str = "flashinfer") -> AppliedCheckout:
    """A checkout of ``package`` whose report says which JIT modules it builds from each patched
    file (``modules``); nothing of it is on disk."""
    report = ApplyReport(PackageInfo("v1", "c" * 40, "1.0.0"), None,
                         jit_modules={package: modules})
    return AppliedCheckout(Path("/nonexistent/applied"), report, "c" * 40, "d" * 40)


def changed(path: str, blob: str) -> Change:
    """``path``, modified by the series into blob ``blob``."""
    return Change("M", path, 0o100644, blob)
