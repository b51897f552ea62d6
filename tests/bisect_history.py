"""An upstream with a long history, written in one ``git fast-import`` (a few hundred commits
in well under a second), and a patchset pinned at its first release.

The first-parent line of ``main`` runs from v1.0.0 to v2.0.0; along it:

* ``side-fix`` is broken on a side branch, brought in by a merge: first-parent bisect names the
  merge, never a commit of the side branch;
* the mode file gains a header (``fast-mode`` applies at an offset from there: the same fate);
* ``table-entry`` conflicts from BREAK on, and ``table-more``, which needs it, fails with it;
* ``fast-mode`` is upstream from UPSTREAM on (its ``vllm:`` range ends before v2.0.0, yet bisect
  tests it at every commit);
* ``stable`` applies everywhere on that line;
* ``diag-mode``, only in the variant ``diag``, adds to the mode file after fast-mode's hunk.

Besides: every commit also edits a noise file (``noise_files`` of them, never checked out by a
sparse checkout); v1.0.1 sits on a release branch off v1.0.0 (its cherry-pick appends a line to
the stable file, where ``stable`` then needs fuzz), v1.9.0 on another off main 90% of the way;
v2.1.0rc1 (a pre-release) and ``nightly`` come after v2.0.0; ``island`` is a history of its own.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from fixtures import make_diff

TABLE = '"""The table."""\n\nTABLE = {\n    "fp8": 1,\n    "bf16": 4,\n}\n'
TABLE_ENTRY = TABLE.replace('"fp8": 1,\n', '"fp8": 1,\n    "nvfp4": 2,\n')
TABLE_MORE = TABLE_ENTRY.replace('"nvfp4": 2,\n', '"nvfp4": 2,\n    "nvfp4_tail": 5,\n')
TABLE_BROKEN = TABLE.replace('"fp8": 1,\n', '"fp8": 1,\n    "int4": 3,\n')
MODE = '"""The modes."""\n\nimport os\n\nMODE = "plain"\n\n\ndef mode():\n    return MODE\n'
MODE_FAST = MODE.replace('"plain"', '"fast"')
MODE_HEADER = "# Modes.\n# Two lines of header.\n"
STABLE = "def stable():\n    return 1\n"
SIDE = "def side():\n    return 1\n"

MANIFEST = """\
name: history
vllm:
  repo: {repo}
  ref: v1.0.0
variants:
  diag: diagnostics on
patches:
  - id: diag-mode
    summary: a diagnostics flag beside the mode
    diff: patches/diag-mode.diff
    variants: [diag]
  - id: table-entry
    summary: add nvfp4 to the table
    diff: patches/table-entry.diff
    upstream: https://github.com/vllm-project/vllm/pull/777
    verify:
      - file: pkg/table.py
        in: TABLE
        has_key: nvfp4
  - id: table-more
    summary: add the nvfp4 tail after nvfp4
    diff: patches/table-more.diff
  - id: fast-mode
    summary: the fast mode
    diff: patches/fast-mode.diff
    vllm: "<2"
  - id: stable
    summary: a fix nobody touches
    diff: patches/stable.diff
  - id: side-fix
    summary: a fix of the side module
    diff: patches/side-fix.diff
"""


@dataclass
class History:
    """Commits as ``git fast-import`` commands; marks stand for commits until it is written."""

    stream: list[bytes] = field(default_factory=list)
    marks: int = 0
    clock: int = 1_600_000_000

    def commit(self, branch: str, subject: str, files: dict[str, str], parent: int | None,
               merge: int | None = None) -> int:
        self.marks += 1
        self.clock += 60
        who = f"dev <dev@example.invalid> {self.clock} +0000"
        msg = subject.encode()
        out = [f"commit refs/heads/{branch}\nmark :{self.marks}\nauthor {who}\ncommitter {who}\n"
               f"data {len(msg)}\n".encode(), msg, b"\n"]
        if parent is not None:
            out.append(f"from :{parent}\n".encode())
        if merge is not None:
            out.append(f"merge :{merge}\n".encode())
        for path, text in files.items():
            data = text.encode()
            out += [f"M 100644 inline {path}\ndata {len(data)}\n".encode(), data, b"\n"]
        self.stream.append(b"".join(out) + b"\n")
        return self.marks

    def tag(self, name: str, mark: int) -> None:
        self.stream.append(f"reset refs/tags/{name}\nfrom :{mark}\n\n".encode())

    def write(self, repo: Path) -> dict[int, str]:
        """A bare repository at ``repo`` with the history; mark -> commit sha."""
        subprocess.run(["git", "init", "-q", "--bare", "-b", "main", str(repo)], check=True)
        marks = repo / "marks"
        subprocess.run(["git", "fast-import", "--quiet", f"--export-marks={marks}"], cwd=repo,
                       input=b"".join(self.stream), check=True)
        found = dict(line.split() for line in marks.read_text().splitlines())
        marks.unlink()
        return {int(k[1:]): v for k, v in found.items()}


@dataclass
class Upstream:
    repo: Path
    commits: int                    # first-parent commits in v1.0.0..v2.0.0
    sha: dict[str, str]             # the named commits: v1.0.0, fork, side-break, merge, ...


def build(root: Path, n: int = 300, noise_files: int = 10) -> Upstream:
    """The upstream at ``root``: ``n`` first-parent commits after v1.0.0 up to v2.0.0."""
    h = History()
    noise = {f"noise/n{i:04d}.txt": f"{i}\n" for i in range(noise_files)}
    base = h.commit("main", "Initial layout", {"pkg/table.py": TABLE, "pkg/mode.py": MODE,
                                               "pkg/stable.py": STABLE, "pkg/side.py": SIDE,
                                               **noise}, None)
    h.tag("v1.0.0", base)
    h.tag("v1.0.1", h.commit("releases/v1.0", "[Release] v1.0.1 (#9001)",
                             {"pkg/stable.py": STABLE + "# 1.0.1\n"}, base))
    fork_at, merge_at, release_at = n // 5, n // 3, (n * 9) // 10
    at = {"header": n // 2, "break": (n * 3) // 5, "upstream": (n * 4) // 5}
    change = {"header": ("[Misc] a header for the mode file", {"pkg/mode.py": MODE_HEADER + MODE}),
              "break": ("[Kernel] add int4 to the table", {"pkg/table.py": TABLE_BROKEN}),
              "upstream": ("[Perf] the fast mode by default",
                           {"pkg/mode.py": MODE_HEADER + MODE_FAST})}
    marks = {"v1.0.0": base}
    prev, side_tip, side_tree = base, None, {}
    for i in range(1, n + 1):
        files = {f"noise/n{i % max(noise_files, 1):04d}.txt": f"{i}\n"}
        subject = f"[Core] step {i} (#{10000 + i})"
        for name, when in at.items():
            if i == when:
                subject = f"{change[name][0]} (#{10000 + i})"
                files.update(change[name][1])
        if i == fork_at:
            side, side_tree = prev, {}
            for j in range(1, 21):
                sfiles = {"side/notes.txt": f"{j}\n"}
                if j == 10:
                    sfiles["pkg/side.py"] = SIDE.replace("return 1", "return 10")
                side = h.commit("side", f"side work {j}", sfiles, side)
                side_tree.update(sfiles)
                if j == 10:
                    marks["side-break"] = side
            side_tip = side
        if i == merge_at:
            # fast-import writes a merge's tree as given: the side branch's files go in by hand
            prev = h.commit("main", f"Merge pull request #{10000 + i} from dev/side",
                            {**files, **side_tree}, prev, merge=side_tip)
            marks["merge"] = prev
            continue
        prev = h.commit("main", subject, files, prev)
        for name, when in at.items():
            if i == when:
                marks[name] = prev
        if i == release_at:  # a release of its own branch, as vLLM tags them
            marks["v1.9.0"] = h.commit("releases/v1.9", "[Release] v1.9.0 (#9002)",
                                       {"RELEASE": "1.9.0\n"}, prev)
            h.tag("v1.9.0", marks["v1.9.0"])
            marks["v1.9-fork"] = prev
    marks["v2.0.0"] = prev
    h.tag("v2.0.0", prev)
    rc = h.commit("main", "[Core] after the release (#99999)", {"pkg/stable.py": STABLE + "# rc\n"},
                  prev)
    h.tag("v2.1.0rc1", rc)
    h.tag("nightly", rc)
    h.tag("island", h.commit("island", "an unrelated history", {"README": "elsewhere\n"}, None))
    shas = h.write(root)
    return Upstream(root, n, {name: shas[m] for name, m in marks.items()})


def make_project(tmp: Path, upstream: Upstream) -> Path:
    proj = tmp / "proj"
    (proj / "patches").mkdir(parents=True)
    diffs = {"diag-mode": (MODE, MODE + "\n\nDIAG = True\n", "pkg/mode.py"),
             "table-entry": (TABLE, TABLE_ENTRY, "pkg/table.py"),
             "table-more": (TABLE_ENTRY, TABLE_MORE, "pkg/table.py"),
             "fast-mode": (MODE, MODE_FAST, "pkg/mode.py"),
             "stable": (STABLE, STABLE.replace("1", "2"), "pkg/stable.py"),
             "side-fix": (SIDE, SIDE.replace("1", "2"), "pkg/side.py")}
    for pid, (before, after, rel) in diffs.items():
        (proj / "patches" / f"{pid}.diff").write_text(make_diff(before, after, rel))
    (proj / "patchset.yaml").write_text(MANIFEST.format(repo=upstream.repo))
    return proj
