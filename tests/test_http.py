"""patchkit.http against a real local server (the stand-in vLLM of the smoke tests): every
failure is one HttpError, one line, naming the URL."""

from __future__ import annotations

import pytest
from standin_vllm import MODEL, Behaviour, refusing_port, serve

from patchkit import http


def one_line_naming(exc: http.HttpError, url: str) -> None:
    assert url in str(exc) and "\n" not in str(exc)


def test_get_json_post_json_get_text_and_bytes():
    with serve() as s:
        models = http.get_json(s.url + "/v1/models", timeout=5)
        answer = http.post_json(s.url + "/v1/chat/completions",
                                {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]},
                                timeout=5)
        text = http.get_text(s.url + "/metrics", timeout=5)
        raw = http.get_bytes(s.url + "/metrics", timeout=5)
    assert models["data"][0]["id"] == MODEL
    assert answer["object"] == "chat.completion"
    assert "vllm:spec_decode_num_draft_tokens_total" in text
    assert raw.startswith(b"# HELP ") and b"vllm:spec_decode_num_draft_tokens_total" in raw


def test_a_status_outside_2xx_carries_the_server_message():
    with serve() as s:
        url = s.url + "/v1/chat/completions"
        with pytest.raises(http.HttpError) as info:
            http.post_json(url, {"model": "nope", "messages": []}, timeout=5)
    exc = info.value
    assert exc.kind == http.STATUS and exc.status == 404 and exc.exit_code == 1
    assert "HTTP 404" in str(exc) and "The model `nope` does not exist." in str(exc)
    assert str(exc).startswith(f"POST {url}: ")
    one_line_naming(exc, url)


def test_not_json_is_a_bad_body():
    with serve(Behaviour(garbled={"/v1/models"})) as s:
        url = s.url + "/v1/models"
        with pytest.raises(http.HttpError) as info:
            http.get_json(url, timeout=5)
    assert info.value.kind == http.BAD_BODY and "not JSON" in str(info.value)
    one_line_naming(info.value, url)


def test_an_empty_body_is_not_json():
    with serve() as s:
        with pytest.raises(http.HttpError, match="empty answer"):
            http.get_json(s.url + "/health", timeout=5)


def test_the_size_cap_refuses_a_larger_answer():
    with serve() as s:
        url = s.url + "/metrics"
        with pytest.raises(http.HttpError) as info:
            http.get_bytes(url, timeout=5, max_bytes=100)
        assert len(http.get_bytes(url, timeout=5, max_bytes=10**6)) > 100
    assert info.value.kind == http.TOO_LARGE
    one_line_naming(info.value, url)


def test_a_hang_is_a_timeout():
    with serve(Behaviour(hang={"/health"})) as s:
        url = s.url + "/health"
        with pytest.raises(http.HttpError) as info:
            http.get(url, timeout=0.2)
    assert info.value.kind == http.TIMEOUT and "0.2s" in str(info.value)
    one_line_naming(info.value, url)


def test_nothing_listening_is_unreachable():
    with refusing_port() as port:
        url = f"http://127.0.0.1:{port}/x"
        with pytest.raises(http.HttpError) as info:
            http.get(url, timeout=5)
    assert info.value.kind == http.UNREACHABLE and "connection refused" in str(info.value)
    one_line_naming(info.value, url)


def test_an_unknown_host_is_unreachable():
    with pytest.raises(http.HttpError) as info:
        http.get("http://no-such-host.invalid/", timeout=5)
    assert info.value.kind == http.UNREACHABLE and "no-such-host.invalid" in str(info.value)


@pytest.mark.parametrize("url, words", [("ftp://h/x", "scheme 'ftp'"), ("h:80", "no scheme"),
                                        ("http:///x", "no host"), ("http://h:x/", "valid URL"),
                                        ("http://h/a b", "white space")])
def test_a_bad_url_is_exit_2(url, words):
    with pytest.raises(http.HttpError) as info:
        http.get(url, timeout=5)
    assert info.value.kind == http.BAD_URL and info.value.exit_code == 2
    assert words in str(info.value) and "\n" not in str(info.value)
