"""The command line: click parsing only.  Each verb calls ``commands.<verb>.run`` and a renderer;
errors go to the one handler in ``errors``."""

from __future__ import annotations

import json
import re
import os
import sys
from pathlib import Path

import click

from patchkit import __version__, errors, interrupt
from patchkit.manifest import discovery
from patchkit.timeouts import DEFAULT_TIMEOUT

DEFAULT_WORKDIR = discovery.WORKDIR.as_posix()   # shown in the help; the one default is there
FOUND = "found here or in a folder above"
DISCARD = click.option("--discard", is_flag=True,
                       help="Replace a workdir that holds commits, changes or untracked files "
                            "(they are saved in a git bundle beside it first).")


def echo(message: str = "", err: bool = False) -> None:
    click.echo(message, err=err)


class Output:
    """``-q`` / ``-v`` of the running verb: what goes to stderr besides errors."""

    quiet = False
    verbose = False
    said: set[str] = set()
    # -q / -v given before the verb (`patchkit -q apply`): as if given after it
    before = (False, False)


def say(message: str) -> None:
    """A line about the work under way (stderr): not with ``-q``, and once per run (every
    target of a run meeting the same unreachable source says the same line)."""
    if not Output.quiet and message not in Output.said:
        Output.said.add(message)
        echo(errors.bounded(message), err=True)


class TextProgress:
    """Tells as it goes: a line per patch (``patches``), a line per rebase-check target; the
    report itself goes to stdout."""

    def __init__(self, err: bool = False, patches: bool = True) -> None:
        self.err = err
        self.patches = patches
        self.tty = (sys.stderr if err else sys.stdout).isatty()

    def info(self, message: str) -> None:
        say(message)

    def patch(self, result) -> None:
        from patchkit.render.text import patch_line

        if self.patches and not (Output.quiet and self.err):
            echo(patch_line(result, self.tty), err=self.err)

    def target(self, report) -> None:
        from patchkit.render.text import target_line

        say(target_line(report))


class Verb(click.Command):
    """A subcommand that knows whether it was asked for JSON, even when its flags do not parse:
    then an error is also a JSON object on stdout, so a script that parses stdout gets an
    answer, not silence.  Every verb takes ``-q`` and ``-v``."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.params += [
            click.Option(["-q", "--quiet"], is_flag=True,
                         help="Say nothing on stderr but errors: no progress, no notes."),
            click.Option(["-v", "--verbose"], is_flag=True,
                         help="Also show each git and pip command as it runs.")]

    def invoke(self, ctx: click.Context):
        from patchkit import progress
        from patchkit.render.progress import TerminalSink

        Output.quiet = ctx.params.pop("quiet", False) or Output.before[0]
        Output.verbose = (ctx.params.pop("verbose", False) or Output.before[1]) \
            and not Output.quiet
        Output.said = set()
        before = progress.install(TerminalSink(quiet=Output.quiet, verbose=Output.verbose))
        try:
            return super().invoke(ctx)
        finally:
            progress.install(before)   # a caller of main() in-process gets its sink back

    def wants_json(self, args: list[str]) -> bool:
        opts = [o for p in self.params if p.name == "fmt" for o in p.opts]
        return any(a in (f"{o}=json" for o in opts) or (a in opts and nxt == "json")
                   for a, nxt in zip(args, [*args[1:], ""]))

    def get_short_help_str(self, limit: int = 45) -> str:
        """The verb list's line: ``short_help``, else the help's first sentence whole (the
        list wraps it), never cut mid-phrase."""
        if self.short_help:
            return self.short_help
        text = " ".join((self.help or "").split("\b")[0].split())
        first = re.match(r"(.+?)[.;:](?:\s|$)", text)
        return first.group(1) if first else text


class Group(click.Group):
    command_class = Verb

    def wants_json(self, args: list[str]) -> bool:
        name = next((a for a in args if not a.startswith("-")), None)
        cmd = self.commands.get(name) if name else None
        return isinstance(cmd, Verb) and cmd.wants_json(args[args.index(name) + 1:])


FORMAT = click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text",
                      show_default=True, help="Report format.")
MANIFEST = click.option("--manifest", "manifest_path", default=discovery.default_manifest,
                        show_default=f"patchset.yaml, {FOUND}",
                        type=click.Path(dir_okay=False), help="The patchset manifest.")
def _completer(what: str):
    """A shell_complete callback offering the project's patch ids, variants or tags."""
    def offered(ctx, param, incomplete):
        from patchkit.commands import complete

        given = (ctx.params or {}).get("manifest_path")
        values = getattr(complete, what)(given if isinstance(given, str) else None)
        return [v for v in values if v.startswith(incomplete)]

    return offered


TAGS = _completer("tags")
VLLM_REF = click.option("--vllm-ref", "ref", shell_complete=TAGS,
                        help="Tag, branch or commit, or 'base': the commit or release the base "
                             "image's installed vLLM names (default: vllm.ref of the manifest).")
VLLM_REPO = click.option("--vllm-repo", "repos", multiple=True,
                         help="Git URL, local git path, 'pypi', or 'image' (the vLLM installed in "
                              "the base image, patched as it is); repeat to try several in order "
                              "(default: vllm.repo of the manifest).")
SECONDS = click.FloatRange(min=0, min_open=True, max=24 * 3600)
TIMEOUT = click.option("--timeout", type=SECONDS, default=DEFAULT_TIMEOUT, show_default=True,
                       metavar="SECONDS", help="Longest silence of an engine, node or registry "
                       "before giving up (a transfer goes on while bytes flow), and the CPU "
                       "time a transform patch may take.")
BASE = click.option("--base", help="The base image that --vllm-ref base and --vllm-repo image "
                                   "read (default: image.base of the manifest).")


PIN = click.option("--ref", "pins", multiple=True, metavar="NAME=REF",
                   help="Move the pin of package NAME (of packages:, or vllm) to REF for this "
                        "run; repeatable.")
PACKAGE = click.option("--package", "packages", multiple=True, metavar="NAME",
                       help="Limit the run to package NAME (vllm, or one of packages:); "
                            "repeatable (default: every package).")


def _one_variant(ctx, param, values):
    if len(values) > 1:
        raise click.BadParameter("give it once: a build is one variant", ctx, param)
    return values[0] if values else None


VARIANT = click.option("--variant", multiple=True, callback=_one_variant, metavar="NAME",
                       shell_complete=_completer("variant_names"),
                       help="Build the variant NAME of patchset.yaml's variants: the patches "
                            "naming no variant plus those naming NAME (default: no variant).")


def workdir_option(help: str):
    return click.option("--workdir", default=discovery.default_workdir,
                        show_default=f"{DEFAULT_WORKDIR} of the project {FOUND}",
                        type=click.Path(file_okay=False), help=help)


def _load(manifest_path: str):
    from patchkit import manifest

    return manifest.load(Path(manifest_path))


@click.group(cls=Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="patchkit")
@click.option("-q", "--quiet", "quiet", is_flag=True,
              help="Say nothing on stderr but errors (before or after the verb).")
@click.option("-v", "--verbose", "verbose", is_flag=True,
              help="Also show each git and pip command as it runs, and what a short line "
                   "leaves out (before or after the verb).")
def cli(quiet: bool, verbose: bool) -> None:
    """Exact, fail-closed patch series for vLLM.

    \b
    Typical use:
      patchkit validate                      check patchset.yaml and the files it names
      patchkit apply                         apply the series to the pinned vLLM (.patchkit/vllm)
      patchkit status                        what the checkout holds, and what is not exported
      patchkit verify --tree .patchkit/vllm  re-run the AST assertions
      patchkit build-image                   build the linux/arm64 image
      patchkit rebase-check --releases       how the series fares on newer vLLM releases
      patchkit bump --dry-run                the port to the newest release, as a change to review

    -q and -v go before or after the verb: 'patchkit -q apply' is 'patchkit apply -q'.
    """
    Output.before = (quiet, verbose)


@cli.command()
@MANIFEST
@FORMAT
def validate(manifest_path: str, fmt: str) -> int:
    """Check the manifest and the files it names, and nothing else."""
    from patchkit.commands import validate as command
    from patchkit.render import text

    validated = command.run(Path(manifest_path))
    for warning in validated.warnings:
        click.echo(warning, err=True)
    if fmt == "json":
        echo(json.dumps(command.summary(validated), indent=2))
        return 0
    m = validated.manifest
    pins = "".join(f", {p.name} {p.ref}" for p in m.others)
    echo(f"{manifest_path}: ok ({text.validate(validated)}, vLLM {m.vllm.ref}{pins})")
    return 0


@cli.command()
@VLLM_REF
@VLLM_REPO
@PIN
@PACKAGE
@BASE
@workdir_option("Where vLLM's patched checkout goes; every other package's goes beside it, "
                "under its name.")
@click.option("--keep-failed", is_flag=True, help="Keep the scratch checkout of a failed run and say where.")
@DISCARD
@VARIANT
@TIMEOUT
@MANIFEST
@FORMAT
def apply(ref, repos, pins, packages, base, workdir, keep_failed, discard, variant, timeout,
          manifest_path, fmt) -> int:
    """Apply the series to a pinned vLLM checkout, one commit per patch, then verify."""
    from patchkit.commands import apply as command
    from patchkit.run import Asked
    from patchkit.render import text

    m = _load(manifest_path)
    asked = Asked(ref=ref, repos=repos or None, base=base, variant=variant, refs=pins,
                  only=packages, workdir=Path(workdir), timeout=timeout)
    report = command.run(m, asked, keep_failed=keep_failed,
                         progress=TextProgress(err=fmt == "json"), discard=discard)
    echo(report.to_json() if fmt == "json" else text.apply(report))
    return 0 if report.ok else 1


@cli.command()
@click.option("--tree", type=click.Path(file_okay=False),
              help=f"A patched checkout (default: {DEFAULT_WORKDIR} of the project {FOUND}).")
@click.option("--image", help="An image: read its files without running it; also say what it "
                             "holds (installed vLLM, its commit, the source, the fingerprint).")
@click.option("--base", help="With a tree: judge the vllm: ranges on the vLLM this base image "
                             "holds.")
@click.option("--log", "logs", multiple=True, metavar="FILE",
              help="A server log to judge the runtime markers against ('-' is stdin), on its "
                   "last server start; repeat for each node.")
@click.option("--container", "containers", multiple=True, metavar="NAME|ID",
              help="Judge the runtime markers against this container's log (stdout and "
                   "stderr) since its current start, on the engine DOCKER_HOST names; "
                   "repeatable.")
@click.option("--build", "build_tag", metavar="TAG", help="With --log: the build the server ran "
              "(its immutable tag): the runtime verdict is recorded against it (with "
              "--container, the container's image is).")
@click.option("--node", metavar="ENGINE", help="With --build: the engine that holds it "
              "(default: DOCKER_HOST's).")
@click.option("--require-traffic", is_flag=True,
              help="An acceptance floor whose logs hold no spec-decode metrics line (no traffic "
                   "served yet) fails, instead of exit 5, not yet judged: for the check after "
                   "smoke.")
@PACKAGE
@click.option("--locked", is_flag=True, help="With --image: also say whether it was built on the "
              "stack patchset.lock names (base digest, packages, installed versions).")
@TIMEOUT
@VARIANT
@MANIFEST
@FORMAT
def verify(tree, image, base, logs, containers, build_tag, node, require_traffic, packages,
           locked, timeout, variant, manifest_path, fmt) -> int:
    """Run the AST assertions on a tree or an image; with --log or --container, also the
    runtime markers of the patches that are in, against the server's logs.  Exit 5 when an
    acceptance floor is not yet judged (no traffic served yet) and nothing failed."""
    from patchkit.commands import verify as command
    from patchkit.render import text

    m = _load(manifest_path)
    if tree and image:
        raise click.UsageError("give --tree or --image, not both")
    request = command.Request(
        Path(discovery.default_workdir()), tree=Path(tree) if tree else None, image=image,
        base=base, variant=variant, logs=logs, containers=containers, packages=packages,
        locked=locked, require_traffic=require_traffic, timeout=timeout, build=build_tag,
        node=node)
    report = command.run(m, request, log=say,
                         stdin=click.get_binary_stream("stdin") if "-" in logs else None)
    echo(json.dumps(report.to_dict(), indent=2) if fmt == "json" else text.verify(report))
    if fmt != "json":
        for line in report.evidence_said:   # beside the report, which keeps its shape
            say(line)
    return report.exit_code


@cli.command("rebase-check")
@click.option("--to", "refs", multiple=True, metavar="REF", shell_complete=TAGS,
              help="A ref to check (of vLLM, or "
              "of --package); repeat.")
@click.option("--releases", is_flag=True, help="Every release tag vX.Y.Z after the pin.")
@click.option("--pre", is_flag=True, help="With --releases: pre-releases too.")
@VLLM_REPO
@click.option("--package", metavar="NAME", help="The matrix of package NAME: --to and "
              "--releases name its refs, the rows are its patches (default: vllm).")
@PIN
@BASE
@click.option("--jobs", "-j", type=click.IntRange(min=1), help="Targets checked at once "
              "(default: two per core).")
@click.option("--bisect", is_flag=True, help="For each failure on a git source, also find the "
              "upstream commit that broke it (patchkit bisect from the pin to that target).")
@click.option("--output", "outputs", multiple=True, metavar="FORMAT:FILE",
              help="Also write the report in FORMAT (text, json, markdown, junit) to FILE; repeat.")
@TIMEOUT
@VARIANT
@MANIFEST
@click.option("--format", "fmt", type=click.Choice(["text", "json", "markdown", "junit"]),
              default="text", show_default=True, help="Report format on stdout.")
def rebase_check(refs, releases, pre, repos, package, pins, base, jobs, bisect, outputs, timeout,
                 variant, manifest_path, fmt) -> int:
    """Apply the series to newer vLLM refs in scratch checkouts; print the patch x release
    matrix.  Exit 1 if any patch fails anywhere."""
    from patchkit.commands import rebase_check as command
    from patchkit.errors import UsageError
    from patchkit.run import Asked
    from patchkit.render import matrix as render

    try:
        sinks = command.check_flags(refs, releases, pre, outputs)
    except UsageError as exc:  # a flag problem reads like click's own
        raise click.UsageError(str(exc)) from None
    m = _load(manifest_path)
    asked = Asked(repos=repos or None, base=base, variant=variant, refs=pins,
                  only=(package,) if package else (), timeout=timeout)
    result = command.run(m, asked, refs=refs, releases=releases, pre=pre, jobs=jobs,
                         progress=TextProgress(err=True, patches=False), bisect=bisect)
    for kind, path in sinks:
        try:
            path.write_text(render.render(result, kind))
        except OSError as exc:
            raise click.FileError(str(path), exc.strerror) from None
    click.echo(render.render(result, fmt, color=fmt == "text" and sys.stdout.isatty()), nl=False)
    return 0 if result.ok else 1


@cli.command()
@click.option("--to", "ref", metavar="REF", shell_complete=TAGS,
              help="The ref to move the pin to (vLLM's, or "
              "--package's).")
@click.option("--continue", "cont", is_flag=True, help="Go on after resolving a stop.")
@click.option("--abort", is_flag=True, help="Put the manifest and every patch file back.")
@click.option("--drop-upstream", is_flag=True,
              help="Remove patches the target already has, instead of marking them with a "
                   "vllm: range.")
@VLLM_REPO
@click.option("--package", metavar="NAME", help="Move that package's pin (its `ref:` line) "
              "instead of vLLM's; its patches alone are rebased.")
@MANIFEST
def rebase(ref, cont, abort, drop_upstream, repos, package, manifest_path) -> int:
    """Move the pin to REF: refresh what drifted, mark what went upstream, stop at a conflict.

    \b
    patchkit rebase --to v0.33.0     start; stops where a person must decide
    patchkit rebase --continue       take the resolution and go on
    patchkit rebase --abort          put everything back as it was
    """
    from patchkit.commands import rebase as command
    from patchkit.render import text

    if sum(bool(x) for x in (ref, cont, abort)) != 1:
        raise click.UsageError("give exactly one of --to REF, --continue, --abort")
    if (cont or abort) and (drop_upstream or repos or package):
        raise click.UsageError("--drop-upstream, --vllm-repo and --package go with --to")
    result = command.run(Path(manifest_path), to=ref, cont=cont, abort_=abort,
                         drop_upstream=drop_upstream, repos=repos or None, package=package,
                         progress=TextProgress(err=True, patches=False))
    echo(text.rebase(result))
    return 0 if result.ok else 1


@cli.command()
@click.argument("patch_id", required=False, shell_complete=_completer("patch_ids"))
@click.option("--good", metavar="REF", shell_complete=TAGS, help="A ref of the patch's package (vLLM, or its "
              "package:) where the patch has its old fate (default: that package's pin).")
@click.option("--bad", metavar="REF", shell_complete=TAGS, help="A ref of the patch's package where it has its new "
              "fate (default: that package's newest release tag on its source).")
@click.option("--series", is_flag=True, help="Instead: find the patch of the series (at the pin) "
              "whose addition makes --run CMD fail.")
@click.option("--run", "command", metavar="CMD", help="--series: the command run on each tree "
              "(PATCHKIT_TREE names it): exit 0 good, 125 skip, 1-127 bad.")
@click.option("--image", is_flag=True, help="--series: also build an image of each tree "
              "(PATCHKIT_IMAGE names it), as build-image --no-apply does.")
@click.option("--no-daemon", is_flag=True, help="--image: build it straight in the registry "
              "of --tag, with no engine.")
@click.option("--tag", metavar="NAME", help="--image: the images are REPOSITORY:bisect-K, "
              "REPOSITORY that of NAME (default: image.tag).")
@click.option("--base", help="--image: the base image (default: image.base).")
@click.option("--timeout", type=SECONDS, default=DEFAULT_TIMEOUT, show_default=True,
              metavar="SECONDS", help="--series: the deadline of each run of CMD (past it CMD "
              "is killed, and the run is bad), and the longest silence of the engine.")
@VLLM_REPO
@PIN
@VARIANT
@MANIFEST
@FORMAT
def bisect(patch_id, good, bad, series, command, image, no_daemon, tag, base, timeout, repos,
           pins, variant, manifest_path, fmt) -> int:
    """Find the first upstream commit of PATCH_ID's package at which its fate changes between
    --good and --bad: the commit that broke it, or the one from which it is upstream; the
    other packages stay at their pins (--ref moves one).  Exit 0 when the commit is named or
    the fate is the same at both ends, 1 when it cannot be named (the pypi source narrows it
    to two releases).

    \b
    With --series --run CMD: the first patch of your series whose addition turns CMD from
    passing to failing, each tree made from a prefix of the series as apply makes it.
    Exit 0 when the patch is named, 1 when it cannot be.
    """
    from patchkit.commands import bisect_series
    from patchkit.run import Asked

    bisect_series.Flags(series=series, patch_id=patch_id, good=good, bad=bad, command=command,
                        image=image, no_daemon=no_daemon, tag=tag, base=base, pins=pins).check()
    if series:
        from patchkit.render.bisect import render_series

        m = _load(manifest_path)
        asked = Asked(repos=repos or None, variant=variant, base=base, tag=tag, timeout=timeout)
        found = bisect_series.run(m, command, asked, image=image, no_daemon=no_daemon,
                                  progress=TextProgress(err=True, patches=False))
        if fmt == "json":
            echo(json.dumps(found.to_dict(), indent=2))
        else:
            click.echo(render_series(found), nl=False)
        return 0 if found.ok else 1
    from patchkit.commands import bisect as command_
    from patchkit.render.bisect import render_text

    result = command_.run(_load(manifest_path), patch_id, ends=(good, bad),
                          repos=repos or None, progress=TextProgress(err=True, patches=False),
                          variant=variant, pins=pins)
    if fmt == "json":
        echo(json.dumps(result.to_dict(), indent=2))
    else:
        click.echo(render_text(result), nl=False)
    return 0 if result.ok else 1


@cli.command()
@click.option("--package", metavar="NAME",
              help="Bump that package (vllm, or a name under packages:); default: every one.")
@click.option("--to", "ref", metavar="REF",
              help="The release to move to (default: the newest after the pin); with --package.")
@click.option("--dry-run", is_flag=True, help="Port and prove in a throwaway tree; print the "
              "pull request body and write nothing.")
@click.option("--push", metavar="REMOTE", help="Push the branch to REMOTE (only if it is "
              "still what it was there).")
@VLLM_REPO
@MANIFEST
@FORMAT
def bump(package, ref, dry_run, push, repos, manifest_path, fmt) -> int:
    """Port the series to the newest release of each package, as one commit on
    patchkit/bump-<package>-<version>, with a pull request body on stdout.

    \b
    Exit 0: bumped, or nothing new; 4: needs a hand (a patch, a lost fix, an assertion or
    a probe stopped it; the body says which); 2: bad input (a commit on the branch this bump
    did not write, here or at the remote, included), nothing written.
    \b
    patchkit bump --dry-run
    patchkit bump --package vllm --push origin
    """
    from patchkit.commands import bump as command
    from patchkit.render import bump as render

    results = command.run(Path(manifest_path), package=package, to=ref, dry_run=dry_run,
                          push=push, repos=repos or None, progress=TextProgress(err=True))
    if fmt == "json":
        echo(json.dumps({"ok": command.exit_code(results) == 0,
                         "bumps": [dict(r.to_dict(), body=render.body(r)) for r in results]},
                        indent=2))
    else:
        bodies = [render.body(r) for r in results
                  if r.to_ref is not None and r.status is not command.BumpStatus.UNCHANGED]
        if bodies:
            echo("\n".join(bodies).rstrip("\n"))
    for r in results:   # a line per package on stderr, whatever stdout holds
        echo(render.summary(r), err=True)
    return command.exit_code(results)


@cli.command()
@click.option("--workdir", type=click.Path(file_okay=False),
              help=f"vLLM's applied checkout; other packages' are beside it (default: "
                   f"{DEFAULT_WORKDIR} of the project {FOUND}).")
@click.option("--manifest", "manifest_path", type=click.Path(dir_okay=False),
              help=f"The patchset manifest (default: patchset.yaml, {FOUND}).")
@FORMAT
def status(workdir, manifest_path, fmt) -> int:
    """Say what each package's checkout holds: its pin, variant and patches, work not yet
    exported, and what changed in the manifest since the apply."""
    from patchkit.commands import status as command
    from patchkit.render import text

    st = command.run(Path(manifest_path) if manifest_path else None,
                     Path(workdir) if workdir else None)
    echo(json.dumps(st.to_dict(), indent=2) if fmt == "json" else text.status(st))
    return 0


@cli.command()
@workdir_option("The applied checkout with new commits.")
@MANIFEST
def export(workdir, manifest_path) -> int:
    """Turn commits made after patchkit/applied in WORKDIR into patches and manifest entries."""
    from patchkit.commands import export as command
    from patchkit.render import text

    result = command.run(Path(manifest_path), Path(workdir))
    echo(text.export(result, workdir))
    return 0


@cli.command("add-pr", short_help="Add a pull request's diff to the series, once the series "
                                   "applies with it at the pin")
@click.argument("pr", metavar="N|URL")
@click.option("--id", "patch_id", metavar="ID", help="The new patch's id (default: pr-N).")
@click.option("--include", multiple=True, metavar="GLOB",
              help="Keep files under tests/, docs/, benchmarks/ or .github/ that match; repeat.")
@click.option("--package", metavar="NAME",
              help="A pull request of that package (its GitHub repository): a patch of it, "
                   "saved as patches/NAME/<id>.diff.")
@MANIFEST
@FORMAT
def add_pr(pr, patch_id, include, package, manifest_path, fmt) -> int:
    """Fetch pull request N (of the manifest's GitHub repository) or URL as a diff, prove the
    series applies with it at the pin, then save patches/<id>.diff and append its entry.
    The host is $PATCHKIT_GITHUB (default https://github.com)."""
    from patchkit.commands import add_pr as command
    from patchkit.render import porting

    result = command.run(Path(manifest_path), pr, patch_id=patch_id, include=include,
                         package=package, progress=TextProgress(err=True))
    echo(json.dumps(result.to_dict(), indent=2) if fmt == "json" else porting.add_pr(result))
    return 0


@cli.command("import", short_help="Turn a fork branch's commits, or an overlay tree, into diff "
                                  "patches at the end of the series")
@click.argument("ref", required=False)
@click.option("--from", "from_repo", metavar="REPO",
              help="The fork's git URL or path (default: the manifest's vLLM sources); with "
                   "--overlay, REPO@REF: read DIR inside REPO at REF.")
@click.option("--overlay", type=click.Path(file_okay=False), metavar="DIR",
              help="Import a tree of whole files (a copy of dist-packages/vllm, or a vllm/ "
                   "folder at its top or one level down) instead of commits.")
@click.option("--onto", metavar="REF", help="--overlay: the vLLM ref its files were copied from "
              "(default: what DIR/upstream.lock names, else the pin).")
@click.option("--id", "patch_id", metavar="ID", help="--overlay: the new patch's id.")
@click.option("--summary", help="--overlay: the new patch's summary.")
@click.option("--split", type=click.Choice(["file", "dir"]), default=None,
              help="--overlay: one patch per changed file, or per folder (default: one patch).")
@click.option("--package", metavar="NAME", help="--overlay: DIR holds that package's folder "
              "(flashinfer/); its patches go under patches/NAME/ (default: vllm).")
@MANIFEST
@FORMAT
def import_cmd(ref, from_repo, overlay, onto, patch_id, summary, split, package, manifest_path,
               fmt) -> int:
    """Turn the commits merge-base(pin, REF)..REF of a fork branch, or an overlay tree, into
    diff patches at the end of the series; written only when the series applies with them.

    \b
    patchkit import dspark-nvfp4-a4w4 --from https://github.com/someone/vllm.git
    patchkit import --overlay ./vllm-overlay --split file
    patchkit import --overlay overlay --from https://github.com/someone/spark.git@main
    """
    from patchkit.commands import import_ as command
    from patchkit.render import porting

    if bool(ref) == bool(overlay):
        raise click.UsageError("give REF (a fork branch) or --overlay DIR")
    if ref and (onto or patch_id or summary or split or package):
        raise click.UsageError("--onto, --id, --summary, --split and --package go with --overlay")
    progress = TextProgress(err=True)
    if overlay:
        how = command.Overlay(onto=onto, patch_id=patch_id, summary=summary,
                              split=split or "one", from_repo=from_repo, package=package)
        result = command.run_overlay(Path(manifest_path), Path(overlay), how, progress=progress)
    else:
        result = command.run(Path(manifest_path), ref, from_repo=from_repo, progress=progress)
    echo(json.dumps(result.to_dict(), indent=2) if fmt == "json" else porting.import_(result))
    return 0


@cli.command("build-image")
@VLLM_REF
@VLLM_REPO
@workdir_option("The applied checkout the image is made from.")
@click.option("--no-apply", is_flag=True, help="Use --workdir as it is instead of applying first.")
@DISCARD
@click.option("--base", help="Base image; also what --vllm-ref base and --vllm-repo image "
                             "read (default: image.base of the manifest).")
@click.option("--tag", help="Tag of the new image; {ref} is replaced (default: image.tag).")
@click.option("--platform", help="OS/ARCH (default: image.platform, else linux/arm64).")
@click.option("--mode", type=click.Choice(["auto", "overlay", "source"]), default="auto",
              show_default=True, help="Overlay the patched files on the base, or build vLLM from source.")
@click.option("--max-jobs", type=click.IntRange(min=1), help="Source mode: parallel compile jobs.")
@click.option("--nvcc-threads", type=click.IntRange(min=1), help="Source mode: threads per nvcc.")
@click.option("--push", is_flag=True, help="Push the tag to its registry.")
@click.option("--no-daemon", is_flag=True,
              help="With --push: build straight in the registry, with no engine (needs skopeo).")
@click.option("--save", type=click.Path(dir_okay=False), help="Also write a 'docker load' archive.")
@click.option("--copy-to", "copy_to", multiple=True, metavar="ENGINE",
              help="Then copy the image to this engine (ssh://[user@]host[:port], unix://, "
                   "tcp://), as copy-image does; repeat for several.")
@click.option("--via", metavar="REGISTRY",
              help="With --copy-to: copy through this registry (host:port[/prefix]), as "
                   "copy-image --via does.")
@click.option("--locked", is_flag=True, help="Refuse a base or packages that differ from "
              "patchset.lock (each difference named); nothing is tagged.")
@TIMEOUT
@VARIANT
@MANIFEST
@FORMAT
def build_image_cmd(ref, repos, workdir, no_apply, discard, base, tag, platform, mode, max_jobs,
                    nvcc_threads, push, no_daemon, save, copy_to, via, locked, timeout,
                    variant, manifest_path, fmt) -> int:
    """Build the image through the Docker Engine that DOCKER_HOST names, or with
    --no-daemon --push straight in the registry."""
    from patchkit.commands import build_image as command
    from patchkit.render import text

    request = command.Request(
        workdir=Path(workdir), ref=ref, repos=repos or None, base=base, tag=tag,
        platform=platform, push=push, save=Path(save) if save else None, mode=mode,
        apply=not no_apply, max_jobs=max_jobs, nvcc_threads=nvcc_threads, variant=variant,
        no_daemon=no_daemon, copy_to=copy_to, timeout=timeout, discard=discard, locked=locked,
        via=via)
    report = command.run(_load(manifest_path), request, progress=TextProgress(err=True))
    summary = report.to_dict()
    echo(json.dumps(summary, indent=2) if fmt == "json" else text.build_image(report))
    return 0 if summary["ok"] else 1


@cli.command()
@workdir_option("vLLM's applied checkout; other packages' are beside it.")
@click.option("--base", help="The base image (default: image.base of the manifest).")
@click.option("--platform", help="OS/ARCH (default: image.platform, else linux/arm64).")
@TIMEOUT
@MANIFEST
@FORMAT
def lock(workdir, base, platform, timeout, manifest_path, fmt) -> int:
    """Write patchset.lock beside the manifest: the base's digest, each package's version and
    commit, and the version of every distribution the base has installed."""
    from patchkit.commands import lock as command

    report = command.run(_load(manifest_path), workdir=Path(workdir), base=base,
                         platform=platform, log=say,
                         timeout=timeout)
    if fmt == "json":
        echo(json.dumps(report.to_dict(), indent=2))
    else:
        lk = report.lock
        echo(f"{'wrote' if report.written else 'unchanged'} {report.path}: base {lk.base_name} "
             f"({lk.base_digest}), {len(lk.packages)} package(s), {len(lk.installed)} "
             "installed distribution(s)")
    return 0


@cli.command("copy-image")
@click.argument("image", required=False)
@click.option("--to", "targets", multiple=True, metavar="ENGINE", required=True,
              help="An engine to copy to: ssh://[user@]host[:port] (through the system ssh), "
                   "unix:///path or tcp://host:port; repeat, or list more after it.")
@click.argument("more", nargs=-1, metavar="[ENGINE...]")
@click.option("--via", metavar="REGISTRY",
              help="Copy through this registry (host:port[/prefix]) instead of the link: "
                   "push what it lacks, then each target pulls what it lacks.")
@click.option("--dry-run", is_flag=True,
              help="Say per target what would be sent and why (layers present, missing, "
                   "bytes), and send nothing.")
@click.option("--compress", type=click.Choice(["none", "gzip", "zstd"]), default="none",
              show_default=True, help="Compress the stream on the way (for slow links).")
@TIMEOUT
@click.option("--manifest", "manifest_path", default=None, type=click.Path(dir_okay=False),
              help="Without IMAGE: copy the image this manifest's build-image tags, image.tag "
                   "at the pin (default: patchset.yaml).")
@FORMAT
def copy_image_cmd(image, targets, more, via, dry_run, compress, timeout, manifest_path,
                   fmt) -> int:
    """Put IMAGE, as the engine DOCKER_HOST names holds it, on other engines; without IMAGE,
    the image build-image tags for the manifest (image.tag at the pin).

    \b
    Judged by content (config digest and layer diff_ids), never by image id:
      present   the target holds that content under the tag already; nothing is sent
      copied    streamed from this engine into the target's load, no file in between,
                without the layers the target holds
      replaced  the tag named other content there, and now names this
    With --via REGISTRY, "copied" and "replaced" mean pulled from the registry, which the
    source engine pushed the layers it lacked to first.
    Targets are copied in parallel.  Exit 1 if any target could not be reached, refused the
    load or lost its link (its tag is as it was); the others are still tried.
    """
    from patchkit.commands import copy_image as command
    from patchkit.nodes.transfer import How
    from patchkit.render import copy as render

    if image is not None and "://" in image:   # no image reference holds one: an ENGINE
        image, more = None, (image, *more)
    if image is None or manifest_path is not None:
        built = command.built_image(_load(manifest_path or discovery.default_manifest()))
        image = image or built
    report = command.run(image, [*targets, *more],
                         # -v: what each target holds, what goes, all a failed load said
                         log=TextProgress(err=True).info if Output.verbose else lambda m: None,
                         timeout=timeout, how=How(via, dry_run, compress))
    echo(json.dumps(report.to_dict(), indent=2) if fmt == "json" else render.text(report))
    return 0 if report.ok else 1


NODE = click.option("--node", "nodes", multiple=True, metavar="ENGINE",
                    help="Another node besides DOCKER_HOST's engine and image.nodes: "
                         "ssh://[user@]host[:port], unix:///path or tcp://host:port; repeat.")


@cli.command()
@NODE
@click.option("--prune", is_flag=True, help="Remove this patchset's builds beyond the newest "
              "--keep on each node: never the current one, one a container uses (running or "
              "stopped), or one carrying a tag patchkit did not make.")
@click.option("--keep", type=click.IntRange(min=1), metavar="N",
              help="With --prune: the newest builds kept on each node (1 or more).")
@click.option("--dry-run", is_flag=True, help="With --prune: say what would go; remove nothing.")
@click.option("--evidence", "evidence_of", metavar="TAG", help="List every evidence record of "
              "one build (its immutable tag): what smoke and verify found, when and where.")
@TIMEOUT
@MANIFEST
@FORMAT
def images(nodes, prune, keep, dry_run, evidence_of, timeout, manifest_path, fmt) -> int:
    """List this patchset's builds on every node, newest first (by when the node got them):
    immutable tag, moving tags, id, created time, vLLM and package versions, patches, which
    one is current, and its last evidence (smoke's or verify's verdict, tok/s, acceptance,
    when and where, or "never served"); then a drift line naming the nodes whose current
    build differs.

    \b
    The nodes: the engine DOCKER_HOST names, image.nodes of the manifest, each --node.
    Exit 1 if a node cannot be reached (the others are listed or pruned).
    """
    from patchkit.commands import images as command
    from patchkit.render import images as render

    if (keep is not None or dry_run) and not prune:
        raise click.UsageError("--keep and --dry-run go with --prune")
    if prune and keep is None:
        raise click.UsageError("--prune needs --keep N: the newest builds kept on each node")
    if prune and evidence_of:
        raise click.UsageError("--evidence and --prune: one at a time")
    m = _load(manifest_path)
    if evidence_of:
        report = command.evidence(m, evidence_of, nodes, timeout=timeout)
        echo(json.dumps(report.to_dict(), indent=2) if fmt == "json" else render.evidence(report))
        return 0
    if prune:
        report = command.prune(m, keep, nodes, dry_run=dry_run, timeout=timeout)
        echo(json.dumps(report.to_dict(), indent=2) if fmt == "json" else render.pruned(report))
    else:
        report = command.run(m, nodes, timeout=timeout)
        echo(json.dumps(report.to_dict(), indent=2) if fmt == "json" else render.listing(report))
    return 0 if report.ok else 1


@cli.command()
@click.option("--to", metavar="TAG", help="The build to roll back (or forward) to: its "
              "immutable tag, <moving tag>-<12 hex> (default: the build before the current one "
              "on the first node).")
@click.option("--tag", metavar="TAG", help="The moving tag (default: the one --to was made "
              "beside, else image.tag at the pin).")
@NODE
@click.option("--dry-run", is_flag=True, help="Say what would move on each node; move nothing.")
@TIMEOUT
@MANIFEST
@FORMAT
def rollback(to, tag, nodes, dry_run, timeout, manifest_path, fmt) -> int:
    """Point the moving tag at an earlier build on every node.

    \b
    already   the moving tag names that build there already
    moved     the node holds the build: its tag moves, no image bytes move
    copied    the node lacked it: the layers it lacks were sent (as copy-image sends them)
              and proven by fingerprint before its tag moved
    The build that was current stays: --to rolls forward again.  Exit 1 if a node could not
    be reached or refused (the others are rolled back; the same command completes it later);
    exit 2, with no node changed, for a --to that no node holds or that another patchset
    built, or when there is nothing to roll back to.
    """
    from patchkit.commands import rollback as command
    from patchkit.render import images as render

    report = command.run(_load(manifest_path), command.Request(to, tag, nodes, dry_run, timeout),
                         log=TextProgress(err=True).info if Output.verbose else lambda m: None)
    echo(json.dumps(report.to_dict(), indent=2) if fmt == "json" else render.rollback(report))
    return 0 if report.ok else 1


@cli.command()
@click.argument("url")
@click.option("--model", metavar="NAME",
              help="The served model to ask (default: the only one /v1/models lists).")
@click.option("--min-acceptance", type=float, metavar="RATE",
              help="Also require this speculative-decoding acceptance rate (0 to 1) over "
                   "smoke's requests, from /metrics; nothing drafted is inconclusive (exit 1).")
@click.option("--min-acceptance-length", type=float, metavar="L",
              help="Also require this mean acceptance length (1 + accepted / drafts, 1 or "
                   "more) over smoke's requests.")
@click.option("--long", "long_tokens", type=int, metavar="N",
              help="Also make one deterministic answer of N tokens (counting from 1) and check "
                   "it for garble; the report gives the first bad token's offset.")
@click.option("--text", metavar="T", help="With --long: the answer repeats T instead.")
@click.option("--requests", "requests_", type=int, metavar="N",
              help="Also measure decode speed: N streamed completions one after another; "
                   "the median decode tok/s, its spread and the time to the first token.")
@click.option("--output-tokens", type=int, metavar="T",
              help="With --requests: the tokens of each answer (default 256).")
@click.option("--concurrency", type=int, metavar="C",
              help="With --requests: also C completions at once, and their aggregate tok/s.")
@click.option("--container", metavar="NAME|ID", help="The container serving URL: its image "
              "is the build the evidence is recorded against.")
@click.option("--build", "build_tag", metavar="TAG", help="The build serving URL (its immutable "
              "tag), where patchkit cannot see the container.")
@click.option("--node", metavar="ENGINE", help="With --container or --build: the engine that "
              "holds it (default: DOCKER_HOST's).")
@click.option("--against", metavar="TAG|previous", help="Gate: compare the speed with the "
              "evidence of this build (or the one before this build on its node) measured on "
              "the same model and settings; exit 1 on a drop beyond --max-drop.")
@click.option("--max-drop", type=float, metavar="PCT", help="With --against: the drop allowed, "
              "a percentage from 0 to 100.")
@click.option("--timeout", type=SECONDS, default=DEFAULT_TIMEOUT, show_default=True,
              metavar="SECONDS", help="Deadline of each request as a whole.")
@click.option("--api-key", envvar="VLLM_API_KEY", show_envvar=True, metavar="KEY",
              help="Bearer token of a server started with --api-key.")
@FORMAT
def smoke(url, model, min_acceptance, min_acceptance_length, long_tokens, text, requests_,
          output_tokens, concurrency, container, build_tag, node, against, max_drop, timeout,
          api_key, fmt) -> int:
    """Check a running vLLM OpenAI-compatible server at URL: /health, /v1/models, one chat
    answer with content, with --long a long answer free of garble, with --min-acceptance
    or --min-acceptance-length the spec-decode acceptance, and with --requests N the decode
    speed.  With --container or --build, what it found is recorded against that build (in the
    cache, and beside the image in its registry).  Exit 1 if a check or the gate fails."""
    from patchkit.commands.smoke import Long, Measure, Which, run_recorded
    from patchkit.render.smoke import render_outcome

    asked = (requests_, output_tokens, concurrency)
    measure = Measure(*asked) if any(v is not None for v in asked) else None
    long = Long(long_tokens, text) if long_tokens is not None or text is not None else None
    outcome = run_recorded(url, Which(container, build_tag, node), against=against,
                           max_drop=max_drop, model=model, min_acceptance=min_acceptance,
                           timeout=timeout, api_key=api_key,
                           min_acceptance_length=min_acceptance_length, long=long,
                           measure=measure)
    echo(json.dumps(outcome.to_dict(), indent=2) if fmt == "json" else render_outcome(outcome))
    return 0 if outcome.ok else 1



USAGE = """\
usage: patchkit [--version] [-h | --help] COMMAND [ARGS]...

  patchkit validate          check patchset.yaml and the files it names
  patchkit apply             apply the series to the pinned vLLM (.patchkit/vllm)
  patchkit verify            re-run the AST assertions (--log: a server's log too)
  patchkit build-image       build the image
  patchkit rebase-check      how the series fares on newer vLLM releases

'patchkit --help' lists every command; 'patchkit COMMAND --help' tells one."""


def _prog(args: list[str]) -> str:
    """``patchkit VERB`` for a run of a known verb, else ``patchkit``: every error line
    begins with it."""
    name = next((a for a in args if not a.startswith("-")), None)
    return f"patchkit {name}" if name in cli.commands else "patchkit"


def _cache_manifests(given) -> list[Path]:
    if given:
        return [Path(m) for m in given]
    found = discovery.find()
    return [Path(discovery.shown(found))] if found is not None else []


@cli.group("cache", cls=Group, invoke_without_command=True,
           short_help="List what the cache holds, or prune what no manifest pins")
@click.option("--manifest", "manifests", multiple=True, type=click.Path(dir_okay=False),
              help=f"Mark what this manifest pins (default: patchset.yaml, {FOUND}); repeat.")
@FORMAT
@click.option("-q", "--quiet", is_flag=True, help="Say nothing on stderr but errors.")
@click.option("-v", "--verbose", is_flag=True, help="Also show each git command as it runs.")
@click.pass_context
def cache_cmd(ctx, manifests, fmt, quiet, verbose) -> int:
    """List what the cache holds ($PATCHKIT_CACHE_DIR, else ~/.cache/patchkit), how large
    each entry is, when it was last used, and whether the manifest pins it.

    \b
    patchkit cache                       list it
    patchkit cache prune                 remove what no manifest pins
    patchkit cache prune --older-than 30d
    """
    if ctx.invoked_subcommand is not None:
        return 0
    from patchkit import progress
    from patchkit.render.progress import TerminalSink

    quiet, verbose = quiet or Output.before[0], verbose or Output.before[1]
    before = progress.install(TerminalSink(quiet=quiet, verbose=verbose and not quiet))
    try:
        return _list_cache(manifests, fmt)
    finally:
        progress.install(before)


def _list_cache(manifests, fmt) -> int:
    from patchkit.cache import cache_dir
    from patchkit.commands import cache as command
    from patchkit.render import cache as render

    found = command.listing(cache_dir(), _cache_manifests(manifests))
    echo(json.dumps(found.to_dict(), indent=2) if fmt == "json" else render.listing(found))
    return 0


def _duration(ctx, param, value):
    if value is None:
        return None
    from patchkit.commands.cache import parse_duration
    from patchkit.errors import UsageError

    try:
        return parse_duration(value)
    except UsageError as exc:
        raise click.BadParameter(str(exc), ctx, param) from None


@cache_cmd.command("prune")
@click.option("--older-than", callback=_duration, metavar="DURATION",
              help="Only what has not been used for this long: 30d, 12h, 90m, 2w.")
@click.option("--manifest", "manifests", multiple=True, type=click.Path(dir_okay=False),
              help=f"Keep what this manifest pins (default: patchset.yaml, {FOUND}); repeat "
                   "for every project that shares the cache.")
@click.option("--wait", type=click.FloatRange(min=0, max=24 * 3600), default=10.0,
              show_default=True, metavar="SECONDS",
              help="How long to wait for the runs using the cache to end.")
@click.option("--dry-run", is_flag=True, help="Say what would be removed; remove nothing.")
@FORMAT
def cache_prune(older_than, manifests, wait, dry_run, fmt) -> int:
    """Remove what no manifest pins: mirrors of other sources, releases and wheels of other
    versions, what killed runs left.  Never what a running patchkit uses."""
    from patchkit.cache import cache_dir
    from patchkit.commands import cache as command
    from patchkit.render import cache as render

    result = command.prune(cache_dir(), _cache_manifests(manifests), older_than=older_than,
                           wait=wait, dry_run=dry_run)
    echo(json.dumps(result.to_dict(), indent=2) if fmt == "json" else render.pruned(result))
    return 0


# The settings the core names, as the command line's options name them (the others are
# --SETTING, underscores as dashes; an argument is named in capitals, and said so).
OPTIONS = {"ref": "--vllm-ref", "repos": "--vllm-repo", "refs": "--ref", "only": "--package"}


def worded(origin: errors.Origin) -> str:
    """Where a setting came from, as the command line says it: its option (``--base``), or
    the manifest key at its line (``image.base at patchset.yaml:12``)."""
    if origin.key is None and origin.setting.isupper():
        return origin.setting
    if origin.key is None:
        return OPTIONS.get(origin.setting, "--" + origin.setting.replace("_", "-"))
    if origin.path is None or not origin.line:
        return origin.key
    return f"{origin.key} at {discovery.shown(Path(origin.path))}:{origin.line}"


def main(argv: list[str] | None = None) -> int:
    interrupt.install()
    args = sys.argv[1:] if argv is None else list(argv)
    # as git: the short usage, not the whole help as an error (a shell asking for completions
    # runs patchkit with no arguments too)
    if not args and "_PATCHKIT_COMPLETE" not in os.environ:
        echo(USAGE, err=True)
        return 2
    prog = _prog(args)
    Output.before = (False, False)
    if next((a for a in args if not a.startswith("-")), None) != "cache" and \
            "_PATCHKIT_COMPLETE" not in os.environ:
        from patchkit.cache import mark_when_used

        mark_when_used()   # `cache prune` removes nothing while this run may use the cache
    try:
        rv = cli.main(args=args, prog_name="patchkit", standalone_mode=False)
        return rv if isinstance(rv, int) else 0
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except click.exceptions.Abort:
        echo("patchkit: interrupted", err=True)
        return 130
    except click.ClickException as exc:
        ctx = getattr(exc, "ctx", None)
        where = ctx.command_path if ctx and ctx.info_name != "patchkit" else prog
        echo(f"{where}: error: {exc.format_message()} (see '{where} --help')", err=True)
        code, message = 2, exc.format_message()
    except BaseException as exc:  # noqa: BLE001  # the one handler: anything is one line
        if isinstance(exc, SystemExit):
            raise
        from patchkit.cache import log_file

        code, line, message = errors.handle(exc, " ".join(sys.argv), __version__, log_file,
                                            prog=prog, word=worded)
        echo(line, err=True)
        more = getattr(exc, "more", None)
        if more and Output.verbose:   # -v: what the one line left out
            echo(f"  {more}", err=True)
        if not isinstance(exc, (errors.PatchkitError, Exception)):
            return code  # an interruption: nothing to report
    if cli.wants_json(args):
        echo(json.dumps({"ok": False, "error": message, "exit_code": code}))
    return code
