"""How a smoke report looks as text: one line per check, then a summary line; one line in all
when nothing answered."""

from __future__ import annotations

from patchkit.commands.smoke import CheckStatus, SmokeReport

WORDS = {CheckStatus.OK: "ok", CheckStatus.FAILED: "FAILED",
         CheckStatus.INCONCLUSIVE: "INCONCLUSIVE"}   # a check not run reads "-"


def render_text(report: SmokeReport) -> str:
    if report.unreachable:
        return f"FAILED: {report.unreachable}"
    lines = []
    for c in report.checks:
        word = WORDS.get(c.status, "-")
        lines.append(f"{word:<7} {c.name:<11} {c.message}")
    failed = sum(not c.ok for c in report.checks)
    on = f"on {report.url}" + (f" (model {report.model})" if report.model else "")
    if report.ok:
        lines.append(f"ok: {len(report.checks)}/{len(report.checks)} checks passed {on}")
    else:
        lines.append(f"FAILED: {failed} of {len(report.checks)} checks did not pass {on}")
    return "\n".join(lines)


def render_outcome(outcome) -> str:
    """The checks, where the evidence went and the notes, the summary, then the gate: a line
    each."""
    if outcome.report.unreachable:
        return render_text(outcome.report)   # one line: nothing answered, nothing recorded
    *lines, summary = render_text(outcome.report).splitlines()
    rec = outcome.recorded
    if rec is not None:
        lines += rec.lines(outcome.build)
    lines += list(outcome.notes)
    lines.append(summary)   # the checks' summary stays the last line before the gate's
    gate = outcome.gate
    if gate is not None:
        for d in gate.failed:
            lines.append(f"FAILED: gate: {d.figure} fell {d.percent:.1f}% ({d.was:.2f} on "
                         f"{gate.against} -> {d.now:.2f} on {gate.current}), beyond "
                         f"--max-drop {gate.max_drop:g}%")
        if gate.ok:
            said = "; ".join(f"{d.figure} {d.was:.2f} -> {d.now:.2f} ({-d.percent:+.1f}%)"
                             for d in gate.drops)
            lines.append(f"ok: gate: against {gate.against} ({gate.when}): {said}; within "
                         f"--max-drop {gate.max_drop:g}%")
    return "\n".join(lines)
