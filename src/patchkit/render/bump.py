"""What `patchkit bump` says: a pull request body in Markdown per bump, one line when a package
is already on its newest release."""

from __future__ import annotations

FATES = {
    "applied": "carried as it is",
    "refreshed": "carried, refreshed",
    "resolved": "carried, resolved by hand",
    "upstream": "upstream: marked with a range",
    "dropped": "upstream: dropped",
    "skipped": "out of its range",
}


def current(result) -> str:
    return (f"{result.label}: pinned at {result.from_ref}, the newest release; nothing to bump")


def body(result) -> str:
    """The pull request body: what changed, every patch's fate, what needs a hand, and how the
    series was proven."""
    if result.to_ref is None:
        return current(result) + "\n"
    title = f"Bump {result.label} from {result.from_ref} to {result.to_ref}"
    lines = [f"## {title}", ""]
    if result.needs_a_hand:
        lines += [f"**Needs a hand**: {_why(result)}", ""]
    if result.dry_run:
        lines += ["A dry run: nothing was written"
                  + (" (without `--dry-run` the port is left for a person)."
                     if result.needs_a_hand else "."), ""]
    elif not result.needs_a_hand:
        lines += [f"Branch `{result.branch}`, one commit"
                  + (f", pushed to `{result.pushed}`." if result.pushed else "."), ""]
    lines += ["| patch | fate | detail |", "|---|---|---|"]
    stopped = result.stop.patch if result.stop else None
    for step in result.steps:
        lines.append(f"| `{step.id}` | {FATES.get(step.action, step.action)} | "
                     f"{_cell(step.detail)} |")
    if stopped:
        lines.append(f"| `{stopped}` | **needs a hand** | {_cell(result.stop.message)} |")
    lines += [f"| `{pid}` | not tried yet | after `{stopped or 'the stop'}` |"
              for pid in result.untried]
    lines.append("")
    if result.stop:
        lines += ["### What needs a hand", "", "```text", *result.stop.instructions, "```", ""]
    lines += ["### How it was proven", ""]
    lines += _proof(result)
    if result.changed:
        lines += ["", "### Files changed", ""] + [f"- `{path}`" for path in result.changed]
    if result.notes:
        lines += ["", "### Notes", ""] + [f"- {note}" for note in result.notes]
    if result.worktree:
        again = f"patchkit bump --package {result.package} --to {result.to_ref}"
        lines += ["", f"The port is left in `{result.worktree}` for a person: finish it there "
                      f"(`patchkit rebase --continue` after a stop, or fix what the probe "
                      f"found), then `{again}` takes it from there."]
    lines += ["", "<sub>Written by `patchkit bump`.</sub>"]
    return "\n".join(lines) + "\n"


def _why(result) -> str:
    if result.stop:
        where = f"`{result.stop.patch}`" if result.stop.patch else "the assertions"
        return f"{where} could not be ported to {result.label} {result.to_ref}"
    failed = next(p for p in result.probes if not p.ok)
    how = "ran past its deadline" if failed.returncode is None else f"exit {failed.returncode}"
    return f"the probe `{failed.command}` failed ({how})"


def _proof(result) -> list[str]:
    if result.stop:
        return [f"- the series stopped at `{result.stop.patch or 'verify'}`: nothing past it "
                "was proven"]
    lines = [f"- every patch of {result.label} applies exactly (no offset, no fuzz) to "
             f"{result.to_ref} on a fresh checkout, giving the tree the port built",
             f"- {result.assertions} `verify:` assertion"
             f"{'s hold' if result.assertions != 1 else ' holds'} on the ported tree"]
    for probe in result.probes:
        state = "passed" if probe.ok else ("ran past its deadline" if probe.returncode is None
                                           else f"FAILED (exit {probe.returncode})")
        lines.append(f"- probe `{probe.command}`: {state} in {probe.seconds:g} s")
        if not probe.ok and probe.output:
            lines += ["", "  ```text", *["  " + ln for ln in probe.output.splitlines()],
                      "  ```"]
    if not result.probes:
        lines.append("- no probes: the manifest names none (`bump.probes`)")
    return lines


def _cell(text: str) -> str:
    return " ".join((text or "").split()).replace("|", "\\|")


def summary(result) -> str:
    """The closing line of a text run, on stderr."""
    if result.to_ref is None:
        return current(result)
    if result.needs_a_hand:
        where = f" (left in {result.worktree})" if result.worktree else ""
        return f"needs a hand: {result.label} {result.to_ref}: {_why(result)}{where}"
    if result.status == "dry-run":
        return f"dry run: {result.label} {result.from_ref} -> {result.to_ref} would be bumped"
    pushed = f", pushed to {result.pushed}" if result.pushed else ""
    return (f"ok: {result.label} {result.from_ref} -> {result.to_ref} on {result.branch} "
            f"({result.commit[:12]}){pushed}")
