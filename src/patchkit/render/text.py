"""Text for a person: per-patch lines, closing summaries, and the lines of each verb."""

from __future__ import annotations

from patchkit.imageref import split_tag
from patchkit.manifest import VLLM, identity
from patchkit.render import plural
from patchkit.render.colors import paint
from patchkit.render.images import NO_TIME
from patchkit.render.images import commit as shown_commit
from patchkit.report import ApplyReport, AssertionResult, PatchResult, Status


def status_word(status: Status, color: bool) -> str:
    return paint(f"{status:<9}", status, color)


def patch_line(r: PatchResult, color: bool = False) -> str:
    detail = f"{r.reason}: {r.message}" if r.status is Status.FAILED else r.message
    line = f"{status_word(r.status, color)} {r.id}"
    line += identity(r.package).aside(" ({})")
    if r.commit:
        line += f" [{r.commit[:10]}]"
    if r.offsets:
        line += " (" + "; ".join(map(str, r.offsets)) + ")"
    if detail:
        line += f": {detail}"
    return line


def target_line(report: ApplyReport) -> str:
    """One target of a matrix as it is done: ``vLLM v0.33.0: ok``, ``flashinfer v0.6.16: 1
    failed`` (a matrix over another package has that package's checkout alone)."""
    failed = sum(p.status is Status.FAILED for p in report.patches)
    name, info = next(iter(report.packages.items()), (VLLM.name, report.vllm))
    return f"{identity(name).label} {info.ref}: {'ok' if report.ok else f'{failed} failed'}"


def assertion_failure(result: AssertionResult) -> str:
    return result.failure_line()


def summary(report: ApplyReport) -> str:
    # the statuses in one order on every run: applied, upstream, skipped, failed
    counts = {s: sum(p.status is s for p in report.patches) for s in Status}
    parts = ", ".join(f"{n} {s}" for s, n in counts.items() if n) or "no patches"
    passed = sum(a.ok for a in report.verify)
    variant = f", variant {report.variant}" if report.variant else ""
    return (f"{parts}; {passed}/{len(report.verify)} assertions passed "
            f"(vLLM {report.vllm.ref} = {report.vllm.commit[:12]}, version {report.vllm.version}"
            f"{variant})")


def pin_lines(report: ApplyReport) -> list[str]:
    """One line per package other than vLLM (whose pin the summary gives): its pin, commit,
    version and source, and where its checkout goes."""
    lines = []
    for name, p in report.packages.items():
        if not identity(name).primary:
            where = f", checkout at {p.workdir}" if p.workdir else ""
            lines.append(f"{name} {p.ref} = {p.commit[:12]}, version {p.version}, from "
                         f"{p.source}{where}")
    return lines


def jit_lines(report: ApplyReport) -> list[str]:
    """One line per applied patch whose files feed a JIT module of its package (FlashInfer
    compiles them from its sources at first use): which modules, through which file."""
    lines = []
    for r in report.patches:
        files = report.jit_modules.get(r.package, {})
        fed = {f: files[f] for f in r.files if files.get(f)} if r.status == "applied" else {}
        if fed:
            modules = list(dict.fromkeys(m for mods in fed.values() for m in mods))
            lines.append(f"{r.id} feeds {r.package}'s JIT module{'s' * (len(modules) > 1)} "
                         f"{', '.join(modules)} (through {', '.join(fed)})")
    return lines


def apply(report: ApplyReport) -> str:
    lines = [assertion_failure(a) for a in report.verify if not a.ok]
    others = pin_lines(report) + jit_lines(report)
    if report.ok:
        where = f"; checkout at {report.workdir}" if report.workdir else ""
        lines.append(f"ok: {summary(report)}{where}")
        lines += others
    else:
        lines.append(f"FAILED: {summary(report)}")
        lines += others
        places = [p.workdir for p in report.packages.values() if p.workdir]
        places = places or ([report.workdir] if report.workdir else [])
        if report.keep_failed:
            lines.append(f"the failed checkout is kept at {report.keep_failed}")
        else:
            lines.append(f"{', '.join(places)} {'is' if len(places) == 1 else 'are'} left as "
                         f"{'it was' if len(places) == 1 else 'they were'}")
    return "\n".join(lines)


def holds(data: dict, created: bool = False) -> str:
    """What an image holds (image.build.Holds as a dict), as one line; with ``created``, when
    it was made (``verify --image``: build-image just made it)."""
    installed = data.get("installed") or "(version unknown)"
    commit = f" (commit {data['commit']})" if data.get("commit") else ""
    made = (f", patchset commit {shown_commit(data['patchset_commit'])}"
            if data.get("patchset_commit") else "")
    if created:
        made += f", created {data.get('created') or NO_TIME}"
    return (f"vLLM {installed}{commit}, source {data.get('source') or 'unknown'}, "
            f"fingerprint {data.get('fingerprint') or 'unknown'}{made}")


def verify(report) -> str:
    lines = [assertion_failure(a) for a in report.verify if not a.ok]
    lines += [f"{p.name} {p.version or '(version unknown)'} in {p.site}: {p.passed}/"
              f"{len(p.results)} assertions passed" for p in report.packages]
    passed = sum(a.ok for a in report.verify)
    lines.append(f"{'ok' if report.assertions_ok else 'FAILED'}: {passed}/{len(report.verify)} "
                 f"assertions passed on {report.target}")
    if report.runtime is not None:
        lines += [f"note: {note}" for note in report.notes]
        lines += runtime(report.runtime, report.logs, report.waiting)
    if report.holds is not None:
        lines.append(f"{report.target} holds {holds(report.holds.to_dict(), created=True)}")
    for name, where in getattr(report, "jit", {}).items():
        lines.append(f"{name}: JIT cache in {where['jit_cache']}, cubins in {where['cubins']} "
                     f"({where['cubins_from']})")
    if report.locked is not None:
        lines += [f"  {d}" for d in report.locked]
        lines.append(f"{'FAILED' if report.locked else 'ok'}: {report.target} was "
                     f"{'not ' if report.locked else ''}built on the locked stack"
                     + (f" ({len(report.locked)} difference(s) above)" if report.locked else ""))
    return "\n".join(lines)


def runtime(results, logs: list[str], waiting=()) -> list[str]:
    """The failures of the runtime markers, one line each (a forbidden line with its
    ``FILE:LINE:``), then those not yet judged (``waiting``: no traffic served yet), then one
    summary."""
    lines = [line for r in results if r not in waiting for line in r.failure_lines()]
    lines += [f"not yet judged: [{r.label}] {r.message}" for r in waiting]
    held = sum(r.ok for r in results)
    aside = sum(not r.judged for r in results)
    notes = ([f"{aside} not judged: their `unless` left out every log"] if aside else []) + \
            ([f"{len(waiting)} not yet judged: no traffic served yet; verify again after "
              "smoke, or give --require-traffic"] if waiting else [])
    note = f" ({'; '.join(notes)})" if notes else ""
    failed = any(not r.ok and r not in waiting for r in results)
    word = "FAILED" if failed else "NOT YET JUDGED" if waiting else "ok"
    lines.append(f"{word}: {held}/{len(results)} runtime markers hold in "
                 f"{', '.join(logs)}{note}")
    return lines


def rebase(result) -> str:
    """The rebase's one list of what it did to each patch, under a heading saying which move
    it is (no patch line is said while it runs: the list would come twice)."""
    if result.aborted:
        return ("rebase aborted; restored "
                + (", ".join(result.restored) or "nothing (no file had changed)"))
    lines = [f"{result.label} {result.from_ref} -> {result.to_ref}, patch by patch:"]
    lines += [f"{step.action:<9} {step.id}" + (f": {step.detail}" if step.detail else "")
              for step in result.steps]
    lines += [f"note: {note}" for note in result.notes]
    if result.stop:
        lines.append("")
        lines += result.stop.instructions
    else:
        lines.append(f"ok: rebased from {result.label} {result.from_ref} to {result.to_ref}; "
                     "review with "
                     "`git diff`")
    return "\n".join(lines)


def export(result, workdir: str) -> str:
    lines = [f"{e.action:<9} {e.id}: {e.path} from {e.commit[:12]} {e.summary}"
             for e in result.exported]
    lines += [f"note: {note}" for note in result.notes]
    if not result.exported:
        lines.append(f"nothing to export: no commit after patchkit/applied in {workdir}")
    return "\n".join(lines)


def build_image(report) -> str:
    """The closing lines of a text run of build-image (a ``commands.build_image.BuildReport``)."""
    if not report.built:
        return f"FAILED: {report.error}"
    image_id = report.image_id or "(pushed by the build)"
    what = f"{report.tag} {image_id[:19]} ({report.platform}, {report.mode} mode"
    what += ", reused)" if report.reused else ")"
    lines = [f"ok: {what}"]
    if report.immutable_tag:
        lines.append(f"  for good: {report.immutable_tag} (rollback --to takes it)")
    if report.layer:
        lines.append(f"  layer: {report.layer.files} file(s), {report.layer.bytes} bytes"
                     + (f", {report.layer.whiteouts} whiteout(s)" if report.layer.whiteouts else ""))
    if report.holds is not None:
        lines.append(f"  holds: {holds(report.holds.to_dict())}")
    serves = getattr(report, "serves", None)
    if serves and serves["from"] == "base":
        shown = " ".join(serves["command"]) or "nothing"
        lines.append(f"  serves: the base's command, unchanged ({shown}): the patchset gives "
                     "no image.serve.command nor build/serve.sh (docs/serving.md)")
    elif serves and serves["command"]:
        lines.append(f"  serves: {' '.join(serves['command'])} (from {serves['from']})")
    if report.base:
        lines.append(f"  base: {report.base['name']} @ {report.base['digest']}")
    if report.digest:
        lines.append(f"  digest: {report.digest}")
        lines.append(f"  other node: docker pull {split_tag(report.tag)[0]}@{report.digest}")
    if report.saved:
        lines.append(f"  other node: docker load -i {report.saved['path']}")
    if report.layer is not None and not report.digest and not report.saved and not report.copy:
        # an overlay image is a function of its inputs: the same build elsewhere gives the same id
        lines.append(f"  other node: the same command against the same base gives image "
                     f"{image_id[:19]}")
    if report.copy is not None:
        from patchkit.render.copy import target_line, via_line

        copied = report.copy.to_dict()
        if copied.get("via"):
            lines.append(f"  copy: {via_line(copied['via'])}")
        lines += [f"  copy: {target_line(t)}" for t in copied["targets"]]
        if not copied["ok"]:
            failed = sum(not t.ok for t in report.copy.targets)
            lines.append(f"FAILED: {report.tag} was built, but {failed} of "
                         f"{len(copied['targets'])} copies failed")
    return "\n".join(lines)


def validate(v) -> str:
    """The parenthesis of validate's line (a ``commands.validate.Validated``): what was
    counted and compiled."""
    m = v.manifest
    parts = [plural(len(m.patches), "patch", "patches")]
    done = {"diff": "parsed", "transform": "imported", "overlay": "listed"}
    parts += [f"{plural(n, kind)} {done.get(kind, 'checked')}" for kind, n in v.kinds.items()]
    asserted = sum(len(p.verify) for p in m.patches)
    if asserted:
        parts.append(plural(asserted, "assertion"))
    markers = len(m.runtime) + sum(len(p.runtime) for p in m.patches)
    if markers:
        parts.append(plural(markers, "runtime marker"))
    return ", ".join(parts)


def status(st) -> str:
    """``patchkit status``: a block per package, its checkout, its patches, what to do."""
    lines = [f"{st.name} ({st.manifest})"]
    if st.settings:
        lines.append("settings changed since the apply (outside patches:): "
                     + ", ".join(st.settings))
    for p in st.packages:
        what = identity(p.name).label
        if not p.applied:
            lines.append(f"{what}: " + "; ".join(p.remedies))
            continue
        r = p.report
        pin = r.packages.get(p.name) or r.vllm
        lines.append(f"{what}: {p.workdir} holds {pin.ref} = {(pin.commit or '?')[:12]}, "
                     f"version {pin.version}, variant {r.variant or '(default)'}")
        counts = ", ".join(f"{len(ids)} {s}" for s, ids in p.patches.items() if ids)
        lines.append(f"  patches: {counts or 'none'}")
        for s, ids in p.patches.items():
            if ids:
                lines.append(f"    {s + ':':<10} {' '.join(ids)}")
        c = p.changes
        said = [f"{k} {' '.join(v)}" for k, v in (("added", c.added), ("edited", c.edited),
                                                  ("removed", c.removed)) if v]
        if c.pin:
            said.append(f"the pin moved from {c.pin[0]} to {c.pin[1]}")
        if said:
            lines.append("  manifest changed since the apply: " + "; ".join(said))
        elif c.edited is None:
            lines.append("  manifest: patches added or removed since the apply: none (edits "
                         "are not known: the checkout predates patch digests)")
        if not p.work and not c:
            lines.append("  clean: the checkout is the manifest's series, nothing more")
        for remedy in p.remedies:
            lines.append(f"  {remedy}")
    return "\n".join(lines)
