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
