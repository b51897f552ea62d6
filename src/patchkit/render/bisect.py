"""``patchkit bisect`` as text for a person, and the short form rebase-check's notes use."""

from __future__ import annotations

from patchkit.commands.bisect import BisectResult, Fate

SHORT = 10  # hex digits of a commit shown to a person


def verb(fate: Fate) -> str:
    """How a change to ``fate`` reads: broken by, upstream from, applies again from."""
    return {"failed": "broken by", "upstream": "upstream from",
            "applied": "applies from"}.get(fate.status, "changed by")


def short(result: BisectResult) -> str:
    """One phrase: ``broken by 1a2b3c4d5e (#12345)``, or what was found instead."""
    fb = result.first_bad
    if fb is not None:
        return f"{verb(fb.fate)} {fb.commit[:SHORT]}" + (f" (#{fb.pull})" if fb.pull else "")
    if not result.changed:
        return f"{result.good.fate} at {result.good.ref} too"
    if result.narrowed:
        a, b = result.narrowed
        return f"changed between {a.ref} and {b.ref}"
    return "not found"


def render_text(result: BisectResult) -> str:
    good, bad = result.good, result.bad
    lines = [f"{result.patch}: {good.fate} at {good.ref} ({good.commit[:SHORT]}), "
             f"{bad.fate} at {bad.ref} ({bad.commit[:SHORT]})"]
    if result.base is not None:
        lines.append(f"  {good.ref} is not an ancestor of {bad.ref} (a release branch?): searched "
                     f"from their merge base {result.base.commit[:SHORT]} ({result.base.fate})")
    unit = "releases" if result.narrowed else "first-parent commits"
    if not result.changed:
        lines.append(f"the same fate at both ends: nothing changes between {good.ref} and "
                     f"{bad.ref}")
    elif result.first_bad is not None:
        fb = result.first_bad
        pull = f"#{fb.pull}  " if fb.pull else ""
        lines.append(f"{verb(fb.fate)} {fb.commit[:SHORT]}  {pull}{fb.subject}")
        lines.append(f"  commit {fb.commit}")
        lines.append(f"  date   {fb.date}")
        lines.append(f"  fate   {fb.fate}" + (f": {fb.fate.message}" if fb.fate.message else ""))
        if fb.fate != bad.fate:
            lines.append(f"  (at {bad.ref} it is {bad.fate}: it changed again later)")
    elif result.narrowed:
        a, b = result.narrowed
        lines.append(f"it changes between the releases {a.ref} ({a.fate}) and {b.ref} ({b.fate})")
        lines.append(f"  {result.why}")
    lines.append(f"tested {result.tested} of {result.commits} {unit} (at most {result.limit})")
    if result.changed and (result.first_bad or result.narrowed):
        files = ", ".join(result.files) or "no file"
        if result.first_bad:
            where = f"at {result.first_bad.commit[:SHORT]}"
        else:
            assert result.narrowed
            where = f"from {result.narrowed[0].ref} to {result.narrowed[1].ref}"
        if result.diff:
            lines += ["", f"upstream diff of {files} {where}:", result.diff.rstrip("\n")]
        else:
            lines += ["", f"no upstream change to {files} {where}"]
    return "\n".join(lines) + "\n"
