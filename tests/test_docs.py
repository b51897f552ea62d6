"""The documentation as users read it: every relative link in README.md and docs/*.md resolves,
and every code block marked for it runs (docs/development.md, "Examples that run").

A block is marked by its info string: ```` ```sh test ```` runs with bash in a scratch copy of
this repository's patchset (exit 0 expected; ```` ```sh test exit=N ```` expects N), and
```` ```yaml test ```` is a manifest that ``patchkit validate`` accepts (the patch files it
names get placeholders). A ```` ```text output ```` block right after a ```` ```sh test ````
block is what the script prints (standard output and error, as a terminal shows them): they
must hold those lines.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from testing import REPO_ROOT, release_cache

PAGES = [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```([^\n`]*)\n(.*?)^```\s*$", re.S | re.M)
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
# What a project needs to be the repository's patchset: the manifest and the files it names.
PROJECT = ("patchset.yaml", "patches", "overlays", "build")


def anchors(text: str) -> set[str]:
    """The anchors GitHub gives the headings of a Markdown text."""
    out: set[str] = set()
    seen: dict[str, int] = {}
    for block in FENCE.finditer(text):  # headings inside code blocks are not headings
        text = text.replace(block.group(0), "")
    for line in text.splitlines():
        heading = re.match(r"#{1,6}\s+(.*?)\s*$", line)
        if not heading:
            continue
        slug = re.sub(r"[^\w\- ]", "", heading.group(1).lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def links(page: Path) -> list[str]:
    text = FENCE.sub("", page.read_text())
    text = re.sub(r"`[^`\n]*`", "", text)  # code spans hold no links
    return [t for t in LINK.findall(text) if not re.match(r"[a-z]+:", t)]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(REPO_ROOT).as_posix())
def test_every_relative_link_resolves(page):
    broken = []
    for target in links(page):
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest.read_text()):
            broken.append(f"{target}: no heading gives #{anchor}")
    assert not broken, f"{page.name}: " + "; ".join(broken)


def test_error_lines_shown_name_the_verb_as_the_handler_prints_them():
    """The one handler prints ``patchkit VERB: error: ...``: a page showing the prefix
    without the verb shows a line no run prints."""
    from patchkit import errors

    code, line, _ = errors.handle(errors.UsageError("x"), "status", "0", Path,
                                  prog="patchkit status")
    assert line == "patchkit status: error: x"
    wrong = [f"{page.name}:{n}" for page in PAGES
             for n, text in enumerate(page.read_text().splitlines(), 1)
             if "patchkit: error:" in text]
    assert not wrong, wrong


def marked(kind: str) -> list[tuple[str, str, int, str | None]]:
    """Each block marked ``KIND test``: (where, its text, the exit code it declares, the text
    of a ``text output`` block right after it, which its standard output must hold)."""
    out = []
    for page in PAGES:
        text = page.read_text()
        blocks = list(FENCE.finditer(text))
        for block, after in zip(blocks, [*blocks[1:], None]):
            words = block.group(1).split()
            if words[:2] != [kind, "test"]:
                continue
            code = next((int(w[5:]) for w in words[2:] if w.startswith("exit=")), 0)
            shown = None
            if (after is not None and after.group(1).split() == ["text", "output"]
                    and not text[block.end():after.start()].strip()):
                shown = after.group(2)
            line = text.count("\n", 0, block.start()) + 1
            out.append((f"{page.relative_to(REPO_ROOT)}:{line}", block.group(2), code, shown))
    return out


SHELL = marked("sh")
MANIFESTS = [(where, text, code) for where, text, code, _ in marked("yaml")]


def test_the_docs_mark_examples_to_run():
    assert len(SHELL) + len(MANIFESTS) >= 15
    assert any(where.startswith("README.md") for where, *_ in SHELL)


@pytest.fixture
def project(tmp_path, monkeypatch):
    """A scratch copy of the repository's patchset, as git history of its own (export and
    bump read it), with the real releases' cache and patchkit on PATH."""
    cache = release_cache()
    monkeypatch.setenv("PATCHKIT_CACHE_DIR", str(cache))
    proj = tmp_path / "proj"
    proj.mkdir()
    for name in PROJECT:
        src = REPO_ROOT / name
        if not src.exists():
            continue
        if src.is_dir():
            shutil.copytree(src, proj / name)
        else:
            shutil.copy2(src, proj / name)
    for args in (["init", "-q", "-b", "main"], ["add", "-A"], ["commit", "-qm", "patchset"]):
        subprocess.run(["git", *args], cwd=proj, check=True, capture_output=True)
    # GitHub out of reach, as on the build machine: examples that read the manifest's source
    # list (GitHub, then pypi) fall through to the cached releases at once, wherever they run.
    monkeypatch.setenv("GIT_CONFIG_COUNT", "1")
    monkeypatch.setenv("GIT_CONFIG_KEY_0", "url.file:///nonexistent/github/.insteadOf")
    monkeypatch.setenv("GIT_CONFIG_VALUE_0", "https://github.com/")
    bindir = Path(sys.executable).parent
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    return proj


@pytest.mark.real_vllm
@pytest.mark.parametrize(("where", "code", "want", "shown"), SHELL, ids=[s[0] for s in SHELL])
def test_shell_example_runs(where, code, want, shown, project):
    out = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", code], cwd=project,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
    assert out.returncode == want, f"{where}: exit {out.returncode}\n{out.stdout}"
    if shown is not None:
        assert holds(out.stdout, shown), f"{where}: it prints not what the docs show:\n{out.stdout}"


def holds(printed: str, shown: str) -> bool:
    """Whether the lines shown appear in a row among those printed, each the start of its line
    (trailing blanks aside)."""
    got = [line.rstrip() for line in printed.splitlines()]
    want = [line.rstrip() for line in shown.splitlines()]
    return any(all(g.startswith(w) for g, w in zip(got[i:i + len(want)], want))
               for i in range(len(got) - len(want) + 1))


# The placeholders a manifest example's patch files get: the manifest is what is tested.
DIFF = """\
diff --git a/{path} b/{path}
new file mode 100644
--- /dev/null
+++ b/{path}
@@ -0,0 +1 @@
+PLACEHOLDER = True
"""
TRANSFORM = """\
from patchkit.transform import Transform


class Placeholder(Transform):
    path = "{path}"

    def postcondition(self, module):
        return True

    def transform(self, module):
        return module
"""


@pytest.mark.parametrize(("where", "text", "want"), MANIFESTS, ids=[w for w, _, _ in MANIFESTS])
def test_manifest_example_validates(where, text, want, tmp_path):
    for patch in yaml.safe_load(text).get("patches", []):
        root = patch.get("package", "vllm")
        placeholders = {"diff": DIFF.format(path=f"{root}/_placeholder.py"),
                        "transform": TRANSFORM.format(path=f"{root}/_placeholder.py")}
        for kind, body in placeholders.items():
            if kind in patch:
                (tmp_path / patch[kind]).parent.mkdir(parents=True, exist_ok=True)
                (tmp_path / patch[kind]).write_text(body)
        if "overlay" in patch:
            (tmp_path / patch["overlay"]).mkdir(parents=True, exist_ok=True)
    (tmp_path / "patchset.yaml").write_text(text)
    out = subprocess.run([sys.executable, "-m", "patchkit", "validate"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == want, f"{where}: exit {out.returncode}\n{out.stdout}\n{out.stderr}"


def _takes_manifest(command) -> bool:
    return any("--manifest" in p.opts for p in command.params)


def test_the_docs_say_which_verbs_take_manifest():
    """README and docs/commands.md say every verb but smoke takes --manifest: so it is."""
    import click

    from patchkit.cli import cli

    ctx = click.Context(cli)
    verbs = {name: cli.get_command(ctx, name) for name in cli.list_commands(ctx)}
    cache = verbs["cache"]
    verbs.update({f"cache {n}": cache.get_command(ctx, n) for n in cache.list_commands(ctx)})
    assert sorted(n for n, c in verbs.items() if not _takes_manifest(c)) == ["smoke"]
    for page in ("README.md", "docs/commands.md"):
        text = " ".join((REPO_ROOT / page).read_text(encoding="utf-8").split())
        assert "every one but `smoke` takes `--manifest file`" in text.lower(), page
