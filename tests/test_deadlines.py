"""Every wait has a deadline and every signal is heard: silent peers on 127.0.0.1 (a port that
accepts and never answers, servers that trickle a byte a second) against the real CLI."""

from __future__ import annotations

import signal
import time

import pytest
from testing import patchkit, spawn
from testing.peers import silent_port, trickling_body, trickling_headers
from testing.project import GH_MANIFEST, make_project

from patchkit.errors import CommandError, ImageError
from patchkit.engines.docker import Engine
from patchkit.process import run

SLACK = 15  # a 2 s deadline must end well before this


def timed(*args, **kw):
    started = time.monotonic()
    p = patchkit(*args, **kw)
    return p, time.monotonic() - started


def error_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.strip()]


def test_copy_image_at_a_silent_engine_is_one_line_within_the_deadline(tmp_path):
    with silent_port() as peer:
        p, took = timed("copy-image", "demo:1", "--to", peer.tcp, "--timeout", "2", cwd=tmp_path,
                        env={"DOCKER_HOST": peer.tcp, "PATH": "/usr/bin:/bin"})
    assert p.returncode == 1 and took < SLACK, (took, p.stderr)
    assert error_lines(p.stderr) == [
        f"patchkit copy-image: error: no Docker Engine answers at {peer.tcp}: no answer within "
        "2 s"]


def test_build_image_at_a_silent_engine_ends_before_the_apply(tmp_path):
    proj = make_project(tmp_path)
    with silent_port() as peer:
        p, took = timed("build-image", "--timeout", "2", cwd=proj,
                        env={"DOCKER_HOST": peer.tcp, "PATH": "/usr/bin:/bin",
                             "PATCHKIT_CACHE_DIR": str(tmp_path / "cache")})
    assert p.returncode == 1 and took < SLACK, (took, p.stderr)
    assert error_lines(p.stderr) == [
        f"patchkit build-image: error: no Docker Engine answers at {peer.tcp}: no answer within "
        "2 s"]
    assert not (proj / ".patchkit").exists()  # nothing was applied first
    assert not (tmp_path / "cache").exists()  # nor fetched


def _bad_docker_host(tmp_path, value, verbs):
    proj = make_project(tmp_path)
    for verb in verbs:
        p, took = timed(*verb, cwd=proj, env={"DOCKER_HOST": value, "PATH": "/usr/bin:/bin",
                                              "PATCHKIT_CACHE_DIR": str(tmp_path / "cache")})
        (line,) = error_lines(p.stderr)
        assert p.returncode == 2, (verb, line)
        assert line.startswith(f"patchkit {verb[0]}: error: DOCKER_HOST {value!r} is not an engine "
                               "address: "), line
    assert not (proj / ".patchkit").exists() and not (tmp_path / "cache").exists()


@pytest.mark.parametrize("value", ["bogus://x", "tcp://", "ssh://", "tcp://host", "unix://rel"])
def test_a_malformed_docker_host_is_exit_2_before_build_image_applies(tmp_path, value):
    _bad_docker_host(tmp_path, value, [["build-image"]])


def test_a_malformed_docker_host_is_exit_2_for_every_verb_that_reaches_an_engine(tmp_path):
    _bad_docker_host(tmp_path, "bogus://x", [["copy-image", "demo:1", "--to", "tcp://127.0.0.1:9"],
                                            ["verify", "--image", "demo:1"],
                                            ["verify", "--container", "c1"]])


@pytest.mark.parametrize("value", ["bogus://x", "tcp://", "ssh://"])
def test_a_malformed_to_is_exit_2_naming_the_flag(tmp_path, value):
    p = patchkit("copy-image", "demo:1", "--to", value, cwd=tmp_path)
    (line,) = error_lines(p.stderr)
    assert p.returncode == 2
    assert line.startswith(f"patchkit copy-image: error: --to {value!r} is not an engine address: ")


def test_engine_errors_are_plain_words():
    with pytest.raises(ImageError) as info:
        Engine.connect("unix:///nonexistent/pk.sock", timeout=2)
    assert str(info.value) == "no Docker Engine answers at unix:///nonexistent/pk.sock: no such socket"
    with pytest.raises(ImageError) as info:
        Engine.connect("tcp://127.0.0.1:1", timeout=2)
    assert str(info.value) == "no Docker Engine answers at tcp://127.0.0.1:1: connection refused"


# ------------------------------------------------------------------------------ signals

def _interrupted_while_waiting(args, cwd, env, peer, sig):
    proc = spawn(*args, cwd=cwd, env=env)
    try:
        assert peer.accepted.wait(30), "patchkit never reached the silent peer"
        time.sleep(0.2)  # inside the wait now
        sent = time.monotonic()
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=30)
        return proc.returncode, time.monotonic() - sent, err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_one_signal_ends_a_wait_on_a_silent_engine(tmp_path, sig):
    with silent_port() as peer:
        code, took, err = _interrupted_while_waiting(
            ["copy-image", "demo:1", "--to", peer.tcp, "--timeout", "120"], tmp_path,
            {"DOCKER_HOST": peer.tcp, "PATH": "/usr/bin:/bin"}, peer, sig)
    assert code == 128 + sig and took < 5, (code, took, err)
    assert error_lines(err) == [f"patchkit: interrupted by {sig.name}; nothing was changed"]


def test_one_sigint_ends_add_pr_waiting_on_a_silent_github(tmp_path):
    proj = make_project(tmp_path, GH_MANIFEST)
    before = (proj / "patchset.yaml").read_bytes()
    with silent_port() as peer:
        code, took, err = _interrupted_while_waiting(
            ["add-pr", "101"], proj, {"PATCHKIT_GITHUB": peer.http, "PATH": "/usr/bin:/bin",
                                      "PATCHKIT_CACHE_DIR": str(tmp_path / "cache")},
            peer, signal.SIGINT)
    assert code == 130 and took < 5, (code, took, err)
    assert error_lines(err)[-1] == "patchkit: interrupted by SIGINT; nothing was changed"
    assert (proj / "patchset.yaml").read_bytes() == before
    assert not (proj / "patches/pr-101.diff").exists()


# ------------------------------------------------------------------------- smoke's deadline

@pytest.mark.parametrize("server", [trickling_headers, trickling_body], ids=["headers", "body"])
def test_smoke_timeout_is_a_deadline_for_the_whole_request(tmp_path, server):
    with server() as url:
        p, took = timed("smoke", url, "--timeout", "2", cwd=tmp_path)
    assert p.returncode == 1 and took < 10, (took, p.stdout, p.stderr)
    lines = [ln for ln in (p.stdout + p.stderr).splitlines() if "no answer within 2s" in ln]
    assert len(lines) == 1 and f"{url}/health" in lines[0], p.stdout + p.stderr


@pytest.mark.parametrize("key,words", [
    ("two words", "the key holds white space (at character 4)"),
    ("tab\there", "the key holds white space (at character 4)"),
    ("bell\x07", "the key holds a control character (at character 5)"),
    ("clé", "character 3 is not ASCII; an HTTP header cannot carry it"),
    (" ", "empty key"),
])
def test_smoke_api_key_mistakes_are_api_key_errors(tmp_path, key, words):
    p = patchkit("smoke", "http://127.0.0.1:9", "--api-key", key, cwd=tmp_path)
    (line,) = error_lines(p.stderr)
    assert p.returncode == 2
    assert line == f"patchkit smoke: error: --api-key (or VLLM_API_KEY): {words}"
    assert "URL" not in line and (key.strip() == "" or key not in line)


def test_a_command_past_its_timeout_is_killed_and_said_so():
    started = time.monotonic()
    with pytest.raises(CommandError) as exc:
        run(["sh", "-c", "echo started; exec sleep 30"], timeout=1)
    assert exc.value.timeout == 1 and time.monotonic() - started < 10
    assert str(exc.value).startswith("command killed after 1 s: sh -c")


def test_streamed_lines_come_as_they_are_written_and_a_failure_keeps_the_last():
    seen: list[str] = []
    with pytest.raises(CommandError) as exc:
        run(["sh", "-c", "for i in $(seq 1 30); do echo line $i; done; echo oops >&2; exit 3"],
            on_line=seen.append)
    assert seen[:2] == ["line 1", "line 2"] and seen[-1] == "oops" and len(seen) == 31
    assert exc.value.returncode == 3 and exc.value.output.splitlines()[-2:] == ["line 30", "oops"]
    assert "line 1\n" not in exc.value.output  # only the tail is kept
