"""Text for copy-image (and build-image --copy-to): one line per target, with the fingerprint."""

from __future__ import annotations


def target_line(target: dict) -> str:
    head = f"{target['status']:<9} {target['engine']}"
    if target["status"] == "failed":
        return f"{head}: {target.get('error') or 'failed'}"
    sent = target.get("sent") or {}
    if sent.get("bytes"):
        how = (f"{sent.get('bytes', 0):,} bytes sent in {target.get('seconds', 0):.1f} s: "
               f"{sent.get('layers', 0)} layer(s), {sent.get('layer_bytes', 0):,} layer bytes")
        if sent.get("layers_skipped"):
            how += (f"; {sent['layers_skipped']} layer(s) held there left out "
                    f"({sent.get('skipped_bytes', 0):,} bytes)")
        if sent.get("compress") not in (None, "none"):
            how += f"; {sent['compress']}"
    else:
        how = "nothing sent"
    return f"{head} {target['fingerprint']} ({how})"


def plan_line(target: dict) -> str:
    """What a dry run found for one target."""
    head = f"{'would-be ' + target['status'] if target['status'] != 'present' else 'present':<9}"
    if target["status"] == "failed":
        return f"failed    {target['engine']}: {target.get('error') or 'failed'}"
    plan = target.get("plan") or {}
    line = f"{head} {target['engine']}: {plan.get('why', '')}"
    if plan.get("action") == "send":
        size = plan.get("missing_bytes")
        line += (f" ({plan.get('layers_to_send', 0)} layer(s) to send, "
                 f"{'unknown' if size is None else f'{size:,}'} layer bytes)")
    return line


def text(report) -> str:
    data = report.to_dict() if hasattr(report, "to_dict") else report
    line = plan_line if data.get("dry_run") else target_line
    return "\n".join(line(t) for t in data["targets"])
