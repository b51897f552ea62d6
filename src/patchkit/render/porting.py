"""Text for a person of the porting verbs: add-pr and import."""

from __future__ import annotations

from patchkit.report import Status


def _pin(report, package) -> str:
    """A package's pin as the report names it: ``vLLM v0.33.0``, ``flashinfer v0.6.15``."""
    info = report.packages.get(package.name) or report.vllm
    return f"{package.label} {info.ref}"


def _status_note(pid: str, status: Status, ref: str) -> str | None:
    if status is Status.UPSTREAM:
        return (f"note: at {ref} the tree has the change of {pid} already when its turn "
                "comes (it applies in reverse): it is in the series as upstream")
    return None


def add_pr(result) -> str:
    p = result.patch
    lines = [f"added     {p.id}: {p.path} from {result.pull.diff_url} (sha256 {p.sha256[:12]})",
             f"  summary: {p.summary}"]
    if result.pull.note:
        lines.append(f"note: {result.pull.note}")
    if result.dropped:
        lines.append(f"  left out ({len(result.dropped)} file(s) no image holds; --include GLOB "
                     f"keeps them): {', '.join(result.dropped)}")
    ref = _pin(result.reports[0], p.package)
    note = _status_note(p.id, result.status, ref)
    if note:
        lines.append(note)
    lines.append(f"ok: the series applies at {ref} with {p.id} ({len(result.kept)} file(s))")
    return "\n".join(lines)


def import_(result) -> str:
    if not result.patches:
        return "\n".join([f"note: {n}" for n in result.notes] + ["nothing to import"])
    statuses = result.statuses()
    package = result.patches[0].package
    ref = _pin(result.reports[0], package) if result.reports else "?"
    lines = [f"added     {p.id}: {p.path} from {_short(p.source)} {p.summary}"
             for p in result.patches]
    for p in result.patches:
        note = _status_note(p.id, statuses[p.id], ref)
        if note:
            lines.append(note)
    lines += [f"note: {n}" for n in result.notes]
    lines.append(f"ok: the series applies at {ref} with {len(result.patches)} new "
                 f"patch{'es' if len(result.patches) != 1 else ''} (base {result.base[:12]})")
    return "\n".join(lines)


def _short(where: str) -> str:
    return where[:12] if len(where) == 40 and all(c in "0123456789abcdef" for c in where) else where
