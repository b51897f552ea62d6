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


def pytest_collection_modifyitems(items):
    """Work units for parallel runs (``make test`` runs pytest-xdist with ``--dist loadgroup``).

    The tests that drive the real engines share their state (the engines' images, the nodes,
    the registry): they are one unit, run in order on one worker.  The tests of one applied
    release share its checkout (``patched``), made once a worker.  Every other module is a unit
    of its own, so its module fixtures are made once.  Without xdist the marks do nothing."""
    for item in items:
        params = getattr(item, "callspec", None)
        if item.get_closest_marker("docker"):
            group = "engines"
        elif params is not None and "patched" in params.params:
            group = f"release-{params.params['patched']}"
        else:
            group = item.nodeid.split("::", 1)[0]
        item.add_marker(pytest.mark.xdist_group(group))
