"""What `patchkit bump` says: a pull request body in Markdown per bump, one line when a package
is already on its newest release or its branch holds the port already."""

from __future__ import annotations

from patchkit.commands.bump import BaseMove, Bump, BumpStatus, Fate, pull_name
from patchkit.report import Status
from patchkit.series.fates import Change

# what the port did with a patch, as a reviewer reads it
PORT = {
    "applied": "carried as it is",
    "refreshed": "refreshed",
    "resolved": "resolved by hand",
    "upstream": "upstream: range marked",
    "dropped": "upstream: dropped",
    "dropped-by-hand": "dropped by hand",
    "made-by-earlier": "made by an earlier patch: dropped",
    "skipped": "",
    "removed": "entry removed",
    "added": "entry added",
    "stopped": "**needs a hand**",
    "untried": "not tried yet",
}


def current(result: Bump) -> str:
    return f"{result.label}: pinned at {result.from_ref}, the newest release; nothing to bump"


def body(result: Bump) -> str:
    """The pull request body: what changed, every patch's fate on both sides, what needs a
    hand, and how the series was proven (and what was not)."""
    if result.to_ref is None:
        return current(result) + "\n"
    title = f"Bump {result.label} from {result.from_ref} to {result.to_ref}"
    lines = [f"## {title}", ""]
    if result.needs_a_hand:
        lines += [f"**Needs a hand**: {result.why}", ""]
    if result.dry_run:
        lines += ["A dry run: nothing was written.", ""]
    elif result.status is BumpStatus.UNCHANGED:
        lines += [f"Branch `{result.branch}` holds this port already: nothing was written.", ""]
    elif not result.needs_a_hand:
        lines += [f"Branch `{result.branch}`, one commit"
                  + (f", pushed to `{result.pushed}`." if result.pushed else "."), ""]
    if result.on:
        lines += [f"On `{result.on[:12]}` ({_cell(result.on_subject)}), the project's HEAD "
                  "when the bump ran.", ""]
    links = [f"[{name}]({url})" for name, url in
             (("changes upstream", result.links.compare), ("release", result.links.release)) if url]
    if links:
        lines += [f"{result.label} {result.to_ref}: " + " · ".join(links), ""]
    lines += _table(result)
    lines += _changes(result)
    if result.stop:
        lines += ["### What needs a hand", "", "```text", *result.stop.instructions, "```", ""]
    lines += ["### How it was proven", ""]
    lines += _proof(result)
    if result.evidence:
        lines += ["", f"The build this replaces: {result.evidence}. After the merge, compare "
                      "with `patchkit smoke URL --requests N --container NAME --against "
                      "previous --max-drop PCT`."]
    if result.by_hand:
        lines += ["", "### Finished by hand", "",
                  "What a person changed after the automatic attempt stopped: "
                  + ", ".join(f"`{f}`" for f in result.by_hand.files) + ".", "",
                  "<details><summary>The diff against the automatic attempt</summary>", "",
                  "```diff", result.by_hand.diff.rstrip("\n"), "```", "", "</details>"]
    if result.changed:
        lines += ["", "### Files changed", ""] + [f"- `{path}`" for path in result.changed]
    if result.notes:
        lines += ["", "### Notes", ""] + [f"- {note}" for note in result.notes]
    if result.worktree:
        again = f"patchkit bump --package {result.package} --to {result.to_ref}"
        lines += ["", f"The port is left in `{result.worktree}` for a person: finish it there "
                      f"(`patchkit rebase --continue` after a stop, a `supersedes:`, a range or "
                      f"a `retired:` for a lost fix, or fix what the probe found), then `{again}` takes it "
                      "from there."]
    lines += ["", "<sub>Written by `patchkit bump`.</sub>"]
    return "\n".join(lines) + "\n"


def _table(result: Bump) -> list[str]:
    old, new = result.from_ref, result.to_ref
    lines = [f"| patch | at `{old}` | at `{new}` | port | upstream |", "|---|---|---|---|---|"]
    for f in result.fates:
        port = PORT.get(f.port, f.port)
        detail = _cell(f.detail)
        if f.successor:
            detail = _cell(f"superseded by `{f.successor}`" + (f"; {f.detail}" if f.detail else ""))
        elif f.retired:
            detail = _cell(f.why)
        cell = "; ".join(x for x in (port, detail) if x)
        lines.append(f"| `{f.id}` | {_fate(f.before)} | {_after(f, result)} | {cell} | "
                     f"{_link(f.upstream)} |")
    return lines + [""]


def _fate(status: Status | None) -> str:
    return status.value if status else "—"


def _after(f: Fate, result: Bump) -> str:
    if result.stop is not None:
        return "not proven"
    if f.lost:
        word = "retirement refused" if f.change is Change.REFUSED else "lost"
        return f"**{f.after.value if f.after else 'removed'}: {word}**"
    if f.retired:
        return f"{_fate(f.after)}: retired"
    return _fate(f.after)


def _link(url: str | None) -> str:
    if not url:
        return ""
    return f"[{pull_name(url) or 'link'}]({url})"


def _changes(result: Bump) -> list[str]:
    """The fixes that start and stop taking effect with this bump, each with where its fix
    went."""
    if result.stop is not None:
        return []
    newly = [f for f in result.fates if f.newly_applied]
    gone = [f for f in result.fates if f.no_longer_applied]
    out: list[str] = []
    if newly:
        out += ["**Newly applied** (take effect for the first time at "
                f"{result.to_ref}):", ""] + [f"- `{f.id}`" for f in newly] + [""]
    if gone:
        out += ["**No longer applied** (took effect at "
                f"{result.from_ref}, not at {result.to_ref}):", ""]
        for f in gone:
            if f.change is Change.SUPERSEDED:
                out.append(f"- `{f.id}`: superseded by `{f.successor}`")
            elif f.change is Change.MADE_BY:
                out.append(f"- `{f.id}`: {f.why}")
            elif f.went_upstream:
                out.append(f"- `{f.id}`: upstream in {result.label} {result.to_ref}")
            elif f.retired:
                out.append(f"- `{f.id}`: {f.why}")
            elif f.change is Change.REFUSED:
                out.append(f"- `{f.id}`: **retirement refused**: {f.why}")
            else:
                by_hand = " (dropped by hand at this release)" if f.port == "dropped-by-hand" \
                    else ""
                out.append(f"- `{f.id}`: **lost**{by_hand}: not upstream, no patch that takes "
                           "effect supersedes it, and it is not retired")
        out.append("")
    return out


def _proof(result: Bump) -> list[str]:
    if result.stop:
        return [f"- the series stopped at `{result.stop.patch or 'verify'}`: nothing past it "
                "was proven",
                "- not proven: no server was started and no GPU was used"]
    lines = [f"- every patch of {result.label} applies exactly (no offset, no fuzz) to "
             f"{result.to_ref} on a fresh checkout, giving the tree the port built",
             f"- {_assertions(result)} on the ported tree, as `patchkit apply` runs them "
             "(those of the patches that take effect there)"]
    for probe in result.probes:
        state = "passed" if probe.ok else ("ran past its deadline" if probe.returncode is None
                                           else f"FAILED (exit {probe.returncode})")
        said = f": {probe.summary}" if probe.summary else ""
        lines.append(f"- probe `{probe.command}`: {state} in {probe.seconds:g} s{said}")
        if not probe.ok and probe.output:
            lines += ["", "  ```text", *["  " + ln for ln in probe.output.splitlines()],
                      "  ```"]
    if result.base_image is not None:
        lines.append(f"- {_base_line(result.base_image)}")
    if not result.probes and not result.needs_a_hand:
        lines.append("- no probes: the manifest names none (`bump.probes`)")
    elif not result.probes:
        lines.append("- no probe ran: the port needs a hand first")
    lines.append("- not proven: no server was started and no GPU was used; the runtime "
                 "markers and acceptance floors are judged on a real launch "
                 "(`patchkit verify --log`, `patchkit smoke`)")
    return lines


def _base_line(move: BaseMove) -> str:
    """What became of ``image.base``, and what was proven of it, in one line."""
    if move.new is None:
        return f"image.base {move.proof}"
    if move.template:
        return f"image.base names the release itself: `{move.new}`: {move.proof}"
    return f"image.base moved `{move.old}` -> `{move.new}`: {move.proof}"


def _assertions(result: Bump) -> str:
    n = result.assertions
    if result.assertions_failed:
        return f"{result.assertions_failed} of {n} `verify:` assertions FAIL"
    if n == 0:
        return "no `verify:` assertion ran"
    return f"{n} `verify:` assertion{'s ran and hold' if n != 1 else ' ran and holds'}"


def _cell(text: str) -> str:
    return " ".join((text or "").split()).replace("|", "\\|")


def summary(result: Bump) -> str:
    """The closing line of a text run, on stderr."""
    if result.to_ref is None:
        return current(result)
    if result.needs_a_hand:
        where = f" (left in {result.worktree})" if result.worktree else ""
        return f"needs a hand: {result.label} {result.to_ref}: {result.why}{where}"
    if result.dry_run:
        return f"dry run: {result.label} {result.from_ref} -> {result.to_ref} would be bumped"
    if result.status is BumpStatus.UNCHANGED:
        return (f"nothing new: {result.branch} holds {result.label} {result.from_ref} -> "
                f"{result.to_ref} already ({result.commit[:12]}); nothing written")
    pushed = f", pushed to {result.pushed}" if result.pushed else ""
    return (f"ok: {result.label} {result.from_ref} -> {result.to_ref} on {result.branch} "
            f"({result.commit[:12]}){pushed}")
