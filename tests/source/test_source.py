"""Refs, repositories and the cache of source.py and pypi.py, on fixture upstreams and tiny wheels."""

from __future__ import annotations

import shutil
import zipfile
from pathlib import Path

import pytest
from testing.upstream import make_upstream

from patchkit import source
from patchkit.source import pypi
from patchkit.errors import SourceError, UsageError


@pytest.fixture
def upstream(tmp_path):
    return make_upstream(tmp_path / "up", {"v1": {"pkg/mod.py": "A = 1\n"},
                                           "v2": {"pkg/mod.py": "A = 2\n"}})


@pytest.mark.parametrize("ref,needle", [
    ("", "the ref is empty"),
    ("-x", "starts with '-'"),
    ("--upload-pack=touch x", "starts with '-'"),
    ("v1 v2", "whitespace"),
    ("v1\n", "whitespace"),
    ("HEAD~1", "revision expression"),
    ("v1^", "revision expression"),
    ("v1^{tree}", "revision expression"),
    ("main@{1}", "revision expression"),
    ("v1..v2", "revision expression"),
    (":/release", "revision expression"),
    ("HEAD", "name the branch"),
    ("a//b", "not a valid git ref name"),
    ("release/", "not a valid git ref name"),
    ("x.lock", "not a valid git ref name"),
    ("r" * 100_000, "'" + "r" * 80 + "…' is 100000 characters long; a ref has at most 1024"),
])
def test_refs_that_name_no_fixed_commit_are_refused_before_anything_runs(tmp_path, upstream,
                                                                          ref, needle):
    assert needle in source.ref_problem(ref)
    cache = tmp_path / "cache"
    with pytest.raises(SourceError) as info:
        source.resolve([str(upstream)], ref, cache)
    assert str(info.value).startswith("bad vLLM ref: ") and needle in str(info.value)
    assert "\n" not in str(info.value)
    assert not cache.exists()  # refused before any mirror was made


@pytest.mark.parametrize("ref", ["v0.27.1", "main", "release/0.27", "c1a53ebe",
                                 "deadbeefdeadbeefdeadbeefdeadbeefdeadbeef"])
def test_tags_branches_and_shas_pass(ref):
    assert source.ref_problem(ref) is None


def test_a_repository_too_long_is_one_line(tmp_path):
    with pytest.raises(SourceError) as info:
        source.resolve(["h" * 100_000], "v1", tmp_path / "cache")
    assert str(info.value) == ("bad vLLM repository: '" + "h" * 80 + "…' is 100000 characters "
                               "long; a repository's URL or path has at most 4096")
    # a name too long for a path is no local path, nor a URL: one line, quoted short
    with pytest.raises(UsageError) as info:
        source.resolve(["h" * 300], "v1", tmp_path / "cache")
    assert str(info.value).startswith("vLLM repository '" + "h" * 80 + "…' is neither a URL")
    assert len(str(info.value)) < 400


def test_a_sha_prefix_resolves(tmp_path, upstream):
    full = source.resolve([str(upstream)], "v1", tmp_path / "cache").commit
    assert source.resolve([str(upstream)], full[:8], tmp_path / "cache").commit == full


@pytest.mark.parametrize("repo,needle", [("", "the repository is empty"),
                                         ("--upload-pack=touch pwned", "starts with '-'")])
def test_bad_repositories_are_refused_before_git_sees_them(tmp_path, repo, needle):
    with pytest.raises(SourceError, match=needle):
        source.resolve([repo], "v1", tmp_path / "cache")
    assert not (tmp_path / "cache").exists()
    assert not Path("pwned").exists()


def test_a_folder_that_is_not_a_git_repository_is_named_as_such(tmp_path):
    folder = tmp_path / "plain"
    folder.mkdir()
    (folder / "f").write_text("x")
    with pytest.raises(SourceError) as info:
        source.resolve([str(folder)], "v1", tmp_path / "cache")
    assert str(info.value) == f"{folder} is not a git repository"


def test_an_unknown_url_scheme_is_one_clear_line(tmp_path):
    with pytest.raises(SourceError) as info:
        source.resolve(["foo://bar/vllm.git"], "v1", tmp_path / "cache")
    assert str(info.value).startswith("foo://bar/vllm.git is unreachable; not asked again "
                                      "until ")
    assert "cannot clone: git has no transport for foo:// URLs" in info.value.more


@pytest.mark.parametrize("damage", ["objects", "refs", "HEAD-garbage", "a-file"])
def test_a_mirror_broken_by_outside_hands_is_made_again(tmp_path, upstream, damage):
    cache = tmp_path / "cache"
    first = source.resolve([str(upstream)], "v2", cache)
    mirror = first.repo
    if damage == "HEAD-garbage":
        (mirror / "HEAD").write_text("garbage\n")
    elif damage == "a-file":
        shutil.rmtree(mirror)
        mirror.write_text("not a repository")
    else:
        shutil.rmtree(mirror / damage)
    said: list[str] = []
    again = source.resolve([str(upstream)], "v2", cache, said.append)
    assert again.commit == first.commit and again.repo == mirror
    assert any("is broken; mirroring again" in m for m in said)
    assert [p.name for p in mirror.parent.iterdir() if ".broken." in p.name] == []


def test_a_cache_that_cannot_be_written_is_a_usage_error(tmp_path, upstream):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(UsageError) as info:
        source.resolve([str(upstream)], "v1", blocker / "cache")
    assert str(info.value).startswith(f"the cache {blocker / 'cache'} (PATCHKIT_CACHE_DIR) "
                                      "cannot be written: ")


# ------------------------------------------------------------------------------------ pypi

def fake_wheel(folder: Path, version: str, text: str = "A = 1\n") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    wheel = folder / f"vllm-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("vllm/__init__.py", f"__version__ = '{version}'\n")
        zf.writestr("vllm/mod.py", text)
    return wheel


def test_pypi_repository_broken_by_outside_hands_is_made_again(tmp_path):
    cache = tmp_path / "cache"
    fake_wheel(cache / "pypi/wheels", "9.9.9")
    repo, tag = pypi.ensure_release(cache, "v9.9.9")
    shutil.rmtree(repo / "objects")
    said: list[str] = []
    again, tag2 = pypi.ensure_release(cache, "v9.9.9", said.append)
    assert (again, tag2) == (repo, tag) and (repo / "HEAD").exists()
    assert any("is broken; making it again" in m for m in said)
    shutil.rmtree(repo)
    repo.write_text("a file where the repository was")
    assert pypi.ensure_release(cache, "v9.9.9")[0] == repo and repo.is_dir()


def test_a_truncated_cached_wheel_is_downloaded_again(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    good = fake_wheel(tmp_path / "index", "9.9.9")
    wheels = cache / "pypi/wheels"
    wheels.mkdir(parents=True)
    (wheels / good.name).write_bytes(good.read_bytes()[:40])
    downloads = []

    def pip_download(cmd, **kw):
        downloads.append(cmd)
        dest = Path(cmd[cmd.index("-d") + 1])
        shutil.copy(good, dest / good.name)

    monkeypatch.setattr(pypi, "run", pip_download)
    said: list[str] = []
    repo, tag = pypi.ensure_release(cache, "v9.9.9", said.append)
    assert len(downloads) == 1
    assert any("is not a valid wheel; downloading it again" in m for m in said)
    assert (wheels / good.name).read_bytes() == good.read_bytes()
    assert source.version_of(repo, source.git.resolve_commit(repo, tag)) == "9.9.9"


def test_a_pypi_cache_that_cannot_be_written_is_a_usage_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(UsageError, match=r"\(PATCHKIT_CACHE_DIR\) cannot be written"):
        pypi.ensure_release(blocker, "v9.9.9")


def test_a_pypi_repository_deleted_while_a_release_is_laid_out_is_one_line(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    fake_wheel(cache / "pypi/wheels", "9.9.9")
    real = pypi._commit_wheel

    def deleted_meanwhile(repo, *args):
        shutil.rmtree(repo)
        real(repo, *args)

    monkeypatch.setattr(pypi, "_commit_wheel", deleted_meanwhile)
    with pytest.raises(SourceError) as info:
        pypi.ensure_release(cache, "v9.9.9")
    assert str(info.value) == (f"the cached repository {pypi.repo_path(cache)} went away while vLLM "
                               "9.9.9 was laid out into it (was the cache deleted?); run again")
    monkeypatch.setattr(pypi, "_commit_wheel", real)
    assert pypi.ensure_release(cache, "v9.9.9")[1] == "v9.9.9"


def test_a_checkout_with_paths_writes_out_only_those_files(tmp_path):
    up = make_upstream(tmp_path / "up", {"v1": {"pkg/mod.py": "A = 1\n", "pkg/other.py": "B = 1\n",
                                                "pkg/[odd] name.py": "C = 1\n"}})
    resolved = source.resolve([str(up)], "v1", tmp_path / "cache")
    source.checkout(resolved, tmp_path / "sparse", ["pkg/mod.py", "pkg/[odd] name.py"])
    written = sorted(str(p.relative_to(tmp_path / "sparse"))
                     for p in (tmp_path / "sparse" / "pkg").iterdir())
    assert written == ["pkg/[odd] name.py", "pkg/mod.py"]
    source.checkout(resolved, tmp_path / "full")
    assert (tmp_path / "full" / "pkg" / "other.py").exists()


def test_a_commit_the_source_lacks_is_missing_never_unreachable(tmp_path, upstream):
    """A dev build's commit that is not in the repository, after the repository moved a tag
    (as a dev build's retag does): the source answered, so it is named as missing, the moved
    tag is taken, and nothing is remembered for the next run."""
    from testing.upstream import sh

    cache = tmp_path / "cache"
    first = source.resolve([str(upstream)], "v1", cache)
    sh("git", "tag", "-f", "v1", "v2", cwd=upstream)   # the source moves a tag
    with pytest.raises(SourceError) as info:
        source.resolve([str(upstream)], "c5de82f35", cache)
    assert str(info.value) == (f"vLLM commit c5de82f35 is missing from {upstream} (it answered: "
                               "fetched just now, the commit is not there)")
    assert not list((cache / "repos").glob("*.unreachable"))
    moved = source.resolve([str(upstream)], "v1", cache)   # nothing remembered: asked again
    assert moved.repo == first.repo
    assert moved.commit == sh("git", "rev-parse", "v2^{commit}", cwd=upstream)


def test_a_source_that_answers_and_refuses_a_fetch_is_not_remembered(tmp_path, upstream):
    from patchkit.source import mirror

    cache = tmp_path / "cache"
    first = source.resolve([str(upstream)], "v1", cache)
    from testing.upstream import sh

    sh("git", "branch", "newer", "v2", cwd=upstream)
    (first.repo / "refs" / "heads").mkdir(exist_ok=True)
    (first.repo / "refs" / "heads" / "newer.lock").write_text("")   # a killed git's lock
    with pytest.raises(SourceError) as info:
        mirror._fetch(first.repo, str(upstream))
    assert "is unreachable" not in str(info.value)
    assert str(info.value).startswith(f"{upstream} answered, but the mirror could not be updated")
    assert not list((cache / "repos").glob("*.unreachable"))
