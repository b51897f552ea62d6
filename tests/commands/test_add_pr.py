"""add-pr against a local HTTP server that answers as GitHub does for ``/OWNER/NAME/pull/N.diff``."""

from __future__ import annotations

import hashlib
import http.server
import json
import os
import socket
import subprocess
import threading
from pathlib import Path

import pytest
import yaml
from testing import patchkit, snapshot
from testing.upstream import sh
from testing.project import GH_MANIFEST, MOD_V1, make_project

from patchkit import manifest
from patchkit.errors import ManifestError
from patchkit.kinds.diff import text as difftext
from patchkit.series import applier
from patchkit.run import run_spec

class Server:
    """Serves ``routes`` (path -> bytes) on 127.0.0.1; anything else is a 404, as on GitHub."""

    def __init__(self) -> None:
        self.routes: dict[str, bytes] = {}
        self.asked: list[str] = []
        routes, asked = self.routes, self.asked

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802
                asked.append(self.path)
                body = routes.get(self.path)
                if body is None:
                    self.send_response(404)
                    self.send_header("Content-Type", "text/plain")
                    self.end_headers()
                    self.wfile.write(b"Not Found")
                    return
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server(monkeypatch):
    s = Server()
    monkeypatch.setenv("PATCHKIT_GITHUB", s.url)
    yield s
    s.close()


def git_out(*args: str, cwd: Path) -> str:
    """A git command's output as it is (``sh`` strips it, which would cut a hunk's last line)."""
    from testing.upstream import ENV

    return subprocess.run(["git", *args], cwd=cwd, env=dict(os.environ, **ENV), check=True,
                          text=True, stdout=subprocess.PIPE).stdout


def _pr_branch(upstream: Path, work: Path, files: dict[str, str], title: str) -> Path:
    """A clone of the upstream at v1 with one commit on a branch, as a PR's head."""
    sh("git", "clone", "-q", str(upstream), str(work))
    sh("git", "checkout", "-q", "-b", "pr", "v1", cwd=work)
    for rel, text in files.items():
        (work / rel).parent.mkdir(parents=True, exist_ok=True)
        (work / rel).write_text(text)
    sh("git", "add", "-A", cwd=work)
    sh("git", "commit", "-qm", title, cwd=work)
    return work


PR_FILES = {
    "pkg/mod.py": MOD_V1.replace("return x + 1", "return x + 2"),
    "tests/test_mod.py": "from pkg.mod import helper\n\n\ndef test_helper():\n    assert helper(1) == 3\n",
    "docs/usage.md": "# Usage\n\nhelper adds two.\n",
    ".github/workflows/ci.yml": "on: push\n",
    "benchmarks/bench_helper.py": "print('fast')\n",
}


@pytest.fixture
def proj(tmp_path, server):
    proj = make_project(tmp_path, GH_MANIFEST)
    work = _pr_branch(tmp_path / "upstream", tmp_path / "pr", PR_FILES,
                      "[Perf] Helper adds two (#101)")
    # GitHub's .diff of a PR: `git diff base...head`, every file of the PR
    server.routes["/vllm-project/vllm/pull/101.diff"] = git_out("diff", "v1...pr",
                                                                cwd=work).encode()
    # a format-patch style diff carries the title in its Subject: line
    server.routes["/vllm-project/vllm/pull/102.diff"] = git_out(
        "format-patch", "-1", "--stdout", "pr", cwd=work).encode()
    # a PR against code that the pin does not have: its hunk conflicts
    conflicting = _pr_branch(tmp_path / "upstream", tmp_path / "pr2",
                             {"pkg/mod.py": MOD_V1.replace('"fp8": 1', '"fp8": 7')}, "x")
    text = git_out("diff", "v1...pr", cwd=conflicting).replace('-    "fp8": 1,', '-    "fp8": 5,')
    server.routes["/vllm-project/vllm/pull/103.diff"] = text.encode()
    server.routes["/vllm-project/vllm/pull/104.diff"] = (
        "diff --git a/tests/a.py b/tests/a.py\nnew file mode 100644\n--- /dev/null\n"
        "+++ b/tests/a.py\n@@ -0,0 +1 @@\n+A = 1\n").encode()
    return proj


def test_a_pr_number_becomes_a_patch_without_its_tests_and_docs(proj, server):
    before = (proj / "patchset.yaml").read_text()
    p = patchkit("add-pr", "101", cwd=proj)
    assert p.returncode == 0, p.stderr
    assert server.asked == ["/vllm-project/vllm/pull/101.diff"]
    fetched = server.routes["/vllm-project/vllm/pull/101.diff"]
    sha = hashlib.sha256(fetched).hexdigest()
    assert p.stdout.splitlines() == [
        f"added     pr-101: patches/pr-101.diff from {server.url}/vllm-project/vllm/pull/101.diff "
        f"(sha256 {sha[:12]})",
        "  summary: pull request 101",
        "  left out (4 file(s) no image holds; --include GLOB keeps them): "
        ".github/workflows/ci.yml, benchmarks/bench_helper.py, docs/usage.md, tests/test_mod.py",
        "ok: the series applies at vLLM v1 with pr-101 (1 file(s))"]
    saved = (proj / "patches/pr-101.diff").read_text()
    assert difftext.touched(difftext.parse(saved)) == ["pkg/mod.py"]
    assert saved in fetched.decode()  # the kept section byte for byte
    after = (proj / "patchset.yaml").read_text()
    assert after.startswith(before)  # only lines added: comments and all else stay
    assert after[len(before):] == (
        "  - id: pr-101\n"
        "    summary: pull request 101\n"
        "    upstream: https://github.com/vllm-project/vllm/pull/101\n"  # not the fetch host
        "    diff: patches/pr-101.diff\n"
        f"    sha256: {sha}\n")
    m = manifest.load(proj / "patchset.yaml")
    assert m.patch("pr-101").sha256 == sha
    report = applier.apply_series(m, run=run_spec(m), workdir=proj / ".patchkit/vllm")
    assert report.ok and report.status_of("pr-101") == "applied"
    assert "return x + 2" in (proj / ".patchkit/vllm/pkg/mod.py").read_text()
    assert not (proj / ".patchkit/vllm/tests").exists()


def test_a_format_patch_gives_the_title_and_include_keeps_tests(proj, server):
    p = patchkit("add-pr", "#102", "--id", "helper-adds-two", "--include", "tests/*",
                 "--format", "json", cwd=proj)
    assert p.returncode == 0, p.stderr
    data = json.loads(p.stdout)
    assert data["id"] == "helper-adds-two" and data["summary"] == "[Perf] Helper adds two (#101)"
    assert data["files"] == ["pkg/mod.py", "tests/test_mod.py"]
    assert data["left_out"] == [".github/workflows/ci.yml", "benchmarks/bench_helper.py",
                                "docs/usage.md"]
    saved = (proj / "patches/helper-adds-two.diff").read_text()
    assert saved.startswith("From ") and "Subject: [PATCH] [Perf] Helper adds two (#101)" in saved
    assert "docs/usage.md" not in saved  # nor in a diffstat
    entry = yaml.safe_load((proj / "patchset.yaml").read_text())["patches"][-1]
    assert entry["summary"] == "[Perf] Helper adds two (#101)"
    assert entry["upstream"] == "https://github.com/vllm-project/vllm/pull/102"


def test_a_github_url_is_fetched_from_the_configured_host(proj, server):
    p = patchkit("add-pr", "https://github.com/vllm-project/vllm/pull/101/files", cwd=proj)
    assert p.returncode == 0, p.stderr
    assert server.asked == ["/vllm-project/vllm/pull/101.diff"]


def test_a_url_of_another_host_is_fetched_there(proj, server, monkeypatch):
    server.routes["/ghe/someone/vllm-fork/pull/7.diff"] = server.routes[
        "/vllm-project/vllm/pull/101.diff"]
    monkeypatch.delenv("PATCHKIT_GITHUB")
    p = patchkit("add-pr", f"{server.url}/ghe/someone/vllm-fork/pull/7", cwd=proj)
    assert p.returncode == 0, p.stderr
    entry = yaml.safe_load((proj / "patchset.yaml").read_text())["patches"][-1]
    assert (entry["id"], entry["upstream"]) == ("pr-7", f"{server.url}/ghe/someone/vllm-fork/pull/7")


def test_a_conflicting_pr_writes_nothing_and_exits_1(proj):
    before = snapshot(proj)
    p = patchkit("add-pr", "103", cwd=proj)
    assert p.returncode == 1, p.stdout
    assert p.stderr.splitlines()[-1].startswith(
        "patchkit add-pr: error: pr-103 does not apply at vLLM v1 (")
    assert "conflict: hunk 1 of pkg/mod.py" in p.stderr and "nothing was written" in p.stderr
    assert snapshot(proj) == before


@pytest.mark.parametrize("args,code,message", [
    (("999",), 1, "patchkit add-pr: error: GET {url}/vllm-project/vllm/pull/999.diff: HTTP 404: no pull "
                  "request 999 in vllm-project/vllm (or it is private)"),
    (("104",), 1, "patchkit add-pr: error: pull request 104 changes only files no image holds "
                  "(tests/a.py); keep some with --include GLOB"),
    (("101", "--id", "table-nvfp4"), 2, "patchkit add-pr: error: --id table-nvfp4: the series has that "
                                        "id already (patchset.yaml:6); give another with --id"),
    (("101", "--id", "Bad_Id"), 2, "patchkit add-pr: error: --id 'Bad_Id': not a valid id (lowercase "
                                   "letters, digits and '-', starting with a letter or digit)"),
    (("101", "--id", "a" * 101), 2, f"patchkit add-pr: error: --id '{'a' * 37}...': 101 characters "
                                    "long; an id has at most 100"),
    (("pull-101",), 2, "patchkit add-pr: error: 'pull-101': expected a pull request number or URL "
                       "(https://github.com/OWNER/NAME/pull/N)"),
    (("https://github.com/vllm-project/vllm/issues/5",), 2,
     "patchkit add-pr: error: 'https://github.com/vllm-project/vllm/issues/5': expected a pull request "
     "number or URL (https://github.com/OWNER/NAME/pull/N)"),
    (("101", "--include", ""), 2, "patchkit add-pr: error: --include: an empty pattern"),
    (("101", "--include", "tests/*", "--include", "nomatch/*"), 2,
     "patchkit add-pr: error: --include 'nomatch/*' matches no file of pull request 101 (its files: "
     ".github/workflows/ci.yml, benchmarks/bench_helper.py, docs/usage.md, pkg/mod.py, "
     "tests/test_mod.py)"),
    (("104", "--include", "test/"), 2,
     "patchkit add-pr: error: --include 'test/' matches no file of pull request 104 (its files: "
     "tests/a.py)"),
])
def test_bad_inputs_are_one_line(proj, server, args, code, message):
    before = snapshot(proj)
    p = patchkit("add-pr", *args, cwd=proj)
    assert (p.returncode, p.stderr.strip()) == (code, message.format(url=server.url))
    assert snapshot(proj) == before


def test_an_existing_file_of_the_id_is_refused(proj):
    (proj / "patches/pr-101.diff").write_text("mine\n")
    p = patchkit("add-pr", "101", cwd=proj)
    assert (p.returncode, p.stderr.strip()) == (
        2, "patchkit add-pr: error: --id pr-101: patches/pr-101.diff exists already and is no entry of "
           "the series; remove it or give another id")


def test_an_unreachable_host_is_one_line(proj, monkeypatch):
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("PATCHKIT_GITHUB", f"http://127.0.0.1:{port}")
    before = snapshot(proj)
    p = patchkit("add-pr", "101", cwd=proj)
    assert (p.returncode, p.stderr.strip()) == (
        1, f"patchkit add-pr: error: GET http://127.0.0.1:{port}/vllm-project/vllm/pull/101.diff: "
           f"connection refused: nothing listens on 127.0.0.1:{port}")
    assert snapshot(proj) == before
    monkeypatch.setenv("PATCHKIT_GITHUB", "127.0.0.1:80")
    p = patchkit("add-pr", "101", cwd=proj)
    assert (p.returncode, p.stderr.strip()) == (
        2, "patchkit add-pr: error: PATCHKIT_GITHUB='127.0.0.1:80': no scheme; did you mean "
           "'http://127.0.0.1:80'?")


def test_a_number_without_a_github_source_means_vllm_project(proj, server):
    path = proj / "patchset.yaml"
    text = path.read_text()
    path.write_text(text.replace(", https://github.com/vllm-project/vllm.git]", "]"))
    assert "github.com" not in path.read_text()
    p = patchkit("add-pr", "101", cwd=proj)
    assert p.returncode == 0, p.stderr
    assert server.asked == ["/vllm-project/vllm/pull/101.diff"]
    assert ("note: vllm.repo of patchset.yaml names no GitHub repository: pull request 101 of "
            "vllm-project/vllm (give a URL for another)") in p.stdout.splitlines()
    entry = yaml.safe_load((proj / "patchset.yaml").read_text())["patches"][-1]
    assert entry["upstream"] == "https://github.com/vllm-project/vllm/pull/101"


def test_a_github_url_records_github_not_the_fetch_host(proj, server):
    p = patchkit("add-pr", "https://github.com/vllm-project/vllm/pull/102", "--format", "json",
                 cwd=proj)
    assert p.returncode == 0, p.stderr
    data = json.loads(p.stdout)
    assert data["fetched"] == f"{server.url}/vllm-project/vllm/pull/102.diff"
    assert data["upstream"] == "https://github.com/vllm-project/vllm/pull/102"
    assert data["notes"] == []


def test_the_sha256_key_is_checked(proj):
    path = proj / "patchset.yaml"
    path.write_text(path.read_text().replace("    diff: patches/table.diff\n",
                                             "    diff: patches/table.diff\n    sha256: abc\n"))
    with pytest.raises(ManifestError, match=r"patchset.yaml:9: patches\[0\] \(id=table-nvfp4\): "
                       r"sha256: expected the sha256 of the fetched diff \(64 hex digits\), got "
                       r"'abc'$"):
        manifest.load(path)


# ------------------------------------------------------------------------------ the diff kind

def test_keep_files_keeps_sections_byte_for_byte(tmp_path):
    binary = ("diff --git a/vllm/b.bin b/vllm/b.bin\nindex 88768efdf77ec78c9a995f94881793be6a41752b"
              "..3e3315e1b02129d197721a8a0b56dd88862f454d 100644\nGIT binary patch\nliteral 5\n"
              "McmZQzO3KUw00MIXJOBUy\n\nliteral 5\nMcmZQzOv=my00M6TI{*Lx\n\n")
    tests = ("diff --git a/tests/t.py b/tests/t.py\nindex 587be6b..975fbec 100644\n--- a/tests/t.py\n"
             "+++ b/tests/t.py\n@@ -1 +1 @@\n-x\n+y\n")
    moved = ("diff --git a/tests/old.py b/vllm/new.py\nsimilarity index 100%\n"
             "rename from tests/old.py\nrename to vllm/new.py\n")
    head = ("From 0000 Mon Sep 17 00:00:00 2001\nSubject: [PATCH 2/3] =?UTF-8?q?Caf=C3=A9?=\n"
            " for all\n\nWhy.\n---\n tests/t.py | 2 +-\n 1 file changed\n\n")
    text = head + tests + binary + moved + "-- \n2.39.5\n"
    kept_text, kept, dropped = difftext.keep_files(text, lambda p: not p.startswith("tests/"))
    assert kept_text == head.split("---\n")[0] + binary + moved + "-- \n2.39.5\n"
    assert (kept, dropped) == (["vllm/b.bin", "tests/old.py", "vllm/new.py"], ["tests/t.py"])
    assert difftext.subject(text) == "Café for all"
    assert difftext.subject(tests) is None
    with pytest.raises(difftext.DiffParseError):
        difftext.keep_files("no diff here\n", lambda p: True)


# ------------------------------------------------------------------------------ another package

def _fi_pr() -> bytes:
    """A FlashInfer pull request as GitHub serves its .diff: the real patch to the sm12x MoE
    kernel, a test, and a CUDA source outside the package's folder (no wheel holds csrc/)."""
    from testing.flashinfer import FI_FILE, FI_PATCH

    return (f"diff --git a/{FI_FILE} b/{FI_FILE}\n{FI_PATCH}"
            "diff --git a/tests/moe/test_limit.py b/tests/moe/test_limit.py\nnew file mode 100644\n"
            "--- /dev/null\n+++ b/tests/moe/test_limit.py\n@@ -0,0 +1 @@\n+LIMIT = 1\n"
            "diff --git a/csrc/limit.cu b/csrc/limit.cu\nnew file mode 100644\n"
            "--- /dev/null\n+++ b/csrc/limit.cu\n@@ -0,0 +1 @@\n+// limit\n").encode()


@pytest.fixture
def stack(tmp_path, server, real_vllm):
    from testing.flashinfer import ensure_releases, make_stack

    ensure_releases(real_vllm)
    proj = make_stack(tmp_path)
    server.routes["/flashinfer-ai/flashinfer/pull/3817.diff"] = _fi_pr()
    return proj


@pytest.mark.real_vllm
def test_a_flashinfer_pr_becomes_a_flashinfer_patch(stack, server):
    from testing.flashinfer import FI_FILE

    before = (stack / "patchset.yaml").read_text()
    # the FlashInfer patch of the project is that PR already: take it out first
    (stack / "patchset.yaml").write_text(before[:before.index("  - id: fi-moe-activations")])
    p = patchkit("add-pr", "--package", "flashinfer", "3817", "--format", "json", cwd=stack)
    assert p.returncode == 0, p.stderr
    assert server.asked == ["/flashinfer-ai/flashinfer/pull/3817.diff"]
    data = json.loads(p.stdout)
    assert (data["package"], data["path"], data["files"]) == (
        "flashinfer", "patches/flashinfer/pr-3817.diff", [FI_FILE])
    assert data["left_out"] == ["tests/moe/test_limit.py", "csrc/limit.cu"]   # as the diff has them
    assert data["notes"] == ["packages.flashinfer.repo of patchset.yaml names no GitHub "
                             "repository: pull request 3817 of flashinfer-ai/flashinfer "
                             "(give a URL for another)"]
    entry = yaml.safe_load((stack / "patchset.yaml").read_text())["patches"][-1]
    assert entry == {"id": "pr-3817", "summary": "pull request 3817", "package": "flashinfer",
                     "upstream": "https://github.com/flashinfer-ai/flashinfer/pull/3817",
                     "diff": "patches/flashinfer/pr-3817.diff", "sha256": data["sha256"]}
    p = patchkit("apply", "--package", "flashinfer", cwd=stack)
    assert p.returncode == 0, p.stderr
    assert "_SUPPORTED_ACTIVATIONS" in (stack / ".patchkit/flashinfer" / FI_FILE).read_text()
    assert not (stack / ".patchkit/flashinfer/csrc").exists()


@pytest.mark.real_vllm
def test_a_flashinfer_pr_is_proven_on_flashinfers_pin(stack, server):
    """On top of the project's own FlashInfer patch the same PR is upstream at FlashInfer's
    pin; one whose context that release lacks conflicts there, and nothing is written."""
    p = patchkit("add-pr", "--package", "flashinfer", "3817", cwd=stack)
    assert p.returncode == 0, p.stderr
    assert p.stdout.splitlines()[-2:] == [
        "note: at flashinfer v0.6.15 the tree has the change of pr-3817 already when its turn "
        "comes (it applies in reverse): it is in the series as upstream",
        "ok: the series applies at flashinfer v0.6.15 with pr-3817 (1 file(s))"]
    server.routes["/flashinfer-ai/flashinfer/pull/3818.diff"] = _fi_pr().replace(
        b" _COMPACT_STATIC_TILE_M = 128\n", b" _COMPACT_STATIC_TILE_M = 256\n")
    before = snapshot(stack)
    p = patchkit("add-pr", "--package", "flashinfer", "3818", cwd=stack)
    assert p.returncode == 1, p.stdout
    assert p.stderr.strip().splitlines()[-1].startswith(
        "patchkit add-pr: error: pr-3818 does not apply at flashinfer v0.6.15 (")
    assert "conflict" in p.stderr and "nothing was written" in p.stderr
    assert snapshot(stack) == before


@pytest.mark.real_vllm
def test_a_package_pr_without_a_known_github_repository_is_one_line(stack):
    text = (stack / "patchset.yaml").read_text().replace("  flashinfer:\n", "  b12x:\n    dist: b12x\n    repo: [pypi]\n    ref: v0.1.0\n  flashinfer:\n", 1)
    (stack / "patchset.yaml").write_text(text)
    before = snapshot(stack)
    for args, line in [
            (("--package", "b12x", "7"),
             "patchkit add-pr: error: add-pr 7: packages.b12x.repo of patchset.yaml names no GitHub "
             "repository of b12x; list it there (https://github.com/OWNER/NAME.git) or give "
             "the pull request's URL"),
            (("--package", "flashinfr", "7"),
             "patchkit add-pr: error: --package flashinfr: the manifest has no package 'flashinfr' "
             "(packages: vllm, b12x, flashinfer); did you mean 'flashinfer'?")]:
        p = patchkit("add-pr", *args, cwd=stack)
        assert (p.returncode, p.stderr.strip()) == (2, line)
    assert snapshot(stack) == before
