"""The command line: parses, calls the core, maps errors to exit codes.  No logic here."""

from __future__ import annotations

import json
import sys
import traceback
from pathlib import Path

import click

from patchkit import __version__, interrupt
from patchkit.errors import PatchkitError
from patchkit.report import ApplyReport, PatchResult
from patchkit.verify import format_failure

COLORS = {"applied": "green", "upstream": "cyan", "skipped": "yellow", "failed": "red"}


def echo(message: str = "", err: bool = False) -> None:
    click.echo(message, err=err)


def status_word(status: str, stream_is_tty: bool) -> str:
    word = f"{status:<9}"
    return click.style(word, fg=COLORS.get(status), bold=status == "failed") if stream_is_tty else word


def patch_line(r: PatchResult, tty: bool = False) -> str:
    detail = f"{r.reason}: {r.message}" if r.status == "failed" else r.message
    line = f"{status_word(r.status, tty)} {r.id}"
    if r.commit:
        line += f" [{r.commit[:10]}]"
    if r.offsets:
        line += " (" + "; ".join(r.offsets) + ")"
    if detail:
        line += f": {detail}"
    return line


class TextProgress:
    """Prints a line per patch as it goes."""

    def __init__(self, err: bool = False) -> None:
        self.err = err
        self.tty = (sys.stderr if err else sys.stdout).isatty()

    def info(self, message: str) -> None:
        echo(message, err=True)

    def patch(self, result: PatchResult) -> None:
        echo(patch_line(result, self.tty), err=self.err)


def summary(report: ApplyReport) -> str:
    counts: dict[str, int] = {}
    for p in report.patches:
        counts[p.status] = counts.get(p.status, 0) + 1
    parts = ", ".join(f"{n} {s}" for s, n in counts.items()) or "no patches"
    passed = sum(a.ok for a in report.verify)
    text = (f"{parts}; {passed}/{len(report.verify)} assertions passed "
            f"(vLLM {report.vllm.ref} = {report.vllm.commit[:12]}, version {report.vllm.version})")
    return text


def render_apply(report: ApplyReport, fmt: str) -> None:
    if fmt == "json":
        echo(report.to_json())
        return
    for a in report.verify:
        if not a.ok:
            echo(format_failure(a))
    if report.ok:
        echo(f"ok: {summary(report)}; checkout at {report.workdir}")
    else:
        echo(f"FAILED: {summary(report)}")
        if report.keep_failed:
            echo(f"the failed checkout is kept at {report.keep_failed}")
        else:
            echo(f"{report.workdir} is left as it was")


FORMAT = click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text",
                      show_default=True, help="Report format.")
MANIFEST = click.option("--manifest", "manifest_path", default="patchset.yaml", show_default=True,
                        type=click.Path(dir_okay=False), help="The patchset manifest.")
VLLM_REF = click.option("--vllm-ref", "ref",
                        help="Tag, branch or commit (default: vllm.ref of the manifest).")
VLLM_REPO = click.option("--vllm-repo", "repos", multiple=True,
                         help="Git URL, local git path, or 'pypi'; repeat to try several in order "
                              "(default: vllm.repo of the manifest).")
DEFAULT_WORKDIR = ".patchkit/vllm"


def workdir_option(help: str):
    return click.option("--workdir", default=DEFAULT_WORKDIR, show_default=True,
                        type=click.Path(file_okay=False), help=help)


def _load(manifest_path: str):
    from patchkit import manifest

    return manifest.load(Path(manifest_path))


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="patchkit")
def cli() -> None:
    """Exact, fail-closed patch series for vLLM.

    \b
    Typical use:
      patchkit validate                      check patchset.yaml and the files it names
      patchkit apply                         apply the series to the pinned vLLM (.patchkit/vllm)
      patchkit verify --tree .patchkit/vllm  re-run the AST assertions
      patchkit build-image                   build the linux/arm64 image
      patchkit rebase-check --releases       how the series fares on newer vLLM releases
    """


@cli.command()
@MANIFEST
def validate(manifest_path: str) -> int:
    """Check the manifest and the files it names, and nothing else."""
    m = _load(manifest_path)
    echo(f"{manifest_path}: ok ({len(m.patches)} patches, vLLM {m.vllm.ref})")
    return 0


@cli.command()
@VLLM_REF
@VLLM_REPO
@workdir_option("Where the patched checkout goes.")
@click.option("--keep-failed", is_flag=True, help="Keep the scratch checkout of a failed run and say where.")
@MANIFEST
@FORMAT
def apply(ref, repos, workdir, keep_failed, manifest_path, fmt) -> int:
    """Apply the series to a pinned vLLM checkout, one commit per patch, then verify."""
    from patchkit.engine import apply_series

    m = _load(manifest_path)
    report = apply_series(m, ref=ref, repos=repos or None, workdir=Path(workdir),
                          keep_failed=keep_failed, progress=TextProgress(err=fmt == "json"))
    render_apply(report, fmt)
    return 0 if report.ok else 1


@cli.command()
@click.option("--tree", type=click.Path(file_okay=False),
              help=f"A patched checkout (default: {DEFAULT_WORKDIR}).")
@click.option("--image", help="An image: read its files without running it.")
@MANIFEST
@FORMAT
def verify(tree, image, manifest_path, fmt) -> int:
    """Run the AST assertions alone, on a tree or an image."""
    import json

    from patchkit import commands

    m = _load(manifest_path)
    if tree and image:
        raise click.UsageError("give --tree or --image, not both")
    if image:
        from patchkit.commands.build_image import verify_image

        results, where = verify_image(m, image), image
    else:
        where = tree or DEFAULT_WORKDIR
        results = commands.verify_tree(m, Path(where))
    ok = all(a.ok for a in results)
    if fmt == "json":
        echo(json.dumps({"ok": ok, "target": where,
                         "verify": [a.__dict__ for a in results]}, indent=2))
    else:
        for a in results:
            if not a.ok:
                echo(format_failure(a))
        passed = sum(a.ok for a in results)
        echo(f"{'ok' if ok else 'FAILED'}: {passed}/{len(results)} assertions passed on {where}")
    return 0 if ok else 1


MATRIX_FORMATS = ("text", "json", "markdown", "junit")


class CheckProgress:
    """rebase-check tells on stderr as each target is done; the matrix goes to stdout."""

    def info(self, message: str) -> None:
        echo(message, err=True)

    def patch(self, result: PatchResult) -> None:
        pass

    def target(self, report: ApplyReport) -> None:
        failed = sum(p.status == "failed" for p in report.patches)
        echo(f"vLLM {report.vllm.ref}: {'ok' if report.ok else f'{failed} failed'}", err=True)


@cli.command("rebase-check")
@click.option("--to", "refs", multiple=True, metavar="REF", help="A vLLM ref to check; repeat.")
@click.option("--releases", is_flag=True, help="Every release tag vX.Y.Z after the pin.")
@click.option("--pre", is_flag=True, help="With --releases: pre-releases too.")
@VLLM_REPO
@click.option("--jobs", "-j", type=click.IntRange(min=1), help="Targets checked at once "
              "(default: two per core).")
@click.option("--output", "outputs", multiple=True, metavar="FORMAT:FILE",
              help="Also write the report in FORMAT (text, json, markdown, junit) to FILE; repeat.")
@MANIFEST
@click.option("--format", "fmt", type=click.Choice(MATRIX_FORMATS),
              default="text", show_default=True, help="Report format on stdout.")
def rebase_check(refs, releases, pre, repos, jobs, outputs, manifest_path, fmt) -> int:
    """Apply the series to newer vLLM refs in scratch checkouts; print the patch x release
    matrix.  Exit 1 if any patch fails anywhere."""
    from patchkit import rebasecheck

    if not refs and not releases:
        raise click.UsageError("give --to REF (repeatable) or --releases")
    if pre and not releases:
        raise click.UsageError("--pre goes with --releases")
    sinks = []
    for spec in outputs:
        kind, sep, path = spec.partition(":")
        if not sep or not path or kind not in MATRIX_FORMATS:
            raise click.UsageError(f"--output {spec!r}: expected FORMAT:FILE with FORMAT one of "
                                   + ", ".join(MATRIX_FORMATS))
        if not Path(path).parent.is_dir():
            raise click.UsageError(f"--output {spec!r}: no folder {Path(path).parent}")
        sinks.append((kind, Path(path)))
    m = _load(manifest_path)
    progress = CheckProgress()
    targets = list(refs)
    if releases:
        found = rebasecheck.release_targets(m, repos=repos or None, pre=pre, log=progress.info)
        echo(f"releases after {m.vllm.ref}: {', '.join(found) or 'none'}", err=True)
        targets += found
    matrix = rebasecheck.check(m, targets, repos=repos or None, jobs=jobs, progress=progress)
    for kind, path in sinks:
        try:
            path.write_text(rebasecheck.render(matrix, kind))
        except OSError as exc:
            raise click.FileError(str(path), exc.strerror) from None
    click.echo(rebasecheck.render(matrix, fmt, color=fmt == "text" and sys.stdout.isatty()),
               nl=False)
    return 0 if matrix.ok else 1


@cli.command()
@click.option("--to", "ref", metavar="REF", help="The vLLM ref to move the pin to.")
@click.option("--continue", "cont", is_flag=True, help="Go on after resolving a stop.")
@click.option("--abort", is_flag=True, help="Put the manifest and every patch file back.")
@click.option("--drop-upstream", is_flag=True,
              help="Remove patches the target already has, instead of marking them with a "
                   "vllm: range.")
@VLLM_REPO
@MANIFEST
def rebase(ref, cont, abort, drop_upstream, repos, manifest_path) -> int:
    """Move the pin to REF: refresh what drifted, mark what went upstream, stop at a conflict.

    \b
    patchkit rebase --to v0.33.0     start; stops where a person must decide
    patchkit rebase --continue       take the resolution and go on
    patchkit rebase --abort          put everything back as it was
    """
    from patchkit import rebase as rb

    if sum(bool(x) for x in (ref, cont, abort)) != 1:
        raise click.UsageError("give exactly one of --to REF, --continue, --abort")
    if (cont or abort) and (drop_upstream or repos):
        raise click.UsageError("--drop-upstream and --vllm-repo go with --to")
    progress = TextProgress(err=True)
    if abort:
        restored = rb.abort(Path(manifest_path))
        echo(f"rebase aborted; restored {', '.join(restored) if restored else 'nothing (no file had changed)'}")
        return 0
    if cont:
        result = rb.resume(Path(manifest_path), progress=progress)
    else:
        result = rb.start(Path(manifest_path), ref, repos=repos or None,
                          drop_upstream=drop_upstream, progress=progress)
    for step in result.steps:
        echo(f"{step.action:<9} {step.id}" + (f": {step.detail}" if step.detail else ""))
    for note in result.notes:
        echo(f"note: {note}")
    if result.stop:
        echo()
        for line in result.stop.instructions:
            echo(line)
        return 1
    echo(f"ok: rebased from vLLM {result.from_ref} to {result.to_ref}; review with `git diff`")
    return 0


@cli.command()
@workdir_option("The applied checkout with new commits.")
@MANIFEST
def export(workdir, manifest_path) -> int:
    """Turn commits made after patchkit/applied in WORKDIR into patches and manifest entries."""
    from patchkit.export import export as run_export

    result = run_export(Path(manifest_path), Path(workdir))
    for e in result.exported:
        echo(f"{e.action:<9} {e.id}: {e.path} from {e.commit[:12]} {e.summary}")
    for note in result.notes:
        echo(f"note: {note}")
    if not result.exported:
        echo(f"nothing to export: no commit after patchkit/applied in {workdir}")
    return 0


@cli.command("build-image")
@VLLM_REF
@VLLM_REPO
@workdir_option("The applied checkout the image is made from.")
@click.option("--no-apply", is_flag=True, help="Use --workdir as it is instead of applying first.")
@click.option("--base", help="Base image (default: image.base of the manifest).")
@click.option("--tag", help="Tag of the new image; {ref} is replaced (default: image.tag).")
@click.option("--platform", help="OS/ARCH (default: image.platform, else linux/arm64).")
@click.option("--mode", type=click.Choice(["auto", "overlay", "source"]), default="auto",
              show_default=True, help="Overlay the patched files on the base, or build vLLM from source.")
@click.option("--max-jobs", type=click.IntRange(min=1), help="Source mode: parallel compile jobs.")
@click.option("--nvcc-threads", type=click.IntRange(min=1), help="Source mode: threads per nvcc.")
@click.option("--push", is_flag=True, help="Push the tag to its registry.")
@click.option("--save", type=click.Path(dir_okay=False), help="Also write a 'docker load' archive.")
@MANIFEST
@FORMAT
def build_image_cmd(ref, repos, workdir, no_apply, base, tag, platform, mode, max_jobs,
                    nvcc_threads, push, save, manifest_path, fmt) -> int:
    """Build the image through the Docker Engine that DOCKER_HOST names."""
    import json

    from patchkit.commands.build_image import build_image, render_summary

    m = _load(manifest_path)
    code, result = build_image(m, workdir=Path(workdir), ref=ref, repos=repos or None, base=base,
                               tag=tag, platform=platform, push=push,
                               save=Path(save) if save else None, mode=mode, apply=not no_apply,
                               max_jobs=max_jobs, nvcc_threads=nvcc_threads,
                               progress=TextProgress(err=True))
    echo(json.dumps(result, indent=2) if fmt == "json" else render_summary(result))
    return code


@cli.command()
@click.argument("url")
@click.option("--model", metavar="NAME",
              help="The served model to ask (default: the only one /v1/models lists).")
@click.option("--min-acceptance", type=click.FloatRange(0, 1), metavar="RATE",
              help="Also require this speculative-decoding acceptance (0 to 1) over the request, "
                   "from /metrics.")
@click.option("--timeout", type=click.FloatRange(min=0, min_open=True), default=30.0,
              show_default=True, metavar="SECONDS", help="Longest wait for each request.")
@click.option("--api-key", envvar="VLLM_API_KEY", show_envvar=True, metavar="KEY",
              help="Bearer token of a server started with --api-key.")
@FORMAT
def smoke(url, model, min_acceptance, timeout, api_key, fmt) -> int:
    """Check a running vLLM OpenAI-compatible server at URL: /health, /v1/models, one chat
    answer with content, and with --min-acceptance the spec-decode acceptance.  Exit 1 if a
    check fails."""
    from patchkit.commands.smoke import run
    from patchkit.render_smoke import render_text

    report = run(url, model=model, min_acceptance=min_acceptance, timeout=timeout,
                 api_key=api_key)
    echo(json.dumps(report.to_dict(), indent=2) if fmt == "json" else render_text(report))
    return 0 if report.ok else 1


def _log_file() -> Path:
    from patchkit.util import cache_dir

    try:
        d = cache_dir()
        d.mkdir(parents=True, exist_ok=True)
        return d / "patchkit.log"
    except OSError:
        return Path("/tmp/patchkit.log")



def _json_error(argv: list[str] | None, message: str, code: int) -> int:
    """Under ``--format json`` an error is also an object on stdout: a script that parses stdout
    gets an answer, not silence."""
    args = sys.argv[1:] if argv is None else argv
    if any(a == "--format=json" or (a == "--format" and nxt == "json")
           for a, nxt in zip(args, [*args[1:], ""])):
        echo(json.dumps({"ok": False, "error": message, "exit_code": code}))
    return code


def main(argv: list[str] | None = None) -> int:
    interrupt.install()
    try:
        rv = cli.main(args=argv, prog_name="patchkit", standalone_mode=False)
        return rv if isinstance(rv, int) else 0
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except click.exceptions.Abort:
        echo("patchkit: interrupted", err=True)
        return 130
    except click.ClickException as exc:
        where = f"patchkit {exc.ctx.info_name}" if getattr(exc, "ctx", None) and exc.ctx.info_name != "patchkit" else "patchkit"
        echo(f"{where}: error: {exc.format_message()} (see '{where} --help')", err=True)
        return _json_error(argv, exc.format_message(), 2)
    except PatchkitError as exc:
        echo(f"patchkit: error: {exc}", err=True)
        return _json_error(argv, str(exc), exc.exit_code)
    except KeyboardInterrupt:
        echo("patchkit: interrupted", err=True)
        return 130
    except interrupt.Interrupted as exc:
        echo(f"patchkit: interrupted by {exc}; nothing was changed", err=True)
        return exc.exit_code
    except Exception as exc:  # a bug: one line here, the traceback in the log
        log = _log_file()
        try:
            with open(log, "a") as fh:
                fh.write(f"patchkit {__version__} {' '.join(sys.argv)}\n")
                fh.write(traceback.format_exc() + "\n")
        except OSError:
            pass
        message = f"unexpected error: {type(exc).__name__}: {exc} (traceback in {log})"
        echo(f"patchkit: {message}", err=True)
        return _json_error(argv, message, 3)
