"""Text for copy-image (and build-image --copy-to): one line per target, with the fingerprint;
with --via, first a line of what the push to the registry sent."""

from __future__ import annotations

from patchkit.nodes.transfer import CopyStatus


def target_line(target: dict) -> str:
    head = f"{target['status']:<9} {target['engine']}"
    if target["status"] == CopyStatus.FAILED:
        return f"{head}: {target.get('error') or 'failed'}"
    sent = target.get("sent") or {}
    pulled = target.get("pulled")
    if pulled is not None:
        how = (f"pulled {pulled.get('bytes', 0):,} bytes ({pulled.get('layers', 0)} layer(s), "
               f"{pulled.get('present', 0)} held already) in {target.get('seconds', 0):.1f} s")
    elif sent.get("bytes"):
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


def via_line(via: dict) -> str:
    return (f"pushed    {via['ref']}@{via['digest']} ({via.get('bytes', 0):,} layer bytes "
            f"({via.get('layers', 0)} layer(s)) sent, {via.get('present', 0)} held by the "
            f"registry already, in {via.get('seconds', 0):.1f} s)")


def plan_line(target: dict) -> str:
    """What a dry run found for one target."""
    status = CopyStatus(target["status"])
    head = f"{'would-be ' + status if status is not CopyStatus.PRESENT else status:<9}"
    if status is CopyStatus.FAILED:
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
    if data.get("dry_run"):
        return "\n".join(plan_line(t) for t in data["targets"])
    lines = [via_line(data["via"])] if data.get("via") else []
    return "\n".join(lines + [target_line(t) for t in data["targets"]])
