"""rebase-check: the series against newer vLLM releases, as a patch x release matrix.

Each target is resolved once, checked out in a scratch directory and run through the same
engine as ``apply``; targets run side by side in worker processes.  The checkout is a shared clone (the cached
objects are borrowed, never copied) and sparse: only the files the series reads or writes (the
diffs' files, the transforms' ``path``, the overlay files, the assertion files) are written out,
which turns a checkout of thousands of files into one of a few.  When those files cannot all be
named up front (a diff that does not parse, a transform that does not import) the checkout is
full, so the engine reports the failure exactly as ``apply`` would.  ``--workdir`` is never
touched.  Renderers turn the matrix into text for a person, JSON for scripts, Markdown for a CI
job summary and JUnit XML for a CI test report.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import re
import shutil
import tempfile
import traceback
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path

from packaging.version import InvalidVersion, Version

from patchkit import diffapply, engine, interrupt, overlay, source, transform
from patchkit.errors import PatchkitError, SourceError, UsageError
from patchkit.manifest import Manifest, Patch
from patchkit.report import ApplyReport, PatchResult
from patchkit.util import cache_dir

_PULL = re.compile(r"github\.com/vllm-project/vllm/pull/(\d+)")


class CheckProgress(engine.Progress):
    """What rebase-check tells as it goes (in the calling process, as each target is done)."""

    def target(self, report: ApplyReport) -> None:
        pass


# ------------------------------------------------------------------------------ the targets

def release_version(tag: str) -> Version | None:
    """The version a release tag ``vX.Y.Z`` (also ``vX.Y.ZrcN``, ``.postN``) names, else None."""
    if not tag.startswith("v"):
        return None
    try:
        v = Version(tag[1:])
    except InvalidVersion:
        return None
    return v if str(v) == tag[1:] and not v.local else None


def pin_version(manifest: Manifest, repos: Sequence[str], cache: Path,
                log=lambda m: None) -> Version:
    v = release_version(manifest.vllm.ref)
    if v is not None:
        return v
    resolved = source.resolve(repos, manifest.vllm.ref, cache, log)
    try:
        return Version(resolved.version or "")
    except InvalidVersion:
        raise SourceError(f"cannot tell which releases come after the pin {manifest.vllm.ref!r}: "
                          "it is no release and has none below it; name targets with --to") from None


def release_targets(manifest: Manifest, *, repos: Sequence[str] | None = None,
                    cache: Path | None = None, pre: bool = False,
                    log=lambda m: None) -> list[str]:
    """The release tags after the pin, oldest first; pre-releases only with ``pre``."""
    repos = tuple(repos or engine.manifest_sources(manifest))
    cache = cache or cache_dir()
    pin = pin_version(manifest, repos, cache, log)
    _, tags = source.list_tags(repos, cache, log)
    found: dict[Version, str] = {}
    for tag in tags:
        v = release_version(tag)
        if v is None or v <= pin or (v.is_prerelease and not pre):
            continue
        found.setdefault(v, tag)
    return [found[v] for v in sorted(found)]


# ------------------------------------------------------------------------------ the matrix

@dataclass
class Row:
    """One patch across the targets."""

    patch: Patch
    cells: list[PatchResult]
    upstream_since: str | None = None  # the first target of the run of `upstream` to the last
    drop: bool = False                 # upstream in every target

    @property
    def pull(self) -> int | None:
        m = _PULL.search(self.patch.upstream or "")
        return int(m.group(1)) if m else None


@dataclass
class Matrix:
    manifest: Manifest
    targets: list[ApplyReport] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(t.ok for t in self.targets)

    @property
    def refs(self) -> list[str]:
        return [t.vllm.ref for t in self.targets]

    def rows(self) -> list[Row]:
        rows = []
        for i, patch in enumerate(self.manifest.patches):
            cells = [t.patches[i] for t in self.targets]
            row = Row(patch, cells)
            run = 0
            for c in reversed(cells):
                if c.status != "upstream":
                    break
                run += 1
            if run:
                row.upstream_since = self.targets[len(cells) - run].vllm.ref
                row.drop = run == len(cells)
            rows.append(row)
        return rows

    def failures(self) -> list[tuple[ApplyReport, PatchResult]]:
        return [(t, r) for t in self.targets for r in t.patches if r.status == "failed"]

    def to_dict(self) -> dict:
        return {
            "ok": self.ok,
            "name": self.manifest.name,
            "pin": self.manifest.vllm.ref,
            "targets": [t.to_dict() for t in self.targets],
            "patches": [{"id": r.patch.id, "kind": r.patch.kind, "upstream": r.patch.upstream,
                         "pull": r.pull, "upstream_since": r.upstream_since, "drop": r.drop,
                         "status": {t.vllm.ref: c.status if c.status != "failed" else
                                    f"failed:{c.reason}" for t, c in zip(self.targets, r.cells)}}
                        for r in self.rows()],
        }


def needed_paths(manifest: Manifest) -> list[str] | None:
    """Every checkout path the series can read or write, or None when some cannot be named."""
    found: list[str] = []
    for p in manifest.patches:
        file = manifest.root / p.path
        try:
            if p.kind == "diff":
                found += diffapply.touched(diffapply.parse(file.read_text(
                    encoding="utf-8", errors="surrogateescape")))
            elif p.kind == "transform":
                found += [cls.path for cls in transform.load_transforms(file)]
            else:
                found += overlay.files_of(file)
        except (OSError, diffapply.DiffParseError, transform.TransformLoadError):
            return None
        found += [a.file for a in p.verify]
    return sorted(set(found))


def check(manifest: Manifest, refs: Sequence[str], *, repos: Sequence[str] | None = None,
          cache: Path | None = None, jobs: int | None = None,
          progress: CheckProgress | None = None, sparse: bool = True) -> Matrix:
    """Apply the series to each of ``refs`` in a scratch checkout and run the assertions."""
    progress = progress or CheckProgress()
    repos = tuple(repos or engine.manifest_sources(manifest))
    cache = cache or cache_dir()
    resolved = [source.resolve(repos, ref, cache, progress.info) for ref in dict.fromkeys(refs)]
    resolved = _by_version(resolved)
    matrix = Matrix(manifest)
    if not resolved:
        return matrix
    # Two per core: with 3 targets on 2 cores, 2 workers would leave a core idle while the
    # third target runs alone; 3 let the OS share both cores out (measured: 3.5 s vs 4.3 s).
    workers = max(1, min(jobs or 2 * (os.cpu_count() or 1), len(resolved)))
    paths = needed_paths(manifest) if sparse else None
    scratch = Path(tempfile.mkdtemp(prefix="patchkit-rebase-check-"))
    try:
        work = [(manifest, res, scratch / str(n), paths) for n, res in enumerate(resolved)]
        if workers == 1:
            for job in work:
                matrix.targets.append(_unwrap(_one(*job)))
                progress.target(matrix.targets[-1])
        else:
            matrix.targets = _in_processes(work, workers, progress)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return matrix


def _one(manifest: Manifest, res: source.Resolved, tree: Path, paths: list[str] | None
         ) -> tuple[str, object]:
    """One target, in a worker: an ApplyReport, or what stopped it as plain values (not every
    exception survives pickling)."""
    try:
        try:
            source.checkout(res, tree, paths)
            return "report", engine.run_series(manifest, tree, res)
        finally:
            shutil.rmtree(tree, ignore_errors=True)
    except interrupt.Interrupted as exc:
        return "interrupted", exc.signum
    except PatchkitError as exc:
        return "error", (type(exc).exit_code, str(exc))
    except Exception as exc:  # noqa: BLE001  # a bug: carried to the parent, reported as one
        return "bug", f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"


class TargetError(PatchkitError):
    """A worker's expected failure, with the exit code of the original error."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def _unwrap(outcome: tuple[str, object]) -> ApplyReport:
    kind, value = outcome
    if kind == "report":
        assert isinstance(value, ApplyReport)
        return value
    if kind == "interrupted":
        raise interrupt.Interrupted(int(value))  # type: ignore[arg-type]
    if kind == "error":
        code, message = value  # type: ignore[misc]
        raise TargetError(message, code)
    raise RuntimeError(f"a rebase-check worker failed: {value}")


def _in_processes(jobs: list, workers: int, progress: CheckProgress) -> list[ApplyReport]:
    """Targets side by side in worker processes: the work includes libcst transforms and AST
    parsing, pure Python that threads would run one at a time.  Forked workers start with
    everything imported; ^C reaches them through the process group and each stops at its next
    clean point, like the engine does in one process."""
    methods = multiprocessing.get_all_start_methods()
    ctx = multiprocessing.get_context("fork" if "fork" in methods else "spawn")
    results: list[ApplyReport | None] = [None] * len(jobs)
    with ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as pool:
        futures = {pool.submit(_one, *job): n for n, job in enumerate(jobs)}
        try:
            for fut in as_completed(futures):
                interrupt.check()
                report = _unwrap(fut.result())
                results[futures[fut]] = report
                progress.target(report)
        except BaseException:
            for fut in futures:
                fut.cancel()
            raise
    return [r for r in results if r is not None]


def _by_version(resolved: list[source.Resolved]) -> list[source.Resolved]:
    try:
        return sorted(resolved, key=lambda r: Version(r.version or ""))
    except InvalidVersion:
        return resolved  # a target of unknown release: keep the order given


# ------------------------------------------------------------------------------ rendering

def cell_word(r: PatchResult) -> str:
    if r.status == "failed":
        return r.reason or "failed"
    if r.status == "applied" and r.offsets:
        return "applied (offset)"
    return r.status


_ANSI = {"applied": "32", "upstream": "36", "skipped": "2", "failed": "1;31", "offset": "33"}


def _paint(word: str, status: str, offsets: bool, color: bool) -> str:
    if not color:
        return word
    code = _ANSI["offset" if status == "applied" and offsets else status]
    return f"\033[{code}m{word}\033[0m"


def notes(row: Row, markdown: bool = False) -> list[str]:
    """The notes column: drop candidate or upstream-since, and the vLLM pull request."""
    out = []
    if row.drop:
        drop = "upstream in every target: drop it"
        out.append(f"**{drop}**" if markdown else drop)
    elif row.upstream_since:
        since = f"`{row.upstream_since}`" if markdown else row.upstream_since
        out.append(f"upstream since {since}")
    if row.pull:
        pull = f"vllm#{row.pull}"
        out.append(f"[{pull}]({row.patch.upstream})" if markdown else pull)
    return out


def render_text(matrix: Matrix, color: bool = False) -> str:
    m = matrix.manifest
    if not matrix.targets:
        return f"{m.name}: no targets (no vLLM release after the pin {m.vllm.ref})\n"
    rows = matrix.rows()
    head = ["patch", *matrix.refs, "notes"]
    table = [[r.patch.id, *[cell_word(c) for c in r.cells], "; ".join(notes(r))] for r in rows]
    widths = [max(len(x[i]) for x in [head, *table]) for i in range(len(head) - 1)]
    lines = [(f"{m.name}: {len(rows)} patches x {len(matrix.targets)} vLLM targets "
              f"(pinned at {m.vllm.ref})"), ""]
    lines.append("  ".join(h.ljust(w) for h, w in zip(head, widths)) + "  notes")
    for r, cells in zip(rows, table):
        out = [cells[0].ljust(widths[0])]
        for c, word, w in zip(r.cells, cells[1:-1], widths[1:]):
            out.append(_paint(word, c.status, bool(c.offsets), color) + " " * (w - len(word)))
        lines.append(("  ".join(out) + "  " + cells[-1]).rstrip())
    failed = matrix.failures()
    if failed:
        lines += ["", "failed:"]
        lines += [f"  {r.id} @ {t.vllm.ref}: {r.reason}: {r.message}" for t, r in failed]
    offsets = [(t, r) for t in matrix.targets for r in t.patches if r.offsets]
    if offsets:
        lines += ["", "offsets (fine; `patchkit rebase` rewrites them to apply exactly):"]
        lines += [f"  {r.id} @ {t.vllm.ref}: {'; '.join(r.offsets)}" for t, r in offsets]
    drop = [r.patch.id for r in rows if r.drop]
    if drop:
        lines += ["", (f"upstream in every target, to drop: {', '.join(drop)} "
                       f"(patchkit rebase --to {matrix.refs[-1]} --drop-upstream)")]
    lines.append("")
    if matrix.ok:
        lines.append(f"ok: the series applies to {len(matrix.targets)} of {len(matrix.targets)} "
                     "targets")
    else:
        bad = [t.vllm.ref for t in matrix.targets if not t.ok]
        lines.append(f"FAILED: {_failures(len(failed))} on {len(bad)} of "
                     f"{len(matrix.targets)} targets ({', '.join(bad)})")
    return "\n".join(lines) + "\n"


def _failures(n: int) -> str:
    return f"{n} patch failure{'s' if n != 1 else ''}"


_MD_ICON = {"applied": "✅", "upstream": "⬆️", "skipped": "⏭️", "failed": "❌"}


def _md(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render_markdown(matrix: Matrix) -> str:
    m = matrix.manifest
    out = [f"## vLLM rebase-check: {m.name}", ""]
    if not matrix.targets:
        out.append(f"No vLLM release after the pin `{m.vllm.ref}`: nothing to check.")
        return "\n".join(out) + "\n"
    verdict = ("✅ the series applies to every target" if matrix.ok else
               f"❌ {_failures(len(matrix.failures()))}")
    out += [(f"Pinned at `{m.vllm.ref}`; {len(m.patches)} patches x {len(matrix.targets)} "
             f"targets: {verdict}."), ""]
    out.append("| patch | " + " | ".join(f"`{ref}`" for ref in matrix.refs) + " | notes |")
    out.append("|---" * (len(matrix.targets) + 2) + "|")
    rows = matrix.rows()
    for r in rows:
        cells = [f"{_MD_ICON[c.status]} {cell_word(c)}" for c in r.cells]
        note = " · ".join(notes(r, markdown=True))
        out.append(f"| `{r.patch.id}` | " + " | ".join(cells) + f" | {_md(note)} |")
    failed = matrix.failures()
    if failed:
        out += ["", "### Failures", ""]
        for t, r in failed:
            out += [(f"<details><summary><code>{r.id}</code> on <code>{t.vllm.ref}</code>: "
                     f"{r.reason}</summary>"), "", "```text", failure_text(matrix, t, r), "```", "",
                    "</details>", ""]
    drop = [r.patch.id for r in rows if r.drop]
    if drop:
        out += ["", (f"Upstream in every target: {', '.join(f'`{d}`' for d in drop)}. "
                     f"Drop with `patchkit rebase --to {matrix.refs[-1]} --drop-upstream`.")]
    return "\n".join(out).rstrip() + "\n"


def failure_text(matrix: Matrix, target: ApplyReport, r: PatchResult) -> str:
    """The whole story of one failure: the message, then the hunk that did not apply or the
    assertions that did not hold."""
    lines = [f"{r.reason}: {r.message}"]
    if r.reason in ("conflict", "fuzz"):
        hunk = _failed_hunk(matrix.manifest, r)
        if hunk:
            lines += ["", "the hunk:", hunk.rstrip("\n")]
    failed = [a for a in target.verify if a.patch == r.id and not a.ok]
    if failed:
        lines += ["", "assertions that do not hold:"]
        lines += [f"  {a.location()}: {a.message}" for a in failed]
    return "\n".join(lines)


_HUNK = re.compile(r"^hunk (\d+) of (.+?): ")


def _failed_hunk(manifest: Manifest, r: PatchResult) -> str | None:
    from patchkit import diffapply

    m = _HUNK.match(r.message)
    if not m:
        return None
    try:
        patch = manifest.patch(r.id)
        text = (manifest.root / patch.path).read_text(encoding="utf-8", errors="replace")
        parsed = diffapply.parse(text)
    except (KeyError, OSError, diffapply.DiffParseError):
        return None
    n, path = int(m.group(1)), m.group(2)
    for pf in parsed:
        if path in (pf.path, pf.source_file[2:], pf.target_file[2:]) and 0 < n <= len(pf):
            return str(pf[n - 1])
    return None


def render_junit(matrix: Matrix) -> str:
    """One testsuite per target, one testcase per patch."""
    total = sum(len(t.patches) for t in matrix.targets)
    failures = len(matrix.failures())
    skipped = sum(r.status == "skipped" for t in matrix.targets for r in t.patches)
    suites = ET.Element("testsuites", name=f"patchkit rebase-check {matrix.manifest.name}",
                        tests=str(total), failures=str(failures), errors="0",
                        skipped=str(skipped))
    for t in matrix.targets:
        suite = ET.SubElement(
            suites, "testsuite", name=f"vLLM {t.vllm.ref}", tests=str(len(t.patches)),
            failures=str(sum(r.status == "failed" for r in t.patches)), errors="0",
            skipped=str(sum(r.status == "skipped" for r in t.patches)))
        props = ET.SubElement(suite, "properties")
        for name, value in (("vllm.ref", t.vllm.ref), ("vllm.commit", t.vllm.commit),
                            ("vllm.version", t.vllm.version or "")):
            ET.SubElement(props, "property", name=name, value=value)
        for r in t.patches:
            case = ET.SubElement(suite, "testcase", classname=f"vllm-{t.vllm.ref}", name=r.id)
            if r.status == "failed":
                fail = ET.SubElement(case, "failure", type=r.reason or "failed",
                                     message=f"{r.reason}: {r.message}"[:500])
                fail.text = failure_text(matrix, t, r)
            elif r.status == "skipped":
                ET.SubElement(case, "skipped", message=r.message)
            else:
                detail = [r.status] + ([r.message] if r.message else []) + r.offsets
                ET.SubElement(case, "system-out").text = "\n".join(detail)
    ET.indent(suites)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(suites, encoding="unicode") + "\n"


def render_json(matrix: Matrix) -> str:
    return json.dumps(matrix.to_dict(), indent=2) + "\n"


RENDERERS = {"json": render_json, "markdown": render_markdown, "junit": render_junit}


def render(matrix: Matrix, fmt: str, color: bool = False) -> str:
    if fmt == "text":
        return render_text(matrix, color)
    try:
        return RENDERERS[fmt](matrix)
    except KeyError:
        raise UsageError(f"unknown format {fmt!r}") from None
