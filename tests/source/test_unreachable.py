"""An unreachable source is said once per run, not once per target, and remembered in the cache
for a while (the line says until when), so the next run does not wait on it again."""

from __future__ import annotations

from testing import patchkit
from testing.project import make_project

DEAD = "http://127.0.0.1:9/vllm.git"   # nothing listens on the discard port


def _project(tmp_path):
    proj = make_project(tmp_path)
    text = (proj / "patchset.yaml").read_text()
    up = text.split("repo: ", 1)[1].split()[0]
    (proj / "patchset.yaml").write_text(text.replace(f"repo: {up}", f"repo: [{DEAD}, {up}]", 1))
    return proj


def lines_about(stderr: str) -> list[str]:
    return [ln for ln in stderr.splitlines() if "127.0.0.1:9" in ln]


def test_an_unreachable_source_is_said_once_per_run_and_remembered(tmp_path):
    proj = _project(tmp_path)
    p = patchkit("rebase-check", "--to", "v2", "--to", "v3", "--to", "v4", cwd=proj)
    assert p.returncode in (0, 1), p.stderr
    said = lines_about(p.stderr)
    # the pin and three targets each tried it: one line saying so, and no "mirroring" line
    # for a copy that was never made
    assert len(said) == 1, p.stderr
    assert said[0].startswith(f"{DEAD} is unreachable; not asked again until ")
    assert said[0].endswith(" UTC; trying the next") and len(said[0]) <= 120
    # the next run does not try to clone it again
    p = patchkit("apply", cwd=proj)
    assert p.returncode == 0, p.stderr
    said = lines_about(p.stderr)
    assert len(said) == 1 and "not asked again until" in said[0], p.stderr
    assert not any(ln.startswith("mirroring") for ln in said)
    # -v says why, and where it is remembered, once
    p = patchkit("apply", "-v", cwd=proj)
    assert p.returncode == 0, p.stderr
    more = [ln for ln in lines_about(p.stderr) if "remembered in" in ln]
    assert len(more) == 1 and "cannot clone" in more[0] and ".unreachable" in more[0]


def test_a_lone_unreachable_source_is_one_short_error_line(tmp_path):
    proj = make_project(tmp_path)
    text = (proj / "patchset.yaml").read_text()
    up = text.split("repo: ", 1)[1].split()[0]
    (proj / "patchset.yaml").write_text(text.replace(f"repo: {up}", f"repo: {DEAD}", 1))
    p = patchkit("apply", cwd=proj)
    assert p.returncode == 2
    # one line: no "mirroring" line before it
    [last] = p.stderr.strip().splitlines()
    assert last.startswith(f"patchkit apply: error: {DEAD} is unreachable; not asked again")
    assert len(last) <= 120


def test_verbose_says_more_of_a_lone_unreachable_source_once(tmp_path):
    proj = make_project(tmp_path)
    text = (proj / "patchset.yaml").read_text()
    up = text.split("repo: ", 1)[1].split()[0]
    (proj / "patchset.yaml").write_text(text.replace(f"repo: {up}", f"repo: {DEAD}", 1))
    p = patchkit("-v", "apply", cwd=proj)
    assert p.returncode == 2
    more = [ln for ln in p.stderr.splitlines() if "remembered in" in ln]
    assert len(more) == 1 and "cannot clone" in more[0], p.stderr


def test_a_typo_for_a_source_word_is_one_line_and_nothing_is_remembered(tmp_path):
    """`pyip` is neither a URL, a path nor a source word: said at once, with the word it
    nearly is, and no mirror is made or remembered as unreachable."""
    proj = make_project(tmp_path)
    cache = tmp_path / "home" / "cache"
    before = sorted(cache.rglob("*")) if cache.exists() else []
    p = patchkit("apply", "--vllm-repo", "pyip", cwd=proj)
    assert p.returncode == 2, p.stderr
    [line] = p.stderr.strip().splitlines()
    assert line == ("patchkit apply: error: vLLM repository 'pyip' is neither a URL, a path nor "
                    "a source word (pypi, image): did you mean 'pypi'?")
    assert "mirroring" not in p.stderr
    assert not [c for c in (sorted(cache.rglob("*")) if cache.exists() else [])
                if c not in before and "pyip" in c.name]
    # a word near none of them says how a folder is written
    p = patchkit("rebase-check", "--releases", "--vllm-repo", "upstrem", cwd=proj)
    assert p.returncode == 2 and "a local folder is written ./upstrem" in p.stderr
    # a folder of that name is a path, as git takes it
    (tmp_path / "proj" / "pyip").mkdir()
    p = patchkit("apply", "--vllm-repo", "pyip", cwd=proj)
    assert p.returncode == 2 and "is neither a URL" not in p.stderr


def test_a_typo_for_a_source_word_in_the_manifest_names_its_line(tmp_path):
    proj = make_project(tmp_path)
    text = (proj / "patchset.yaml").read_text()
    up = text.split("repo: ", 1)[1].split()[0]
    (proj / "patchset.yaml").write_text(text.replace(f"repo: {up}", f"repo: [{up}, imgae]", 1))
    line_no = next(i for i, ln in enumerate(text.splitlines(), 1) if ln.strip().startswith("repo:"))
    for verb in ("validate", "apply"):
        p = patchkit(verb, cwd=proj)
        assert p.returncode == 2, p.stderr
        [line] = p.stderr.strip().splitlines()
        assert line.endswith(f"patchset.yaml:{line_no}: vllm.repo[1]: 'imgae' is neither a URL, "
                             "a path nor a source word (pypi, image): did you mean 'image'?")


def test_a_damaged_memory_of_an_unreachable_source_is_dropped(tmp_path):
    """Found by fuzzing: a kept file that does not read as expected is dropped (-v says so)
    and the source is tried again, never a failure."""
    proj = make_project(tmp_path)
    text = (proj / "patchset.yaml").read_text()
    up = text.split("repo: ", 1)[1].split()[0]
    (proj / "patchset.yaml").write_text(text.replace(f"repo: {up}", f"repo: {DEAD}", 1))
    env = {"PATCHKIT_CACHE_DIR": str(tmp_path / "cache")}
    assert patchkit("apply", cwd=proj, env=env).returncode == 2
    (marker,) = (tmp_path / "cache").rglob("*.unreachable")
    marker.write_text('{"until": "soon", "why": 5}')
    p = patchkit("apply", "-v", cwd=proj, env=env)
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert any(ln.startswith(f"dropped the cache entry {marker}") for ln in p.stderr.splitlines())
    # asked again (-v shows the command), not taken from the damaged memory
    assert any("ls-remote" in ln and DEAD in ln for ln in p.stderr.splitlines()), p.stderr
