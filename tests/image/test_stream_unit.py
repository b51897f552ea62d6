"""engines.pipes: an export moved from one pipe into others, through real pipes and children.

The export is a child that writes a tar archive made here (``cat FILE``) and each load a child
that keeps what it reads (``cat > FILE``), the way ``docker save`` and ``docker load`` stand on
either side of the pump in copy-image.
"""

from __future__ import annotations

import io
import json
import tarfile
import threading

import pytest

from patchkit.errors import ImageError
from patchkit.formats import layer
from patchkit.formats import archive
from patchkit.engines import pipes
from patchkit.engines.pipes import Broken
from patchkit.process import Piped

LAYERS = [layer.layer_tar([layer.LayerEntry(f"opt/{n}", "file", bytes([n]) * (300_000 + n))], 0)
          for n in range(3)]
DIFF_IDS = [x.diff_id for x in LAYERS]


def oci_export(long_name: bool = False) -> bytes:
    """An engine's export in the OCI layout (Docker 25 and later): layer blobs named by their
    diff_id, the config, manifest.json; with ``long_name``, a member whose name needs a pax
    header."""
    config = json.dumps({"rootfs": {"type": "layers", "diff_ids": DIFF_IDS}}).encode()
    cid = layer.image_id_of(config).split(":", 1)[1]
    members = [(f"blobs/sha256/{d.split(':', 1)[1]}", x.data) for d, x in zip(DIFF_IDS, LAYERS)]
    members.append((f"blobs/sha256/{cid}", config))
    if long_name:
        members.append(("x" * 150 + "/note.json", b'{"note": 1}'))
    members.append(("manifest.json", json.dumps([{
        "Config": f"blobs/sha256/{cid}", "RepoTags": ["demo:1"],
        "Layers": [m[0] for m in members[:3]]}]).encode()))
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def pumped(tmp_path, exported: bytes, loads: int = 1, compress: str = "none", **kw):
    """``archive`` from a ``cat`` child through the pump into ``loads`` ``cat`` children; what
    each received, the pump, and the facts."""
    src = tmp_path / "export.tar"
    src.write_bytes(exported)
    export = Piped(["cat", str(src)], feed=False)
    outs = [tmp_path / f"load{i}" for i in range(loads)]
    sinks = [Piped(["sh", "-c", f"cat > {out}"], feed=True) for out in outs]
    pump = pipes.Pump(export.fd, [s.fd for s in sinks], timeout=10, compress=compress)
    facts = archive.ArchiveFacts()
    try:
        if kw:
            pipes.relay(pump, facts, **kw)
        else:
            pipes.whole(pump)
    finally:
        pump.close()
        for s in sinks:
            assert s.wait(10) == 0
        assert export.wait(10) == 0
    return [o.read_bytes() for o in outs], pump, facts


def members(data: bytes) -> dict[str, bytes]:
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar if m.isreg()}


def test_a_whole_export_is_spliced_as_it_is(tmp_path):
    exported = oci_export()
    (got,), pump, _ = pumped(tmp_path, exported)
    assert got == exported and pump.wire == len(exported)


def test_one_export_to_three_loads_gives_each_the_same_bytes(tmp_path):
    exported = oci_export()
    got, pump, _ = pumped(tmp_path, exported, loads=3)
    assert got == [exported] * 3 and pump.wire == len(exported)


def test_gzip_on_the_way(tmp_path):
    import gzip

    exported = oci_export()
    (got,), pump, _ = pumped(tmp_path, exported, compress="gzip")
    assert gzip.decompress(got) == exported and pump.wire == len(got) < len(exported)


@pytest.mark.parametrize("long_name", [False, True])
def test_the_layers_a_target_holds_are_left_out(tmp_path, long_name):
    exported = oci_export(long_name)
    (got,), pump, facts = pumped(tmp_path, exported, held=DIFF_IDS[:2], layers=DIFF_IDS)
    kept = members(got)
    whole = members(exported)
    # the held layers are gone; every other member is there, byte for byte
    assert set(whole) - set(kept) == {f"blobs/sha256/{d.split(':', 1)[1]}" for d in DIFF_IDS[:2]}
    assert all(kept[n] == whole[n] for n in kept)
    assert facts.left_out_bytes() == sum(len(x.data) for x in LAYERS[:2])
    assert facts.layer_bytes() == len(LAYERS[2].data) and facts.layer_count() == 1
    assert facts.positions == {i: len(x.data) for i, x in enumerate(LAYERS)}
    # what went is the archive less the held layers (their headers and bodies), and no more
    assert pump.wire == facts.sent == len(got)
    assert len(got) <= len(exported) - facts.left_out_bytes()
    assert facts.config_digest(DIFF_IDS).startswith("sha256:")


def test_the_relay_matches_the_in_process_one(tmp_path):
    """The same members as ``archive.relay`` keeps (which the API route uses)."""
    exported = oci_export()
    (got,), _, _ = pumped(tmp_path, exported, held=DIFF_IDS[:1], layers=DIFF_IDS)
    facts = archive.ArchiveFacts()
    other = b"".join(archive.relayed_export([exported], facts, DIFF_IDS[:1], DIFF_IDS))
    assert members(got) == members(other)


def test_an_export_that_ends_early_is_one_line(tmp_path):
    exported = oci_export()
    with pytest.raises(ImageError, match="ends early"):
        pumped(tmp_path, exported[:len(exported) // 2], held=DIFF_IDS[:1], layers=DIFF_IDS)


def test_not_a_tar_archive(tmp_path):
    with pytest.raises(ImageError, match="not a tar archive"):
        pumped(tmp_path, b"Error response from daemon: nope\n" * 40, held=DIFF_IDS[:1],
               layers=DIFF_IDS)


def test_a_load_that_closes_its_end_is_let_go_and_the_others_go_on(tmp_path):
    exported = oci_export()
    src = tmp_path / "export.tar"
    src.write_bytes(exported)
    export = Piped(["cat", str(src)], feed=False)
    good = Piped(["sh", "-c", f"cat > {tmp_path / 'good'}"], feed=True)
    gone = Piped(["true"], feed=True)
    gone.proc.wait()
    pump = pipes.Pump(export.fd, [good.fd, gone.fd], timeout=10, names=["good", "gone"])
    pipes.whole(pump)
    assert pump.broken == {gone.fd: Broken("gone closed its end of the stream")}
    assert good.wait(10) == 0 and (tmp_path / "good").read_bytes() == exported
    export.wait(10)
    # and when none is left, the pump stops with that reason
    export = Piped(["cat", str(src)], feed=False)
    gone = Piped(["true"], feed=True)
    gone.proc.wait()
    pump = pipes.Pump(export.fd, [gone.fd], timeout=10, names=["the load at X"])
    with pytest.raises(ImageError, match="^the load at X closed its end of the stream$"):
        pipes.whole(pump)
    export.end()


def test_a_silent_export_and_a_stop_end_the_pump(tmp_path):
    silent = Piped(["sleep", "30"], feed=False)
    sink = Piped(["sh", "-c", "cat > /dev/null"], feed=True)
    pump = pipes.Pump(silent.fd, [sink.fd], timeout=0.5, what="the export from X")
    with pytest.raises(ImageError, match=r"^the export from X gave nothing for 0.5 s$"):
        pipes.whole(pump)
    stop = threading.Event()
    stop.set()
    pump = pipes.Pump(silent.fd, [sink.fd], timeout=30, stop=stop)
    with pytest.raises(ImageError, match="interrupted"):
        pipes.whole(pump)
    silent.end()
    sink.end()


def test_a_load_that_takes_nothing_is_let_go_and_the_other_gets_it_all(tmp_path):
    import os

    data = os.urandom(5 * 2**20)   # more than the stalled load's pipe holds
    src = tmp_path / "export.tar"
    src.write_bytes(data)
    export = Piped(["cat", str(src)], feed=False)
    good = Piped(["sh", "-c", f"cat > {tmp_path / 'good'}"], feed=True)
    stuck = Piped(["sleep", "30"], feed=True)   # never reads its stdin
    pump = pipes.Pump(export.fd, [good.fd, stuck.fd], timeout=0.5, names=["good", "stuck"])
    pipes.whole(pump)
    assert pump.broken == {stuck.fd: Broken("stuck took nothing for 0.5 s", stalled=True)}
    assert good.wait(10) == 0 and (tmp_path / "good").read_bytes() == data
    assert pump.wire == len(data)
    stuck.end()
    export.wait(10)
