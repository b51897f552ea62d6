from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _isolated(tmp_path_factory, monkeypatch):
    """No test reads the user's git config or writes the user's cache."""
    home = tmp_path_factory.mktemp("home")
    (home / ".gitconfig").write_text("[user]\n\tname = test\n\temail = test@example.invalid\n"
                                     "[init]\n\tdefaultBranch = main\n")
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(home / ".gitconfig"))
    monkeypatch.setenv("GIT_TEMPLATE_DIR", "")
    monkeypatch.setenv("PATCHKIT_CACHE_DIR", str(home / "cache"))


def real_cache() -> Path:
    """The persistent cache the real-vLLM tests share between runs (wheels and the PyPI upstream)."""
    env = os.environ.get("PATCHKIT_REAL_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "patchkit"


@pytest.fixture
def real_vllm(monkeypatch):
    """Point patchkit at the persistent cache that holds real vLLM releases."""
    cache = real_cache()
    monkeypatch.setenv("PATCHKIT_CACHE_DIR", str(cache))
    return cache
