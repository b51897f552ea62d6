"""rebase-check's patch x release matrix as text for a person, JSON for scripts, Markdown for a
CI job summary and JUnit XML for a CI test report."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

from patchkit.commands.rebase_check import FORMATS, Matrix, Row
from patchkit.errors import UsageError
from patchkit.manifest import Manifest
from patchkit.render import plural
from patchkit.render.colors import paint
from patchkit.report import ApplyReport, PatchResult, Reason, Status
from patchkit.series.fates import Change, Fate

__all__ = ["FORMATS", "render"]


def cell_word(r: PatchResult) -> str:
    if r.status is Status.FAILED:
        return str(r.reason or Status.FAILED)
    if r.status is Status.APPLIED and r.offsets:
        return "applied (offset)"
    if r.made_by:
        return f"made by {r.made_by}"
    return str(r.status)


def fate_word(r: PatchResult, fate: Fate | None) -> str:
    """A target's cell: its status, and the fate from the pin where it is lost there, or where
    a fix went elsewhere (superseded, retired)."""
    word = cell_word(r)
    if fate is None:
        return word
    if fate.change is Change.LOST:
        return f"LOST ({word})"
    if fate.change is Change.REFUSED:
        return f"REFUSED ({word})"
    if fate.change in (Change.SUPERSEDED, Change.RETIRED):
        return str(fate.change)
    return word


def _fates(row: Row) -> list[Fate | None]:
    return [*row.fates, *[None] * (len(row.cells) - len(row.fates))]


def _paint(word: str, status: Status, offsets: bool, color: bool) -> str:
    return paint(word, "offset" if status is Status.APPLIED and offsets else status, color)


def notes(row: Row, markdown: bool = False) -> list[str]:
    """The notes column: drop candidate or upstream-since, and the vLLM pull request."""
    out = []
    if row.drop:
        drop = "upstream in every target: drop it"
        out.append(f"**{drop}**" if markdown else drop)
    elif row.upstream_since:
        since = f"`{row.upstream_since}`" if markdown else row.upstream_since
        out.append(f"upstream since {since}")
    if row.pull:
        pull = f"vllm#{row.pull}"
        out.append(f"[{pull}]({row.patch.upstream})" if markdown else pull)
    return out + _bisected(row)


def _bisected(row: Row) -> list[str]:
    """rebase-check --bisect: "broken by <sha> (#PR)", once when every target agrees."""
    from patchkit.render.bisect import short

    said = [(ref, found if isinstance(found, str) else short(found)) for ref, found in row.bisects]
    distinct = list(dict.fromkeys(phrase for _, phrase in said))
    if len(distinct) <= 1:
        return distinct
    return [f"{phrase} (at {ref})" for ref, phrase in said]


def render_text(matrix: Matrix, color: bool = False) -> str:
    m = matrix.manifest
    if not matrix.targets:
        return f"{m.name}: no targets (no {matrix.label} release after the pin {matrix.pin})\n"
    rows = matrix.rows()
    pin = [f"{matrix.pin} (pin)"] if matrix.at_pin else []
    head = ["patch", *pin, *matrix.refs, "notes"]
    table = [[r.patch.id, *([cell_word(r.pin)] if r.pin and pin else []),
              *[fate_word(c, f) for c, f in zip(r.cells, _fates(r))], "; ".join(notes(r))]
             for r in rows]
    widths = [max(len(x[i]) for x in [head, *table]) for i in range(len(head) - 1)]
    targets = plural(len(matrix.targets), matrix.label + " target")
    lines = [(f"{m.name}: {plural(len(rows), 'patch', 'patches')} x {targets} "
              f"(pinned at {matrix.pin}"
              + (f", variant {matrix.variant})" if matrix.variant else ")")), ""]
    lines.append("  ".join(h.ljust(w) for h, w in zip(head, widths)) + "  notes")
    for r, cells in zip(rows, table):
        out = [cells[0].ljust(widths[0])]
        shown = ([r.pin] if r.pin and pin else []) + r.cells
        for c, f, word, w in zip(shown, [None] * len(pin) + _fates(r), cells[1:-1], widths[1:]):
            status = Status.FAILED if f is not None and f.fails else c.status
            out.append(_paint(word, status, bool(c.offsets), color) + " " * (w - len(word)))
        lines.append(("  ".join(out) + "  " + cells[-1]).rstrip())
    failed = matrix.failures()
    if failed:
        lines += ["", "failed:"]
        lines += [f"  {r.id} @ {matrix.ref_of(t)}: {r.reason}: {r.message}" for t, r in failed]
    lost = matrix.lost()
    if lost:
        lines += ["", "lost:"]
        lines += [f"  {f.patch} @ {matrix.ref_of(t)}: {f.why}" for t, f in lost]
    changes = matrix.changes()
    if changes:
        lines += ["", "fates that change without loss:"]
        lines += [f"  {f.patch} @ {ref}: {f.change}"
                  + (f": {f.why}" if f.change is not Change.NOW_UPSTREAM else "")
                  for ref, f in changes]
    offsets = [(t, r) for t in matrix.targets for r in t.patches if r.offsets]
    if offsets:
        lines += ["", "offsets (fine; `patchkit rebase` rewrites them to apply exactly):"]
        lines += [f"  {r.id} @ {matrix.ref_of(t)}: {'; '.join(map(str, r.offsets))}" for t, r in offsets]
    drop = [r.patch.id for r in rows if r.drop]
    if drop:
        lines += ["", (f"upstream in every target, to drop: {', '.join(drop)} "
                       f"(patchkit rebase --to {matrix.refs[-1]} --drop-upstream)")]
    lines.append("")
    if matrix.ok:
        lines.append(f"ok: the series applies to {len(matrix.targets)} of {len(matrix.targets)} "
                     "targets")
    else:
        bad = matrix.failed_refs()
        lines.append(f"FAILED: {_failures(len(failed), len(lost))} on {len(bad)} of "
                     f"{len(matrix.targets)} targets ({', '.join(bad)})")
    return "\n".join(lines) + "\n"


def _failures(n: int, lost: int = 0) -> str:
    said = [f"{n} patch failure{'s' if n != 1 else ''}"] if n or not lost else []
    if lost:
        said.append(f"{lost} lost fix{'es' if lost != 1 else ''}")
    return " and ".join(said)


_MD_ICON = {Status.APPLIED: "✅", Status.UPSTREAM: "⬆️", Status.SKIPPED: "⏭️",
            Status.FAILED: "❌"}


def _md(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render_markdown(matrix: Matrix) -> str:
    m = matrix.manifest
    out = [f"## {matrix.label} rebase-check: {m.name}", ""]
    if not matrix.targets:
        out.append(f"No {matrix.label} release after the pin `{matrix.pin}`: nothing to check.")
        return "\n".join(out) + "\n"
    verdict = ("✅ the series applies to every target" if matrix.ok else
               f"❌ {_failures(len(matrix.failures()), len(matrix.lost()))}")
    out += [(f"Pinned at `{matrix.pin}`; {plural(len(matrix.rows()), 'patch', 'patches')} x "
             f"{plural(len(matrix.targets), 'target')}: {verdict}."), ""]
    pin = [f"`{matrix.pin}` (pin)"] if matrix.at_pin else []
    out.append("| patch | " + " | ".join([*pin, *(f"`{ref}`" for ref in matrix.refs)])
               + " | notes |")
    out.append("|---" * (len(matrix.targets) + len(pin) + 2) + "|")
    rows = matrix.rows()
    for r in rows:
        cells = [f"{_MD_ICON[r.pin.status]} {cell_word(r.pin)}"] if r.pin and pin else []
        cells += [f"{'❌' if f is not None and f.fails else _MD_ICON[c.status]} "
                  f"{fate_word(c, f)}" for c, f in zip(r.cells, _fates(r))]
        note = " · ".join(notes(r, markdown=True))
        out.append(f"| `{r.patch.id}` | " + " | ".join(cells) + f" | {_md(note)} |")
    failed = matrix.failures()
    if failed:
        out += ["", "### Failures", ""]
        for t, r in failed:
            out += [(f"<details><summary><code>{r.id}</code> on <code>{matrix.ref_of(t)}</code>: "
                     f"{r.reason}</summary>"), "", "```text", failure_text(matrix, t, r), "```", "",
                    "</details>", ""]
    lost = matrix.lost()
    if lost:
        out += ["", "### Lost fixes", ""]
        out += [f"- `{f.patch}` on `{matrix.ref_of(t)}`: {_md(f.why)}" for t, f in lost]
    changes = matrix.changes()
    if changes:
        out += ["", "### Fates that change without loss", ""]
        out += [f"- `{f.patch}` on `{ref}`: {f.change}"
                + (f": {_md(f.why)}" if f.change is not Change.NOW_UPSTREAM else "")
                for ref, f in changes]
    drop = [r.patch.id for r in rows if r.drop]
    if drop:
        out += ["", (f"Upstream in every target: {', '.join(f'`{d}`' for d in drop)}. "
                     f"Drop with `patchkit rebase --to {matrix.refs[-1]} --drop-upstream`.")]
    return "\n".join(out).rstrip() + "\n"


def failure_text(matrix: Matrix, target: ApplyReport, r: PatchResult) -> str:
    """The whole story of one failure: the message, then the hunk that did not apply or the
    assertions that did not hold."""
    lines = [f"{r.reason}: {r.message}"]
    if r.reason in (Reason.CONFLICT, Reason.FUZZ) and r.hunk is not None:
        hunk = _failed_hunk(matrix.manifest, r)
        if hunk:
            lines += ["", "the hunk:", hunk.rstrip("\n")]
    failed = [a for a in target.verify if a.patch == r.id and not a.ok]
    if failed:
        lines += ["", "assertions that do not hold:"]
        lines += [f"  {a.location()}: {a.message}" for a in failed]
    return "\n".join(lines)


def _failed_hunk(manifest: Manifest, r: PatchResult) -> str | None:
    from patchkit.kinds.diff.text import hunk_text

    try:
        patch = manifest.patch(r.id)
    except KeyError:
        return None
    return hunk_text(manifest.root / patch.path, r.hunk) if r.hunk else None


def render_junit(matrix: Matrix) -> str:
    """One testsuite per target, one testcase per patch."""
    total = sum(len(t.patches) for t in matrix.targets)
    failures = len(matrix.failures()) + len(matrix.lost())
    skipped = sum(r.status is Status.SKIPPED for t in matrix.targets for r in t.patches)
    suites = ET.Element("testsuites", name=f"patchkit rebase-check {matrix.manifest.name}",
                        tests=str(total), failures=str(failures), errors="0",
                        skipped=str(skipped))
    for n, t in enumerate(matrix.targets):
        fated = {f.patch: f for f in matrix.fate_at(n)}
        lost = {pid for pid, f in fated.items() if f.fails}
        suite = ET.SubElement(
            suites, "testsuite", name=f"{matrix.label} {matrix.ref_of(t)}",
            tests=str(len(t.patches)),
            failures=str(sum(r.status is Status.FAILED or r.id in lost for r in t.patches)),
            errors="0",
            skipped=str(sum(r.status is Status.SKIPPED and r.id not in lost
                            for r in t.patches)))
        props = ET.SubElement(suite, "properties")
        for name, value in (("vllm.ref", t.vllm.ref), ("vllm.commit", t.vllm.commit),
                            ("vllm.version", t.vllm.version or "")):
            ET.SubElement(props, "property", name=name, value=value)
        for r in t.patches:
            case = ET.SubElement(suite, "testcase", name=r.id,
                                 classname=f"{matrix.package}-{matrix.ref_of(t)}")
            fate = fated.get(r.id)
            if r.id in lost:
                fail = ET.SubElement(case, "failure", type=str(fate.change),
                                     message=fate.why[:500])
                fail.text = fate.why
            elif r.status is Status.FAILED:
                fail = ET.SubElement(case, "failure", type=str(r.reason or Status.FAILED),
                                     message=f"{r.reason}: {r.message}"[:500])
                fail.text = failure_text(matrix, t, r)
            elif r.status is Status.SKIPPED:
                ET.SubElement(case, "skipped", message=r.message + (
                    f"; {fate.change}: {fate.why}" if fate is not None and fate.noted else ""))
            else:
                detail = [r.status] + ([r.message] if r.message else []) + [str(o) for o in r.offsets]
                if fate is not None and fate.noted:
                    detail.append(f"{fate.change}: {fate.why}")
                ET.SubElement(case, "system-out").text = "\n".join(detail)
    ET.indent(suites)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(suites, encoding="unicode") + "\n"


def render_json(matrix: Matrix) -> str:
    return json.dumps(matrix.to_dict(), indent=2) + "\n"


RENDERERS = {"json": render_json, "markdown": render_markdown, "junit": render_junit}


def render(matrix: Matrix, fmt: str, color: bool = False) -> str:
    if fmt == "text":
        return render_text(matrix, color)
    try:
        return RENDERERS[fmt](matrix)
    except KeyError:
        raise UsageError(f"unknown format {fmt!r}") from None
