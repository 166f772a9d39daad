"""The admin CLI shows a sharded cluster as one: replies of every shard's leader summed
and merged (fake replies, no processes), key-addressed calls sent to the key's shard."""

from __future__ import annotations

import argparse
import json
from typing import Any

import pytest

from kvstore.admin import cluster, eviction, objects, shards
from kvstore.admin.connect import Admin
from kvstore.errors import InvalidArgument
from kvstore.shards import shard_of
from kvstore.v1 import master_pb2 as pb

GiB = 1 << 30


def _seg(node: str, tier: str, cap: int, used: int, pinned: int = 0, objs: int = 0) -> pb.NodeStatus:
    return pb.NodeStatus(node_id=node, segment=f"{node}:1", tier=tier, capacity=cap, used=used,
                         pinned=pinned, objects=objs)


def _status(shard: int, leader: str, used: int, objs: int) -> pb.ClusterStatusResponse:
    return pb.ClusterStatusResponse(
        epoch=10 + shard, leader=leader, shard=shard, shards=2,
        nodes=[_seg("n1", "dram", GiB // 2, used, objs=objs), _seg("n2", "dram", GiB // 2, used)],
        objects_complete=objs, objects_pending=1, bytes_complete=used, active_leases=shard + 1,
        counters_json=json.dumps({"puts": 5 + shard, "pin_capped": shard}),
        recent_lookup_keys=10, recent_hit_keys=5 + shard, recent_seconds=60.0 - shard,
        draining=["n2"] if shard else [], leader_for_seconds=100.0 + shard)


def test_status_sums_every_shard_and_a_node_is_the_sum_of_its_parts() -> None:
    merged = shards.merge_status([_status(0, "m0:1", 100, 3), _status(1, "m1:1", 50, 4)])
    info = cluster.status_dict(merged)
    assert info["objects"] == {"complete": 7, "pending": 2}
    assert info["active_leases"] == 3
    assert info["nodes_alive"] == 2
    assert info["tiers"]["dram"] == {"capacity": 2 * GiB, "used": 300, "pinned": 0, "nodes": 2}
    n1 = next(n for n in info["nodes"] if n["node_id"] == "n1")
    assert (n1["capacity"], n1["used"], n1["objects"]) == (GiB, 150, 7)
    assert info["hit_ratio"]["hit_keys"] == 11 and info["hit_ratio"]["lookup_keys"] == 20
    assert info["counters"] == {"puts": 11, "pin_capped": 1}
    assert info["nodes_draining"] == ["n2"]
    assert merged.leader == "m0:1, m1:1" and merged.epoch == 11
    assert merged.leader_for_seconds == 100.0  # the latest failover of any shard


def test_one_reply_is_returned_as_it_is() -> None:
    one = _status(0, "m0:1", 100, 3)
    assert shards.merge_status([one]) is one
    keys = pb.ListKeysResponse(objects=[pb.ObjectInfo(key=b"a")])
    assert shards.merge_keys([keys], 1) is keys


def test_nodes_merge_per_node_and_tier_with_the_worst_state() -> None:
    a = pb.NodeListResponse(epoch=3, nodes=[
        pb.NodeInfo(node_id="n1", state="alive", objects=2,
                    segments=[_seg("n1", "dram", 100, 10), _seg("n1", "ssd", 1000, 1)]),
        pb.NodeInfo(node_id="n2", state="alive", objects=1, segments=[_seg("n2", "dram", 100, 5)])])
    b = pb.NodeListResponse(epoch=4, nodes=[
        pb.NodeInfo(node_id="n1", state="draining", objects=3,
                    segments=[_seg("n1", "dram", 100, 20), _seg("n1", "ssd", 1000, 2)]),
        pb.NodeInfo(node_id="n2", state="alive", objects=0, segments=[_seg("n2", "dram", 100, 0)])])
    tiers = cluster.capacity_dict(shards.merge_nodes([a, b]))
    assert tiers["dram"]["capacity"] == 400 and tiers["dram"]["used"] == 35
    assert tiers["ssd"]["capacity"] == 2000 and tiers["ssd"]["used"] == 3
    n1 = next(n for n in tiers["dram"]["nodes"] if n["node_id"] == "n1")
    assert (n1["state"], n1["capacity"], n1["used"]) == ("draining", 200, 30)


def test_evictions_sum_counts_and_pool_and_keep_the_watermarks() -> None:
    def one(n: int) -> pb.EvictionStatsResponse:
        return pb.EvictionStatsResponse(
            tiers=[pb.TierEvictions(tier="dram", evicted=n, evicted_bytes=10 * n, recent_evicted=1)],
            evict_high=0.9, evict_low=0.8, pool_capacity=100, pool_used=50 + n, blocked=n,
            held_seconds=float(n), recent_seconds=60.0)
    d = eviction.evictions_dict(shards.merge_evictions([one(1), one(2)]))
    assert d["tiers"][0]["evicted"] == {"recent": 2, "recent_bytes": 0, "total": 3, "total_bytes": 30}
    assert d["watermarks"] == {"high": 0.9, "low": 0.8}
    assert d["pool"]["capacity"] == 200 and d["pool"]["used"] == 103
    assert d["blocked"]["count"] == 3 and d["held_seconds"] == 2.0


def test_keys_merge_in_key_order_and_cut_at_the_limit() -> None:
    a = pb.ListKeysResponse(objects=[pb.ObjectInfo(key=k) for k in (b"a", b"c", b"e")])
    b = pb.ListKeysResponse(objects=[pb.ObjectInfo(key=k) for k in (b"b", b"d")])
    merged = shards.merge_keys([a, b], 4)
    assert [o.key for o in merged.objects] == [b"a", b"b", b"c", b"d"]
    assert merged.truncated
    assert not shards.merge_keys([a, b], 5).truncated


def test_the_shard_count_reads_as_etcd_holds_it() -> None:
    assert shards.parse_count(None) == 1
    assert shards.parse_count(b"4") == 4
    with pytest.raises(InvalidArgument):
        shards.parse_count(b"four")


# ------------------------------------------------------------------ fake leaders


def _args(**kw: Any) -> argparse.Namespace:
    base: dict[str, Any] = {"etcd": "127.0.0.1:1", "cluster": "t", "master": "", "timeout": 1.0,
                            "json": True, "token": "t", "tls_ca": None, "tls_server_name": None,
                            "shard": None, "tenant": ""}
    return argparse.Namespace(**(base | kw))


@pytest.fixture
def two_shards(monkeypatch: pytest.MonkeyPatch) -> dict[int, list[Any]]:
    """Two fake shard leaders: Admin.call answers per its shard and records requests."""
    seen: dict[int, list[Any]] = {0: [], 1: []}
    monkeypatch.setattr(shards, "shard_count", lambda *a, **k: 2)

    def call(self: Admin, method: str, request: Any) -> Any:
        seen[self.shard].append((method, request))
        if method == "ClusterStatus":
            return _status(self.shard, f"m{self.shard}:1", 100, 3)
        if method == "Inspect":
            return pb.InspectResponse(epoch=1, items=[
                pb.InspectItem(code=0, object=pb.ObjectInfo(key=k, state="complete"))
                for k in request.keys])
        if method == "ListKeys":
            return pb.ListKeysResponse(objects=[pb.ObjectInfo(key=f"k{self.shard}".encode())])
        raise AssertionError(method)

    monkeypatch.setattr(Admin, "call", call)
    monkeypatch.setattr(Admin, "masters", lambda self: [])
    return seen


def test_status_asks_every_shard_and_lists_each_leader(two_shards: dict[int, list[Any]],
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    assert cluster.status(_args()) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["objects"]["complete"] == 6
    assert [(s["shard"], s["leader"], s["epoch"]) for s in out["shards"]] == [
        (0, "m0:1", 10), (1, "m1:1", 11)]
    assert cluster.status(_args(json=False)) == 0
    text = capsys.readouterr().out
    assert "shard 0" in text and "shard 1" in text and "6 complete" in text


def test_shard_flag_asks_only_that_shard(two_shards: dict[int, list[Any]],
                                         capsys: pytest.CaptureFixture[str]) -> None:
    assert cluster.status(_args(shard=1)) == 0
    assert json.loads(capsys.readouterr().out)["objects"]["complete"] == 3
    assert two_shards[0] == [] and len(two_shards[1]) == 1
    with pytest.raises(InvalidArgument, match="2 shard"):
        cluster.status(_args(shard=2))


def test_inspect_sends_each_key_to_its_shard(two_shards: dict[int, list[Any]],
                                             capsys: pytest.CaptureFixture[str]) -> None:
    keys = [f"key-{i}".encode() for i in range(8)]
    assert {shard_of(k, 2) for k in keys} == {0, 1}  # the test spans both shards
    assert objects.inspect(_args(keys=[k.decode() for k in keys], hex=False)) == 0
    for shard, calls in two_shards.items():
        asked = [k for method, req in calls if method == "Inspect" for k in req.keys]
        assert asked == [k for k in keys if shard_of(k, 2) == shard]
    out = json.loads(capsys.readouterr().out)
    assert [o["key"] for o in out["objects"]] == [k.decode() for k in keys]  # in asked order


def test_keys_lists_every_shards_keys(two_shards: dict[int, list[Any]],
                                      capsys: pytest.CaptureFixture[str]) -> None:
    assert objects.keys(_args(prefix="", limit=10, hex=False)) == 0
    assert [o["key"] for o in json.loads(capsys.readouterr().out)["objects"]] == ["k0", "k1"]


def test_config_set_waits_until_every_shards_leader_applies_it(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from kvstore.admin import settings
    monkeypatch.setattr(shards, "shard_count", lambda *a, **k: 2)
    stored: list[int] = []
    monkeypatch.setattr(settings, "_set_at_leader", lambda admin, req: stored.append(admin.shard))
    applied = {0: 0.85, 1: 0.9}  # shard 1's leader has not applied the new value

    def call(self: Admin, method: str, request: Any) -> Any:
        assert method == "GetConfig"
        return pb.GetConfigResponse(settings=[pb.ConfigSetting(name="evict_high",
                                                               value=applied[self.shard])])

    monkeypatch.setattr(Admin, "call", call)
    assert settings.config_set(_args(pairs=["evict_high", "0.85"], wait=0.0)) == 0
    assert stored == [0]  # one leader writes etcd
    assert json.loads(capsys.readouterr().out)["applied"] is False
    applied[1] = 0.85
    assert settings.config_set(_args(pairs=["evict_high", "0.85"], wait=0.0)) == 0
    assert json.loads(capsys.readouterr().out)["applied"] is True
