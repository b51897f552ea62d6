from __future__ import annotations

import pytest

from testing import isolate, real_cache


@pytest.fixture(autouse=True)
def _isolated(tmp_path_factory, monkeypatch):
    """No test reads the user's git config or writes the user's cache."""
    isolate(monkeypatch, tmp_path_factory.mktemp("home"))


@pytest.fixture
def real_vllm(monkeypatch):
    """Point patchkit at the persistent cache that holds real vLLM releases."""
    cache = real_cache()
    monkeypatch.setenv("PATCHKIT_CACHE_DIR", str(cache))
    return cache
