"""Evidence records without an engine: the one reader, the cache, a registry that refuses.

The registry that refuses is a small HTTP server of the test's own on 127.0.0.1 that answers
every request 401 (a registry that wants credentials patchkit does not send); the engine tests
(test_evidence_docker.py) use the real registry.
"""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from patchkit.nodes import evidence
from patchkit.serving import speed

ID = "sha256:" + "ab" * 32


def record(ok: bool = True, at: float = 1_765_000_000.0, rate: float | None = 45.5
           ) -> evidence.Record:
    figures = speed.Figures(rate, rate, rate, 0.2, None, 0.6) if rate is not None else None
    settings = speed.Settings("m", 64, 3) if rate is not None else None
    return evidence.Record("smoke", ID, "x:v1-0123456789ab", "unix:///e.sock", at, ok,
                           (evidence.Verdict("health", "ok", "/health answered 200"),),
                           "ps", "m", figures, settings, "0.34.0", True, None, "http://h")


def test_a_record_reads_back_as_itself_and_its_id_is_its_content():
    r = record()
    again = evidence.Record.from_json(r.to_json())
    assert again == r and again.id == r.id
    assert again.figures.decode_tok_s == 45.5 and again.settings.requests == 3
    assert record(at=2.0).id != r.id
    assert r.describe() == ("smoke passed, 45.5 tok/s, acceptance 0.60 at 2025-12-06T05:46:40Z "
                            "on unix:///e.sock")


@pytest.mark.parametrize("raw, said", [
    (b"{not json", "Expecting property name"), (b"[]", "not a JSON object"),
    (b'{"kind": "smoke", "node": "n", "ok": true, "unix_time": 1}', "no image_id"),
    (b'{"kind": "x"}', "kind 'x' is not smoke or verify")])
def test_what_is_not_a_record_says_why(raw, said):
    with pytest.raises(ValueError, match=said):
        evidence.Record.from_json(raw)


def test_the_cache_keeps_each_record_once_oldest_first_and_skips_a_corrupt_one(tmp_path):
    store = evidence.Store(tmp_path)
    late, early = record(at=20.0), record(ok=False, at=10.0)
    path = store.keep(late)
    assert store.keep(late) == path   # the same record: the same file, written once
    store.keep(early)
    (path.parent / "broken.json").write_text("{")
    got = store.local(ID)
    assert [r.at for r in got.records] == [10.0, 20.0] and got.last.ok
    [problem] = got.problems
    assert problem.startswith(str(path.parent / "broken.json")) and problem.endswith("skipped")
    assert [r.at for r in store.by_tag("x:v1-0123456789ab").records] == [10.0, 20.0]
    assert store.by_tag("x:v1-ffffffffffff").records == []


class _Refusing(BaseHTTPRequestHandler):
    def _no(self) -> None:
        body = b'{"errors":[{"code":"UNAUTHORIZED","message":"authentication required"}]}'
        self.send_response(401)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_HEAD = do_POST = do_PUT = _no

    def log_message(self, *a) -> None:
        pass


def test_a_registry_that_refuses_leaves_the_record_in_the_cache_and_says_so(tmp_path):
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Refusing)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        host = f"127.0.0.1:{server.server_address[1]}"
        build = evidence.Build(ID, "x:v1-0123456789ab", "unix:///e.sock", "ps",
                               (f"{host}/ps/x@sha256:{'cd' * 32}",))
        kept = evidence.Store(tmp_path, timeout=10).record(record(), build)
    finally:
        server.shutdown()
        server.server_close()
    assert kept.pushed == ()
    [refused] = kept.refused
    assert refused.startswith(f"{host}/ps/x@sha256:") and "HTTP 401" in refused
    assert evidence.Store(tmp_path).local(ID).records == [record()]
    lines = kept.lines(build)
    assert lines[-1].startswith("evidence: registry refused the record, kept in the cache only: ")
    assert len(lines) == 2


def test_a_drop_is_the_fall_from_the_other_builds_value():
    was = speed.Figures(50.0, aggregate_tok_s=150.0, acceptance=0.6)
    now = speed.Figures(40.0, aggregate_tok_s=165.0, acceptance=None)
    drops = {d.figure: d for d in speed.drops(was, now)}
    assert set(drops) == {"decode tok/s", "aggregate tok/s"}   # acceptance: not both measured
    assert drops["decode tok/s"].percent == pytest.approx(20.0)
    assert drops["aggregate tok/s"].percent == pytest.approx(-10.0)
