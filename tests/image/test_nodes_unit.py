"""Which addresses are one engine (fleet.reach): the engine's ID alone never merges two
addresses; the ID, host name and root directory together do, and either way it is said."""

from __future__ import annotations

from patchkit.nodes import fleet
from patchkit.engines.docker import Engine
from patchkit.render.images import pairings

ID = "JRUF:QRHN:CJ6U:WMMM:5BGR:MFSQ:DLOS:WBMD:OSXE:3BAO:UVGE:5FVB"


class InfoAPI:
    def __init__(self, info):
        self._info = info

    def info(self):
        return self._info


class Client:
    def __init__(self, info):
        self.api = InfoAPI(info)
        self.closed = False

    def close(self):
        self.closed = True


def engines(infos: dict[str, dict]):
    made: dict[str, Engine] = {}

    def connect(url):
        made[url] = Engine(Client(infos[url]), url)
        return made[url]
    return connect, made


def info(root, name="vm", engine_id=ID):
    return {"ID": engine_id, "Name": name, "DockerRootDir": root}


def test_a_shared_id_with_another_root_is_two_nodes_and_said():
    connect, made = engines({"unix:///a.sock": info("/var/lib/a"),
                             "unix:///b.sock": info("/var/lib/b")})
    got = fleet.reach(["unix:///a.sock", "unix:///b.sock"], 5, connect)
    assert [n.url for n in got] == ["unix:///a.sock", "unix:///b.sock"]
    assert all(n.engine is not None for n in got)
    assert got[0].engine.identity() != got[1].engine.identity()   # histories apart
    [p] = fleet.pairings(got)
    assert (p.address, p.into, p.merged) == ("unix:///b.sock", "unix:///a.sock", False)
    assert "root directory /var/lib/b vs /var/lib/a" in p.reason
    [line] = pairings({"same_engine_id": [p.to_dict()]})
    assert line.startswith("apart     unix:///b.sock and unix:///a.sock: two engines")


def test_a_cloned_machine_is_told_by_its_host_name():
    connect, _ = engines({"ssh://n1:22": info("/var/lib/docker", "gb10-a"),
                          "ssh://n2:22": info("/var/lib/docker", "gb10-b")})
    got = fleet.reach(["ssh://n1:22", "ssh://n2:22"], 5, connect)
    assert len(got) == 2
    assert "host name gb10-b vs gb10-a" in fleet.pairings(got)[0].reason


def test_one_engine_by_two_addresses_is_merged_and_said_in_one_line():
    same = info("/var/lib/docker")
    connect, made = engines({"unix:///var/run/docker.sock": same, "ssh://me:22": dict(same),
                             "ssh://other:22": info("/srv/docker")})
    got = fleet.reach(["unix:///var/run/docker.sock", "ssh://me:22", "ssh://other:22"], 5,
                      connect)
    assert [n.url for n in got] == ["unix:///var/run/docker.sock", "ssh://other:22"]
    assert made["ssh://me:22"].client.closed
    merged, apart = fleet.pairings(got)
    assert merged.merged and merged.address == "ssh://me:22"
    assert merged.into == "unix:///var/run/docker.sock"
    assert "host name vm and root directory /var/lib/docker agree" in merged.reason
    lines = pairings({"same_engine_id": [merged.to_dict()]})
    assert lines == [f"merged    ssh://me:22 into unix:///var/run/docker.sock: {merged.reason}"]
    assert not apart.merged


def test_engines_with_no_id_are_never_merged():
    connect, _ = engines({"unix:///p1.sock": {"ID": ""}, "unix:///p2.sock": {"ID": ""}})
    got = fleet.reach(["unix:///p1.sock", "unix:///p2.sock"], 5, connect)
    assert len(got) == 2 and fleet.pairings(got) == []
    assert got[0].engine.identity() == "unix:///p1.sock"
