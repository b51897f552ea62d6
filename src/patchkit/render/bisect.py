"""``patchkit bisect`` (and ``--series``) as text for a person, and the short form
rebase-check's notes use."""

from __future__ import annotations

import shlex

from patchkit.manifest import identity
from patchkit.series.bisect_upstream import BisectResult, Fate
from patchkit.commands.bisect_series import SeriesBisect, Verdict
from patchkit.report import Status

SHORT = 10  # hex digits of a commit shown to a person


def verb(fate: Fate) -> str:
    """How a change to ``fate`` reads: broken by, upstream from, applies again from."""
    return {Status.FAILED: "broken by", Status.UPSTREAM: "upstream from",
            Status.APPLIED: "applies from"}.get(fate.status, "changed by")


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
    # a patch of another package names it, as apply's report does: "fi-x (flashinfer): ..."
    of = identity(result.package).aside(" ({})")
    lines = [f"{result.patch}{of}: {good.fate} at {good.ref} ({good.commit[:SHORT]}), "
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
        whose = identity(result.package).aside("{} ")
        lines.append(f"it changes between the {whose}releases {a.ref} ({a.fate}) and {b.ref} "
                     f"({b.fate})")
        lines.append(f"  {result.why}")
    lines.append(f"tested {result.tested} of {result.span} {unit}, both ends included (at most "
                 f"{result.limit})")
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


# ------------------------------------------------------------------------------ --series

TAIL = 10  # lines of a run's output shown to a person


def _patches(k: int) -> str:
    return "the pin alone" if k == 0 else f"{k} patch{'es' if k != 1 else ''}"


def render_series(result: SeriesBisect) -> str:
    """``bisect --series``: the verdict, every run made, the output of the run that says most."""
    n, v = len(result.series), result.vllm
    lines = [f"series of {n} patch{'es' if n != 1 else ''} at vLLM {v['ref']} "
             f"({v['commit'][:SHORT]})" + (f", variant {result.variant}" if result.variant
                                            else "") + f"; CMD: {shlex.join(result.command)}"]
    lines += _verdict(result)
    lines.append(f"runs: {len(result.runs)} (at most {result.limit} with one culprit)")
    width = max((len(_patches(r.patches)) for r in result.runs), default=0)
    why = max((len(r.why) for r in result.runs), default=0)
    upto = max((len(f"up to {r.last}") for r in result.runs if r.last), default=0)
    for r in result.runs:
        last = f"up to {r.last}" if r.last else ""
        lines.append((f"  {_patches(r.patches):<{width}}  {r.outcome:<5}  {r.seconds:6.1f} s  "
                      f"{r.why:<{why}}  {last:<{upto}}"
                      + (f"  image {r.image}" if r.image else "")).rstrip())
    shown = _telling_run(result)
    if shown is not None and shown.output.strip():
        tail = shown.output.rstrip("\n").splitlines()[-TAIL:]
        cut = " (cut)" if shown.truncated else ""
        lines += ["", f"output of CMD with {_patches(shown.patches)}, last lines{cut}:"]
        lines += [f"  {line}" for line in tail]
    if result.left_out:
        lines += ["", "not searched (no apply at the pin has them):"]
        lines += [f"  {pid}: {why}" for pid, why in result.left_out]
    return "\n".join(lines) + "\n"


def _verdict(result: SeriesBisect) -> list[str]:
    n = len(result.series)
    if result.verdict is Verdict.FOUND:
        k, c = result.first_bad, result.culprit
        assert k is not None and c is not None
        return [f"first bad patch: {c.id} ({k} of {n}): {c.summary}",
                f"  CMD passes with {_patches(k - 1)} and fails once {c.id} is added"]
    if result.verdict is Verdict.PASSES:
        return [f"CMD passes with the whole series ({_patches(n)}): no patch of it makes "
                "CMD fail"]
    if result.verdict is Verdict.FAILS_WITHOUT:
        return ["CMD fails on the pin alone (no patch applied): the cause is not in the "
                "series"]
    if result.verdict is Verdict.ONLY_SKIPPED:
        return ["only skipped trees are left: the first bad patch is one of "
                + ", ".join(result.candidates)]
    if result.verdict is Verdict.STOPPED:
        return [f"stopped: {result.error}"]
    last = result.runs[-1] if result.runs else None
    end = "the pin alone" if last is None or last.patches == 0 else "the whole series"
    return [f"cannot bisect: {end} could not be tested ({last.why if last else 'no run'}); "
            "a bisect needs the pin alone to pass and the whole series to fail"]


def _telling_run(result: SeriesBisect):
    """The run whose output says most: the first bad prefix's, else the last run's."""
    if result.first_bad is not None:
        return result.run_of(result.first_bad)
    return result.runs[-1] if result.runs else None
