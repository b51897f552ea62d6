"""Text for copy-image (and build-image --copy-to): one line per target, with the fingerprint."""

from __future__ import annotations


def target_line(target: dict) -> str:
    head = f"{target['status']:<9} {target['engine']}"
    if target["status"] == "failed":
        return f"{head}: {target.get('error') or 'failed'}"
    sent = target.get("sent") or {}
    if sent.get("bytes"):
        how = (f"{sent.get('layer_bytes', 0):,} layer bytes ({sent.get('layers', 0)} layer(s)) "
               f"sent in {target.get('seconds', 0):.1f} s")
    else:
        how = "nothing sent"
    return f"{head} {target['fingerprint']} ({how})"


def text(report) -> str:
    data = report.to_dict() if hasattr(report, "to_dict") else report
    return "\n".join(target_line(t) for t in data["targets"])
