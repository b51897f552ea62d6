from __future__ import annotations

import os

import pytest

import testing
from testing import isolate, release_cache


@pytest.fixture(autouse=True)
def _isolated(tmp_path_factory, monkeypatch):
    """No test reads the user's git config or writes the user's cache."""
    isolate(monkeypatch, tmp_path_factory.mktemp("home"))


@pytest.fixture(scope="session", autouse=True)
def _release_cache(tmp_path_factory):
    """This process's cache for runs on the real releases, in pytest's temp folder (made at
    first use: most tests never need it)."""
    if not testing._releases:
        testing._releases.append(tmp_path_factory.getbasetemp() / f"releases-{os.getpid()}")


@pytest.fixture
def real_vllm(monkeypatch):
    """Point patchkit at a cache that holds the real vLLM releases (release_cache())."""
    cache = release_cache()
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
