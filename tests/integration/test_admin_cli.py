"""The admin CLI against real processes: every subcommand run as `python -m kvstore ...`.

Each `--json` output is parsed and checked against what the test's client did; the
table output is checked for what a person looks for.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any

import pytest

from kvstore.coord.etcd import read_items_sync
from kvstore.coord.layout import Layout
from kvstore_client import KVStoreClient
from tests.conftest import Cluster

MiB = 1 << 20
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def kvstore(cluster: Cluster, *words: str, expect: int | None = 0,
            timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run `kvstore WORDS... --etcd <cluster>` (options go after the subcommand path)."""
    split = next((i for i, w in enumerate(words) if w.startswith("--")), len(words))
    cmd = [sys.executable, "-m", "kvstore", *words[:split], "--etcd", cluster.etcd, *words[split:]]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    if expect is not None:
        assert run.returncode == expect, (
            f"{' '.join(words)} exited {run.returncode}\nstdout:\n{run.stdout}\n"
            f"stderr:\n{run.stderr}\n" + cluster.logs())
    return run


def kvjson(cluster: Cluster, *words: str, expect: int = 0) -> Any:
    return json.loads(kvstore(cluster, *words, "--json", expect=expect).stdout)


def value(i: int, n: int) -> bytes:
    return (i.to_bytes(4, "little") * (n // 4 + 1))[:n]


def wait_for(predicate: Any, timeout: float = 10.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        got = predicate()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached within {timeout} s")
        time.sleep(0.1)


@pytest.fixture
def small(cluster_factory: Cluster) -> Cluster:
    """etcd, one master, two 32 MiB store nodes: a 64 MiB DRAM pool."""
    cluster_factory.start_master()
    cluster_factory.start_store("32MiB")
    cluster_factory.start_store("32MiB")
    cluster_factory.wait_nodes(2)
    return cluster_factory


# ------------------------------------------------------------------ status, nodes, capacity


def test_status_nodes_and_capacity_match_what_the_client_did(cluster: Cluster) -> None:
    standby = cluster.start_master()
    keys = [f"obj-{i}".encode() for i in range(20)]
    sizes = [(i + 1) * 10_000 for i in range(20)]
    with KVStoreClient(etcd=cluster.etcd) as c:
        assert c.put_many(keys, [value(i, n) for i, n in enumerate(sizes)]) == [None] * 20
        with c.lookup(keys[:10]) as lease:  # 10 of 10 hit
            assert lease.count == 10
        with c.lookup([b"missing", *keys[:3]]) as lease:  # 0 of 4
            assert lease.count == 0

    st = kvjson(cluster, "status")
    leader = cluster.masters[0][1]
    assert st["leader"] == leader and st["epoch"] > 0
    assert [s["address"] for s in st["standbys"]] == [standby]
    assert st["nodes_alive"] == 2 and st["nodes_draining"] == []
    assert st["objects"] == {"complete": 20, "pending": 0}
    assert st["bytes"]["complete"] == sum(sizes)
    assert st["tiers"]["dram"]["capacity"] == 2 * 512 * MiB
    assert st["tiers"]["dram"]["used"] >= sum(sizes)
    assert st["active_leases"] == 0
    assert st["hit_ratio"]["lookup_keys"] == 14 and st["hit_ratio"]["hit_keys"] == 10
    assert st["hit_ratio"]["ratio"] == pytest.approx(10 / 14)
    assert 0 < st["hit_ratio"]["seconds"] <= 60

    text = kvstore(cluster, "status").stdout
    assert leader in text and standby in text and "71.4%" in text and "2 alive" in text

    nodes = kvjson(cluster, "nodes")["nodes"]
    assert [(n["node_id"], n["state"]) for n in nodes] == [("node-0", "alive"), ("node-1", "alive")]
    assert sum(n["objects"] for n in nodes) == 20
    assert all(n["tiers"]["dram"]["capacity"] == 512 * MiB and n["address"] for n in nodes)
    text = kvstore(cluster, "nodes").stdout
    assert "node-0" in text and "alive" in text

    cap = kvjson(cluster, "capacity")["tiers"]["dram"]
    assert cap["capacity"] == 2 * 512 * MiB
    assert cap["used"] == st["tiers"]["dram"]["used"]
    assert cap["free"] == cap["capacity"] - cap["used"]
    assert [n["node_id"] for n in cap["nodes"]] == ["node-0", "node-1"]
    text = kvstore(cluster, "capacity").stdout
    assert "[=" in text and "# pinned" in text


def test_a_lost_node_is_listed_with_what_went_with_it(cluster: Cluster) -> None:
    with KVStoreClient(etcd=cluster.etcd) as c:
        keys = [f"k{i}".encode() for i in range(30)]
        assert c.put_many(keys, [value(i, 4096) for i in range(30)]) == [None] * 30
    on_1 = kvjson(cluster, "nodes")["nodes"][1]["objects"]
    cluster.stores[1].kill()  # SIGKILL: its etcd lease runs out
    nodes = wait_for(lambda: [n for n in kvjson(cluster, "nodes")["nodes"] if n["state"] == "lost"],
                     timeout=20, what="node-1 lost")
    assert nodes[0]["node_id"] == "node-1" and nodes[0]["objects_lost"] == on_1
    assert "gone" in kvstore(cluster, "nodes").stdout
    assert kvjson(cluster, "status")["nodes_alive"] == 1


# ------------------------------------------------------------------ keys, inspect


def test_keys_and_inspect_print_bytes_escaped_and_take_hex(cluster: Cluster) -> None:
    odd = b"bin\x00\xff\\ key"
    with KVStoreClient(etcd=cluster.etcd, replicas=2) as c:
        c.put(odd, b"x" * 1000)
        c.put_many([b"plain-1", b"plain-2", b"other"], [b"a", b"bb", b"ccc"])
        with c.lookup([b"plain-1"], ttl=60):
            listed = kvjson(cluster, "keys", "--prefix", "plain")
            assert [o["key"] for o in listed["objects"]] == ["plain-1", "plain-2"]
            assert [o["pins"] for o in listed["objects"]] == [1, 0]
            assert not listed["truncated"]

    all_keys = kvjson(cluster, "keys")["objects"]
    assert sorted(bytes.fromhex(o["key_hex"]) for o in all_keys) == sorted(
        [odd, b"plain-1", b"plain-2", b"other"])
    escaped = next(o["key"] for o in all_keys if o["key_hex"] == odd.hex())
    assert escaped == "bin\\x00\\xff\\\\ key"
    assert kvjson(cluster, "keys", "--limit", "2")["truncated"]
    assert kvjson(cluster, "keys", "--prefix", "62696e", "--hex")["objects"][0]["key"] == escaped

    for how in (["inspect", escaped], ["inspect", odd.hex(), "--hex"]):
        obj = kvjson(cluster, *how)["objects"][0]
        assert obj["found"] and obj["state"] == "complete" and obj["size"] == 1000
        assert sorted(r["node_id"] for r in obj["replicas"]) == ["node-0", "node-1"]
        assert obj["pins"] == 0 and obj["idle_seconds"] >= 0
    text = kvstore(cluster, "inspect", escaped).stdout
    assert "complete" in text and "node-0" in text and odd.hex() in text

    missing = kvjson(cluster, "inspect", "nope", expect=1)["objects"][0]
    assert missing == {"key": "nope", "key_hex": "6e6f7065", "found": False}
    bad = kvstore(cluster, "inspect", "zz", "--hex", expect=2)
    assert "not hex" in bad.stderr


# ------------------------------------------------------------------ evictions


def test_evict_to_a_ratio_and_the_eviction_report(small: Cluster) -> None:
    keys = [f"e{i}".encode() for i in range(40)]
    with KVStoreClient(etcd=small.etcd) as c:
        assert c.put_many(keys, [value(i, MiB) for i in range(40)]) == [None] * 40
        before = kvjson(small, "evictions")
        assert before["tiers"][0]["evicted"]["total"] == 0
        assert before["watermarks"] == {"high": 0.98, "low": 0.97}

        out = kvjson(small, "evict", "--to", "0.25", "--batch", "3")
        cap = 64 * MiB
        assert out["reached"] and out["capacity"] == cap
        assert out["used"] <= 0.25 * cap
        assert out["evicted"] == 40 - len([k for k in c.exists(keys) if k])
        assert out["evicted_bytes"] == out["evicted"] * MiB

        ev = kvjson(small, "evictions")
        dram = ev["tiers"][0]
        assert dram["tier"] == "dram"
        assert dram["evicted"]["total"] == dram["evicted"]["recent"] == out["evicted"]
        assert dram["evicted"]["total_bytes"] == out["evicted_bytes"]
        assert dram["demoted"]["total"] == 0
        assert ev["pool"]["used"] == out["used"]

        # What a lease pins stays, and the report says what blocked eviction.
        left = [k for k, e in zip(keys, c.exists(keys), strict=True) if e]
        with c.lookup(left, ttl=60) as lease:
            assert lease.count == len(left)
            stuck = kvjson(small, "evict", "--to", "0", expect=1)
            assert not stuck["reached"] and stuck["evicted"] == 0
            assert stuck["pinned"] >= len(left) * MiB
            ev = kvjson(small, "evictions")
            assert ev["blocked"]["count"] >= 1
            assert ev["blocked"]["pinned_bytes_last"] >= len(left) * MiB
            assert c.exists(left) == [True] * len(left)
    text = kvstore(small, "evictions").stdout
    assert "dram" in text and "watermarks" in text and "blocked" in text
    run = kvstore(small, "evict", "--to", "1.5", expect=2)
    assert "between 0 and 1" in run.stderr


# ------------------------------------------------------------------ drain


def test_drain_moves_sole_copies_and_keeps_every_object_readable(cluster_factory: Cluster) -> None:
    c = cluster_factory
    c.start_master()
    for _ in range(3):
        c.start_store("64MiB")
    c.wait_nodes(3)
    doubled = {f"two-{i}".encode(): value(i, 200_000) for i in range(30)}
    single = {f"one-{i}".encode(): value(100 + i, 150_000) for i in range(30)}
    with KVStoreClient(etcd=c.etcd, replicas=2) as two, KVStoreClient(etcd=c.etcd) as one:
        assert two.put_many(list(doubled), list(doubled.values())) == [None] * 30
        assert one.put_many(list(single), list(single.values())) == [None] * 30
    before = {n["node_id"]: n["objects"] for n in kvjson(c, "nodes")["nodes"]}
    assert before["node-1"] > 0

    out = kvjson(c, "drain", "node-1", "--batch", "7")
    assert out["complete"] and out["remaining"] == 0 and out["gone"] == []
    assert out["dropped"] + out["moved"] == before["node-1"]
    assert out["moved"] > 0 and out["dropped"] > 0  # both kinds were there

    nodes = {n["node_id"]: n for n in kvjson(c, "nodes")["nodes"]}
    assert nodes["node-1"]["state"] == "draining" and nodes["node-1"]["objects"] == 0
    assert nodes["node-1"]["tiers"]["dram"]["used"] == 0
    assert kvjson(c, "status")["nodes_draining"] == ["node-1"]
    assert Layout().drain_mark("node-1") in dict(read_items_sync(c.etcd, Layout().draining))
    with KVStoreClient(etcd=c.etcd) as reader:
        everything = {**doubled, **single}
        assert reader.get_many(list(everything)) == list(everything.values())
        reader.put(b"new-after-drain", b"v" * 5000)  # never placed on a draining node
    obj = kvjson(c, "inspect", "new-after-drain")["objects"][0]
    assert [r["node_id"] for r in obj["replicas"]] != ["node-1"]
    assert kvjson(c, "nodes")["nodes"][1]["objects"] == 0

    # A new leader restores the mark from etcd.
    c.start_master()
    c.masters[0][0].kill(15)
    wait_for(lambda: kvstore(c, "nodes", "--json", expect=None).returncode == 0
             and len(json.loads(kvstore(c, "nodes", "--json").stdout)["nodes"]) == 3,
             timeout=30, what="a new leader with 3 nodes")
    states = {n["node_id"]: n["state"] for n in kvjson(c, "nodes")["nodes"]}
    assert states == {"node-0": "alive", "node-1": "draining", "node-2": "alive"}

    cancelled = kvjson(c, "drain", "node-1", "--cancel")
    assert cancelled["draining_nodes"] == []
    assert kvjson(c, "nodes")["nodes"][1]["state"] == "alive"
    assert read_items_sync(c.etcd, Layout().draining) == []


def test_drain_waits_for_pins_and_without_moving_reports_what_is_gone(small: Cluster) -> None:
    objects = {f"o{i}".encode(): value(i, 100_000) for i in range(20)}
    with KVStoreClient(etcd=small.etcd) as c:
        assert c.put_many(list(objects), list(objects.values())) == [None] * 20
        on_0 = kvjson(small, "nodes")["nodes"][0]["objects"]
        with c.lookup(list(objects), ttl=60) as lease:  # a reader's promise holds
            assert lease.count == 20
            stuck = kvjson(small, "drain", "node-0", "--no-move", "--wait", "1", expect=1)
            assert not stuck["complete"] and stuck["gone"] == []
            assert stuck["remaining"] == stuck["remaining_pinned"] == on_0
            assert c.get_many(list(objects)) == list(objects.values())
    run = kvstore(small, "drain", "node-0", "--no-move")
    assert "gone" in run.stdout and "is empty" in run.stdout
    with KVStoreClient(etcd=small.etcd) as c:
        got = dict(zip(objects, c.get_many(list(objects)), strict=True))
    gone = [k for k, v in got.items() if v is None]
    assert len(gone) == on_0 > 0
    assert all(got[k] == objects[k] for k in objects if k not in gone)
    # --json names exactly those (a second drain has nothing left to do)
    again = kvjson(small, "drain", "node-0", "--no-move")
    assert again["complete"] and again["gone"] == []
    run = kvstore(small, "drain", "no-such-node", expect=2)
    assert "no store node 'no-such-node'" in run.stderr


# ------------------------------------------------------------------ live settings


def _pool_used(cluster: Cluster) -> int:
    return int(kvjson(cluster, "evictions")["pool"]["used"])


def test_config_set_changes_eviction_live(small: Cluster) -> None:
    got = kvjson(small, "config", "get")["settings"]
    assert got["evict_high"] == {"value": 0.98, "etcd": None, "help": got["evict_high"]["help"]}
    keys = [f"c{i}".encode() for i in range(32)]
    with KVStoreClient(etcd=small.etcd) as c:
        assert c.put_many(keys, [value(i, MiB) for i in range(32)]) == [None] * 32  # 50%
        time.sleep(0.5)  # a window for a wrong eviction to show (it is one that must not)
        assert kvjson(small, "evictions")["tiers"][0]["evicted"]["total"] == 0

        out = kvjson(small, "config", "set", "evict_high", "0.4", "evict_low", "0.25")
        assert out == {"set": {"evict_high": 0.4, "evict_low": 0.25}, "applied": True}
        wait_for(lambda: _pool_used(small) <= 0.25 * 64 * MiB, what="eviction to the new low mark")
        ev = kvjson(small, "evictions")
        assert ev["watermarks"] == {"high": 0.4, "low": 0.25}
        assert ev["tiers"][0]["evicted"]["recent"] >= 16
        assert sum(c.exists(keys)) <= 16

    got = kvjson(small, "config", "get", "evict_high", "evict_low")["settings"]
    assert {k: (v["value"], v["etcd"]) for k, v in got.items()} == {
        "evict_high": (0.4, "0.4"), "evict_low": (0.25, "0.25")}
    assert "0.4" in kvstore(small, "config", "get").stdout

    # A new leader reads them from etcd when elected.
    small.start_master()
    small.masters[0][0].kill(15)
    wait_for(lambda: kvstore(small, "config", "get", "--json", expect=None).returncode == 0
             and json.loads(kvstore(small, "config", "get", "--json").stdout)["leader"],
             timeout=30, what="a new leader")
    got = kvjson(small, "config", "get")["settings"]
    assert got["evict_high"]["value"] == 0.4 and got["evict_low"]["value"] == 0.25

    kvstore(small, "config", "unset", "evict_high", "evict_low")
    wait_for(lambda: kvjson(small, "config", "get")["settings"]["evict_high"]["value"] == 0.98,
             what="the command-line value back")


@pytest.mark.parametrize(("words", "message"), [
    (["evict_high", "2"], r"must be in (0, 1]"),
    (["evict_high", "lots"], "must be a number"),
    (["put_timeout", "-5"], "must be > 0"),
    (["alignment", "128"], "not a live setting"),
    (["evict_low", "0.99"], "evict_low < evict_high"),  # the leader's evict_high is 0.98
    (["max_lease_ttl", "10"], "default_lease_ttl"),  # its default_lease_ttl is 30
    (["evict_high"], "NAME VALUE pairs"),
])
def test_bad_config_values_are_typed_errors(small: Cluster, words: Sequence[str], message: str) -> None:
    run = kvstore(small, "config", "set", *words, expect=2)
    assert message in run.stderr and run.stderr.startswith("kvstore: ")
    assert read_items_sync(small.etcd, Layout().config) == []  # nothing was written


# ------------------------------------------------------------------ structured logs


def test_json_logs_one_object_per_line(cluster_factory: Cluster,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVSTORE_LOG_FORMAT", "json")  # the master inherits it
    cluster_factory.start_master()
    cluster_factory.start_store("16MiB")
    cluster_factory.wait_nodes(1)
    kvstore(cluster_factory, "config", "set", "put_timeout", "12")
    proc = cluster_factory.masters[0][0]

    def applied() -> list[dict[str, Any]]:
        lines = [ln for ln in proc.log.read_text().splitlines() if ln.startswith("{")]
        events = [json.loads(ln) for ln in lines]
        return [e for e in events if e.get("event") == "config_applied"]

    events = wait_for(applied, what="a config_applied log line")
    e = events[-1]
    assert e["level"] == "info" and e["logger"] == "kvstore.master.live_config"
    assert e["changed"] == {"put_timeout": 12.0} and e["ts"].endswith("Z")
    assert "put_timeout=12" in e["msg"]
    for ln in proc.log.read_text().splitlines():
        if ln.startswith("{"):
            assert {"ts", "level", "logger", "msg"} <= set(json.loads(ln))
