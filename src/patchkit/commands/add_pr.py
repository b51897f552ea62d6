"""``patchkit add-pr N|URL``: an open vLLM pull request becomes a diff patch of the series.

The pull request's diff is fetched from ``{host}/{owner}/{name}/pull/N.diff``: the host is
``$PATCHKIT_GITHUB`` (default https://github.com), owner and name come from the manifest's
GitHub source (or from the URL given).  Files under tests/, docs/, benchmarks/ and .github/ are
left out (a test hunk of a PR breaks every build: no image holds tests) unless ``--include``
keeps them.  The entry records the PR's URL and the sha256 of what was fetched; the series is
proven to apply at the pin before anything is written.  A number with no GitHub source in
``vllm.repo`` (a local mirror, ``pypi``) means a pull request of vllm-project/vllm.  The entry's
``upstream:`` is the pull request's own URL (github.com, or the host a URL argument named),
never the host it was fetched from.
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
import re
import urllib.parse
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from patchkit import http, manifest
from patchkit.errors import PatchkitError, UsageError
from patchkit.kinds.diff import text as difftext
from patchkit.manifest import VLLM, Manifest
from patchkit.report import ApplyReport, Status
from patchkit.series import intake
from patchkit.run import RunSpec, run_spec
from patchkit.series import applier
from patchkit.series.applier import Progress
from patchkit.timeouts import DEFAULT_TIMEOUT

GITHUB = "https://github.com"
HOST_ENV = "PATCHKIT_GITHUB"
VLLM_GITHUB = ("vllm-project", "vllm")
# where a package's pull requests are when its `repo:` list names no GitHub repository
KNOWN_GITHUB = {VLLM.name: VLLM_GITHUB, "flashinfer": ("flashinfer-ai", "flashinfer")}
LEFT_OUT = ("tests", "docs", "benchmarks", ".github")  # no image is built from them
MAX_BYTES = 16 * 1024 * 1024
SHOWN = 5   # files of the pull request an error names
TIMEOUT = DEFAULT_TIMEOUT

_GITHUB_SOURCE = re.compile(r"^(?:https?://(?:www\.)?|ssh://git@|git@)github\.com[/:]"
                            r"([A-Za-z0-9_.-]+)/([A-Za-z0-9_.-]+?)(?:\.git)?/?$")
_PULL_PATH = re.compile(r"^(.*?)/([A-Za-z0-9_.-]+)/([A-Za-z0-9_.-]+)/pull/(\d+)"
                        r"(?:\.diff|\.patch|/[^?#]*)?/?$")


@dataclass(frozen=True)
class PullRequest:
    host: str        # scheme://host[/prefix] the diff is fetched from
    owner: str
    name: str
    number: int
    web: str = GITHUB   # scheme://host[/prefix] the pull request lives at: its URL's host
    note: str = ""

    @property
    def url(self) -> str:
        return f"{self.web}/{self.owner}/{self.name}/pull/{self.number}"

    @property
    def diff_url(self) -> str:
        return f"{self.host}/{self.owner}/{self.name}/pull/{self.number}.diff"


@dataclass
class AddedPr:
    patch: intake.NewPatch
    pull: PullRequest
    kept: list[str] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)
    reports: list[ApplyReport] = field(default_factory=list)

    @property
    def status(self) -> Status:
        """The new patch's fate at the pin (applied or upstream)."""
        return self.reports[0].status_of(self.patch.id) or Status.APPLIED

    def to_dict(self) -> dict:
        return {"ok": True, "id": self.patch.id, "package": self.patch.package.name,
                "path": self.patch.path,
                "summary": self.patch.summary, "upstream": self.patch.upstream,
                "sha256": self.patch.sha256, "fetched": self.pull.diff_url,
                "files": self.kept, "left_out": self.dropped, "status": self.status,
                "notes": [self.pull.note] if self.pull.note else []}


def github_host() -> str:
    host = os.environ.get(HOST_ENV, "").strip() or GITHUB
    try:
        http.check_url(host)
    except http.HttpError as exc:
        raise UsageError(f"{HOST_ENV}={host!r}: {exc.detail}") from None
    return host.rstrip("/")


def parse_pull(arg: str, m: Manifest, package: str = VLLM.name) -> PullRequest:
    """``N``, ``#N`` (a pull request of ``package``'s GitHub repository) or a pull request's
    URL."""
    text = arg.strip()
    number = text[1:] if text.startswith("#") else text
    if number.isdigit():
        if int(number) <= 0:
            raise UsageError(f"{arg!r}: a pull request number is positive")
        owner_name, note = _github_repo(m, package), ""
        if owner_name is None:
            owner_name = KNOWN_GITHUB.get(package)
            where = m.package(package).id.key("repo")
            if owner_name is None:
                raise UsageError(f"add-pr {arg}: {where} of {m.path.name} names no GitHub "
                                 f"repository of {package}; list it there "
                                 "(https://github.com/OWNER/NAME.git) or give the pull "
                                 "request's URL")
            note = (f"{where} of {m.path.name} names no GitHub repository: pull request "
                    f"{number} of {'/'.join(owner_name)} (give a URL for another)")
        return PullRequest(github_host(), *owner_name, int(number), note=note)
    parts = urllib.parse.urlsplit(text)
    found = _PULL_PATH.match(parts.path) if parts.scheme in ("http", "https") else None
    if not found or not parts.netloc:
        raise UsageError(f"{arg!r}: expected a pull request number or URL "
                         "(https://github.com/OWNER/NAME/pull/N)")
    prefix, owner, name, n = found.groups()
    if parts.hostname in ("github.com", "www.github.com") and not prefix:
        return PullRequest(github_host(), owner, name, int(n))
    # a GitHub of its own (an enterprise install, a mirror): fetched where it lives
    host = f"{parts.scheme}://{parts.netloc}{prefix}"
    return PullRequest(host, owner, name, int(n), web=host)


def _github_repo(m: Manifest, package: str = VLLM.name) -> tuple[str, str] | None:
    for repo in m.package(package).repos:
        found = _GITHUB_SOURCE.match(repo.strip())
        if found:
            return found.group(1), found.group(2)
    return None


def _keeper(include: Sequence[str], tops: Sequence[str] = ()):
    """What to keep of the pull request's files: all but those under LEFT_OUT (and, with
    ``tops``, another package's import folders, those outside them), unless --include names
    them."""
    for glob in include:
        if not glob.strip():
            raise UsageError("--include: an empty pattern")

    def keep(path: str) -> bool:
        top = path.split("/", 1)[0]
        if top not in LEFT_OUT and (not tops or (top in tops and "/" in path)):
            return True
        return any(_matches(path, g) for g in include)
    return keep


def _matches(path: str, glob: str) -> bool:
    """``glob`` as --include means it: a pattern, or a folder and what is under it."""
    return fnmatch.fnmatchcase(path, glob) or path.startswith(glob.rstrip("/") + "/")


def _check_include(include: Sequence[str], files: Sequence[str], number: int) -> None:
    """An --include that matches no file of the pull request is a typo, not a no-op."""
    for glob in include:
        if not any(_matches(path, glob) for path in files):
            shown = ", ".join(files[:SHOWN]) + (" ..." if len(files) > SHOWN else "")
            raise UsageError(f"--include {glob!r} matches no file of pull request {number} "
                             f"(its files: {shown or 'none'})")


def fetch(pull: PullRequest) -> bytes:
    try:
        return http.get_bytes(pull.diff_url, timeout=TIMEOUT, max_bytes=MAX_BYTES,
                              headers={"Accept": "text/plain"})
    except http.HttpError as exc:
        if exc.status == 404:
            raise PatchkitError(f"GET {pull.diff_url}: HTTP 404: no pull request {pull.number} in "
                                f"{pull.owner}/{pull.name} (or it is private)") from None
        raise PatchkitError(str(exc)) from None


def run(manifest_path: Path, pr: str, *, patch_id: str | None = None,
        include: Sequence[str] = (), package: str | None = None,
        progress: Progress | None = None, cache: Path | None = None) -> AddedPr:
    m = manifest.load(manifest_path)
    name = package or m.vllm.name
    # an unknown package is one line, with "did you mean"
    run = run_spec(m, only=[package] if package is not None else (), cache=cache)
    pull = parse_pull(pr, m, name)
    keep = _keeper(include, _tops(run, name, progress))
    pid = intake.check_new_id(m, patch_id if patch_id is not None else f"pr-{pull.number}",
                              package=m.package(name).id)
    data = fetch(pull)
    sha = hashlib.sha256(data).hexdigest()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise PatchkitError(f"{pull.diff_url}: the answer is not UTF-8 text (byte {exc.start}); "
                            "not a diff") from None
    try:
        kept_text, kept, dropped = difftext.keep_files(text, keep)
    except difftext.DiffParseError as exc:
        raise PatchkitError(f"{pull.diff_url}: not a diff: {exc}") from None
    _check_include(include, sorted(kept + dropped), pull.number)
    if not kept:
        raise PatchkitError(f"pull request {pull.number} changes only files no image holds "
                            f"({', '.join(dropped[:3])}{' ...' if len(dropped) > 3 else ''}); "
                            "keep some with --include GLOB")
    title = difftext.subject(text)
    new = intake.NewPatch(pid, title or f"pull request {pull.number}", kept_text,
                          upstream=pull.url, sha256=sha, source=pull.diff_url,
                          package=m.package(name).id)
    reports = intake.prove(m, [new], run, progress=progress)
    intake.write(m, [new])
    return AddedPr(new, pull, kept, dropped, reports)


def _tops(run: RunSpec, package: str, progress: Progress | None) -> tuple[str, ...]:
    """Another package's import folders at its pin (``flashinfer/``): what an image holds of
    it, so what its patch may change.  vLLM's patches keep every path, as before."""
    pid = run.pin(package).id
    if not pid.confined:
        return ()
    log = (progress or Progress()).info
    pins = applier.resolve_pins(run, run.cache, log, None, [package])
    return applier.package_tops(pins[package], pid)
