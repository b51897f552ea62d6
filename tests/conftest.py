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


ENGINE_TESTS = "_docker.py"   # the file-name ending of the modules that drive the real engines


def pytest_collection_modifyitems(items):
    """The tests that drive the real engines share their state (the engines' images, the nodes,
    the registry), so they run in order on one worker of a parallel run (``make test`` runs
    pytest-xdist): they are the tests marked ``docker``, and their modules are named so that
    the controller, which sees only test ids, knows them."""
    stray = [item.nodeid for item in items if item.get_closest_marker("docker")
             and not item.nodeid.split("::", 1)[0].endswith(ENGINE_TESTS)]
    if stray:
        raise pytest.UsageError(f"{stray[0]}: marked docker, so its file's name ends in "
                                f"{ENGINE_TESTS} (the engine tests run in order on one worker)")


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """Work units for the workers: every engine test in one, in order; every other test on its
    own, as pytest-xdist's ``load`` sends them."""
    from xdist.scheduler import LoadScopeScheduling

    class Units(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return "engines" if path.endswith(ENGINE_TESTS) else nodeid

    return Units(config, log)
