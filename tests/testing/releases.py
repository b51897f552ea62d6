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


def table_text(table: dict[str, dict[str, str]], order: list[str]) -> str:
    """The marked table's lines for ``table`` (release -> patch -> status), rows in ``order``."""
    releases = list(table)
    lines = ["| patch | " + " | ".join(releases) + " |",
             "|---|" + "---|" * len(releases)]
    lines += [f"| {pid} | " + " | ".join(table[r][pid] for r in releases) + " |"
              for pid in order]
    return "\n".join(lines) + "\n"


def write_support_table(table: dict[str, dict[str, str]], order: list[str],
                        page: Path = SUPPORT_PAGE) -> None:
    """Put ``table`` in place of the page's marked table, the rest of the page as it is."""
    lines = page.read_text(encoding="utf-8").splitlines(keepends=True)
    start = next(i for i, line in enumerate(lines) if line.startswith(_MARK)) + 1
    end = start
    while end < len(lines) and lines[end].startswith("|"):
        end += 1
    page.write_text("".join(lines[:start]) + table_text(table, order) + "".join(lines[end:]),
                    encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    """``python tests/testing/releases.py``: run the series on every vLLM release on PyPI from
    the oldest one the table holds to the manifest's pin, and write what each patch did into
    docs/support.md (a bump's probe runs it, so the table follows the pin)."""
    import json
    import subprocess
    import sys

    from patchkit import manifest
    from patchkit.source import pypi

    root = SUPPORT_PAGE.parents[1]
    series = manifest.load(root / "patchset.yaml")
    oldest, pin = versions.parse(RELEASES[0][1:]), versions.parse(series.vllm.ref[1:])
    tags = [f"v{v}" for v in pypi.release_versions()
            if oldest <= versions.parse(v) <= pin and not versions.parse(v).is_prerelease]
    args = [a for tag in tags for a in ("--to", tag)]
    out = subprocess.run([sys.executable, "-m", "patchkit", "rebase-check", "--vllm-repo",
                          "pypi", *args, "--format", "json"], cwd=root, capture_output=True,
                         text=True, check=False)
    report = json.loads(out.stdout)
    table = {t["vllm"]["ref"]: {p["id"]: p["status"] for p in t["patches"]}
             for t in report["targets"]}
    table = {tag: table[tag] for tag in tags}
    write_support_table(table, [p.id for p in series.patches])
    print(f"{SUPPORT_PAGE}: {len(tags)} releases, {tags[0]} to {tags[-1]}"
          + ("" if report["ok"] else "; FAILED cells: the series does not hold on all of them"))
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
