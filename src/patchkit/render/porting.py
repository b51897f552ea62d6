"""Text for a person of the porting verbs: add-pr and import."""

from __future__ import annotations


def _status_note(pid: str, status: str, ref: str) -> str | None:
    if status == "upstream":
        return (f"note: vLLM {ref} already has the change of {pid} (it applies in reverse): it "
                "stays in the series as upstream")
    return None


def add_pr(result) -> str:
    p = result.patch
    lines = [f"added     {p.id}: {p.path} from {result.pull.diff_url} (sha256 {p.sha256[:12]})",
             f"  summary: {p.summary}"]
    if result.dropped:
        lines.append(f"  left out ({len(result.dropped)} file(s) no image holds; --include GLOB "
                     f"keeps them): {', '.join(result.dropped)}")
    ref = result.reports[0].vllm.ref
    note = _status_note(p.id, result.status, ref)
    if note:
        lines.append(note)
    lines.append(f"ok: the series applies at vLLM {ref} with {p.id} ({len(result.kept)} file(s))")
    return "\n".join(lines)
