"""The serve script's command line against the CLI of each patched vLLM release: every option
exists there, and every value is one that release accepts."""

from __future__ import annotations

import ast
import json
import os
import shlex
import shutil
import subprocess

from testing import REPO_ROOT

SERVE = REPO_ROOT / "build" / "serve.sh"
# The serve parser's files: the engine's, and the frontend's cli_args.py, which moved from
# entrypoints/openai (0.27.1) to entrypoints/launchers (0.31.0) to entrypoints/common (0.33.0).
ENGINE_ARGS = "vllm/engine/arg_utils.py"
FRONTEND_CLASSES = ("BaseFrontendArgs", "FrontendArgs")

# vLLM 0.27.1 and 0.28.0 have no `b12x` MoE backend (0.29.0 added it); docs/dspark.md tells their
# users to set DSPARK_DRAFT_MOE_BACKEND=auto.  A release listed here must refuse b12x and accept
# auto.
NO_B12X_MOE = {"v0.27.1", "v0.28.0"}


def command(rank: str) -> list[str]:
    env = {"PATH": os.environ["PATH"], "DSPARK_NODE_RANK": rank}
    out = subprocess.run([shutil.which("bash") or "/bin/bash", str(SERVE), "--print"], env=env,
                         capture_output=True, text=True, check=True)
    return shlex.split(out.stdout)


def options(words: list[str]) -> dict[str, str | None]:
    found: dict[str, str | None] = {}
    for i, word in enumerate(words):
        if word.startswith("--"):
            following = words[i + 1] if i + 1 < len(words) else None
            found[word] = None if following is None or following.startswith("--") else following
    return found


def cli_options(patched) -> set[str]:
    flags: set[str] = set()
    frontend = sorted((patched.tree / "vllm" / "entrypoints").glob("*/cli_args.py"))
    assert frontend, "no entrypoints/*/cli_args.py"
    for path in [patched.tree / ENGINE_ARGS, *frontend]:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        flags |= {n.value for n in ast.walk(tree)
                  if isinstance(n, ast.Constant) and isinstance(n.value, str)
                  and n.value.startswith("--")}
        for cls in ast.walk(tree):
            if isinstance(cls, ast.ClassDef) and cls.name in FRONTEND_CLASSES:
                flags |= {"--" + s.target.id.replace("_", "-") for s in cls.body
                          if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)}
    return flags


def literal_values(patched, rel: str, name: str) -> set[str]:
    """The strings of ``NAME = Literal[...]`` at the top level of ``rel``."""
    for stmt in ast.parse(patched.text(rel)).body:
        if isinstance(stmt, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == name for t in stmt.targets):
            return {n.value for n in ast.walk(stmt.value)
                    if isinstance(n, ast.Constant) and isinstance(n.value, str)}
    raise AssertionError(f"{rel} defines no {name}")


def dict_keys(patched, rel: str) -> set[str]:
    return {k.value for n in ast.walk(ast.parse(patched.text(rel))) if isinstance(n, ast.Dict)
            for k in n.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)}


def test_every_option_exists_in_the_release(patched):
    known = cli_options(patched)
    for rank in ("0", "1"):
        words = command(rank)
        assert words[:2] == ["vllm", "serve"]
        unknown = set(options(words)) - known
        assert not unknown, f"{patched.release} has no {sorted(unknown)}"


def test_every_value_is_accepted_by_the_release(patched):
    opts = options(command("0"))
    cache_dtypes = literal_values(patched, "vllm/config/cache.py", "CacheDType")
    moe_backends = literal_values(patched, "vllm/config/kernel.py", "MoEBackend")
    assert opts["--kv-cache-dtype"] in cache_dtypes
    assert opts["--moe-backend"] in moe_backends
    assert opts["--tokenizer-mode"] in dict_keys(patched, "vllm/tokenizers/registry.py")
    assert opts["--tool-call-parser"] in dict_keys(patched, "vllm/tool_parsers/__init__.py")
    assert opts["--reasoning-parser"] in dict_keys(patched, "vllm/reasoning/__init__.py")

    spec = json.loads(opts["--speculative-config"])
    assert spec["method"] in literal_values(patched, "vllm/config/speculative.py",
                                            "DSparkModelTypes")
    fields = {s.target.id for s in ast.walk(ast.parse(patched.text("vllm/config/speculative.py")))
              if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)}
    assert set(spec) <= fields
    if patched.release in NO_B12X_MOE:
        assert spec["moe_backend"] not in moe_backends and "auto" in moe_backends
    else:
        assert spec["moe_backend"] in moe_backends
