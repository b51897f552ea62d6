"""The releases the patchset tests run on, and what the series does on each.

Both come from the support table in ``docs/support.md``: the page users read is the expectation
the tests hold the series to, so the two cannot drift.  Every test takes its expectation from the
release it runs on, never from the tree it reads, so a release that lost a patch fails instead
of passing down another branch."""

from __future__ import annotations

from pathlib import Path

from patchkit import versions

SUPPORT_PAGE = Path(__file__).resolve().parents[2] / "docs" / "support.md"
_MARK = "<!-- support-matrix"
STATUS_WORDS = ("applied", "upstream", "skipped")


def support_table(page: Path = SUPPORT_PAGE) -> dict[str, dict[str, str]]:
    """release tag -> {patch id -> applied | upstream | skipped}, from the page's marked table."""
    lines = page.read_text(encoding="utf-8").splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(_MARK)) + 1
    rows = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
    header, _rule, *body = rows
    releases = header[1:]
    table: dict[str, dict[str, str]] = {r: {} for r in releases}
    for patch, *cells in body:
        assert len(cells) == len(releases), f"{page}: row {patch} has {len(cells)} cells"
        for release, cell in zip(releases, cells):
            assert cell in STATUS_WORDS, f"{page}: {patch} @ {release}: {cell!r}"
            table[release][patch] = cell
    return table


STATUSES = support_table()
RELEASES = tuple(STATUSES)


def since(release: str, first: str) -> bool:
    """Whether ``release`` is ``first`` or a later one."""
    return versions.parse(release.removeprefix("v")) >= versions.parse(first.removeprefix("v"))
