"""The client of several master shards (sharded.py, session.py) against in-memory masters.

Each shard has its own fake master, which refuses any key of another shard (as a real
one answers WRONG_SHARD), and its own control channel; the real synchronous driver runs
the flows, and one shared trace shows when each shard's request is sent and its reply
read. So routing, the fan-out (every request out before a reply is read), the merge in
key order, a lookup's prefix across shards with its leases trimmed, one Lease over
several shards, and a shard that fails only its own keys are tested without processes.
"""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import numpy as np
import pytest

from kvstore.coord.layout import Layout, MasterRecord
from kvstore.errors import Code, LeaseNotFound, Unavailable, WrongShard
from kvstore.shards import shard_of
from kvstore.v1 import master_pb2 as pb
from kvstore_client import AsyncKVStoreClient, KVStoreClient, discovery, reservations
from kvstore_client.reservations import Reservations
from kvstore_client.staging import Staging
from kvstore_client.state import ClientState, Lease
from tests.unit.test_client_data_path import (
    FakeLocal,
    FakeMaster,
    FakeNode,
    FakeTransfer,
    small_thresholds,
)

SHARDS = 2


def keys_of(n: int, prefix: bytes = b"k") -> list[bytes]:
    return [prefix + b"%d" % i for i in range(n)]


class ShardMaster(FakeMaster):
    """A fake master of one shard: the data path's calls, and lookups and leases."""

    def __init__(self, node: FakeNode, transfer: FakeTransfer, trace: list[tuple[Any, ...]],
                 shard: int, shards: int, lease_ids: Any) -> None:
        super().__init__(node, transfer, trace)
        self.shard, self.shards = shard, shards
        self.epoch = 1000 * shard + 7  # shards' epochs say nothing of each other
        self.lease_ids = lease_ids  # shared: two shards' ids may not tell them apart
        self.down = False
        self.seen: list[str] = []
        self.trims: list[tuple[int, int]] = []  # (lease, keep_first_n) asked

    def call(self, method: str, request: Any) -> Any:
        self.seen.append(method)
        if self.down:
            raise Unavailable(f"shard {self.shard}'s master is down (fake)")
        keys = list(getattr(request, "keys", []))
        named = keys + list(getattr(request, "placeholders", []))
        foreign = [k for k in named if shard_of(k, self.shards) != self.shard]
        if foreign:
            raise WrongShard(f"{foreign[0]!r} is not shard {self.shard}'s")
        if keys or method in ("PutStart", "GetReplicas", "PutEnd"):
            return super().call(method, request)
        return getattr(self, method)(request)

    def Lookup(self, req: pb.LookupRequest) -> pb.LookupResponse:
        count = 0
        for key in req.keys:
            if key not in self.objects:
                break
            count += 1
        reply = pb.LookupResponse(count=count, ttl_remaining=self.ttl, epoch=self.epoch)
        if count:
            reply.lease_id = next(self.lease_ids)
            self.leases[reply.lease_id] = list(req.keys[:count])
        return reply

    def Exists(self, req: pb.KeysRequest) -> pb.ExistsResponse:
        return pb.ExistsResponse(exists=[k in self.objects for k in req.keys], epoch=self.epoch)

    def Remove(self, req: pb.RemoveRequest) -> pb.CodesResponse:
        codes = [Code.OK if self.objects.pop(k, None) else Code.NOT_FOUND for k in req.keys]
        return pb.CodesResponse(codes=codes, epoch=self.epoch)

    def RenewLease(self, req: pb.RenewLeaseRequest) -> pb.LeaseResponse:
        if req.lease_id not in self.leases:
            return pb.LeaseResponse(error={"code": Code.LEASE_NOT_FOUND, "message": "gone"},
                                    epoch=self.epoch)
        return pb.LeaseResponse(ttl_remaining=req.ttl or self.ttl, epoch=self.epoch)

    def ReleaseLease(self, req: pb.ReleaseLeaseRequest) -> pb.LeaseResponse:
        self.trim(req.lease_id, req.keep_first_n if req.HasField("keep_first_n") else 0)
        return pb.LeaseResponse(epoch=self.epoch)

    def ListKeys(self, req: pb.ListKeysRequest) -> pb.ListKeysResponse:
        keys = sorted(k for k in self.objects if k.startswith(req.prefix))
        reply = pb.ListKeysResponse(truncated=len(keys) > req.limit, epoch=self.epoch)
        for key in keys[:req.limit]:
            reply.objects.add(key=key, state="complete")
        return reply

    def trim(self, lease_id: int, keep: int) -> None:
        if keep:
            self.trims.append((lease_id, keep))
            self.leases[lease_id] = self.leases[lease_id][:keep]
        else:
            self.release(lease_id)


class ShardControl:
    """One shard's control channel: requests are answered when they arrive; the shared
    trace records (what, shard, method) as each is sent and each reply read."""

    transport = "fast"

    def __init__(self, master: ShardMaster, trace: list[tuple[Any, ...]]) -> None:
        self.master = master
        self.trace = trace
        self.address = f"fake-master-{master.shard}"

    def call(self, method: str, request: Any, timeout: float, spin: bool = True) -> Any:
        return self.answer(self.ask(method, request, timeout), method, spin)

    def ask(self, method: str, request: Any, timeout: float) -> Any:
        self.trace.append(("send", self.master.shard, method))
        try:
            return self.master.call(method, request)
        except Unavailable as exc:
            return exc

    def answer(self, asked: Any, method: str, spin: bool = True) -> Any:
        self.trace.append(("read", self.master.shard, method))
        if isinstance(asked, Exception):
            raise asked
        return asked

    def ready(self, asked: Any) -> bool:
        return True

    def release(self, lease_id: int, timeout: float, keep_first: int = 0) -> None:
        self.trace.append(("send", self.master.shard, "release"))
        self.master.trim(lease_id, keep_first)

    def close(self) -> None:
        pass


class ShardRig:
    """A client of `shards` shards: one fake master and channel per shard, one node."""

    def __init__(self, shards: int = SHARDS, aio: bool = False) -> None:
        self.trace: list[tuple[Any, ...]] = []
        self.node = FakeNode()
        self.transfer = FakeTransfer(self.trace)
        ids = itertools.count(100)
        self.masters = [ShardMaster(self.node, self.transfer, self.trace, k, shards, ids)
                        for k in range(shards)]
        self.state = ClientState(self.transfer, Staging(self.transfer, 1 << 20),  # type: ignore[arg-type]
                                 FakeLocal(), "writer-1", 0)  # type: ignore[arg-type]
        cls = AsyncKVStoreClient if aio else KVStoreClient
        c: Any = cls.__new__(cls)
        c._state = self.state
        c.timeout = 5.0
        c.transport = "fast"
        c._later = {}
        c.master_address = "fake-master-0"
        c._shards, c._counted = shards, True
        controls = [(AsyncShardControl if aio else ShardControl)(m, self.trace)
                    for m in self.masters]
        c._control = controls[0]
        c._others = dict(enumerate(controls))
        del c._others[0]
        if aio:
            c._staging_turn = asyncio.Lock()
        self.client = c

    def sent(self, method: str) -> list[int]:
        """The shards `method` was sent to, in order."""
        return [e[1] for e in self.trace if e[0] == "send" and e[2] == method]


class AsyncShardControl(ShardControl):
    async def call(self, method: str, request: Any, timeout: float,  # type: ignore[override]
                   spin: bool = True) -> Any:
        return await self.answer(self.ask(method, request, timeout), method, spin)

    async def answer(self, asked: Any, method: str,  # type: ignore[override]
                     spin: bool = True) -> Any:
        await asyncio.sleep(0)
        return ShardControl.answer(self, asked, method, spin)


@pytest.fixture
def rig(monkeypatch: pytest.MonkeyPatch) -> ShardRig:
    small_thresholds(monkeypatch)
    return ShardRig()


def _on_both(keys: list[bytes]) -> None:
    assert {shard_of(k, SHARDS) for k in keys} == {0, 1}, "the test needs keys of both shards"


def test_a_batch_goes_to_each_keys_shard_and_comes_back_in_key_order(rig: ShardRig) -> None:
    keys = keys_of(16)
    _on_both(keys)
    values = [b"value of %s" % k for k in keys]
    assert rig.client.put_many(keys, values) == [None] * len(keys)
    for m in rig.masters:
        assert set(m.objects) == {k for k in keys if shard_of(k, SHARDS) == m.shard}
    assert rig.client.get_many(keys) == values
    assert rig.client.exists([*keys, b"absent"]) == [True] * len(keys) + [False]
    assert rig.client.get(keys[3]) == values[3]


@pytest.mark.parametrize("method", ["PutStart", "PutEnd", "GetReplicas"])
def test_every_shards_request_is_sent_before_any_reply_is_read(rig: ShardRig,
                                                               method: str) -> None:
    keys = keys_of(16)
    rig.client.put_many(keys, [b"v"] * len(keys))
    rig.state.placements.capacity = 0  # no early reads: GetReplicas is a plain call
    rig.client.get_many(keys)
    control = [e for e in rig.trace if e[0] in ("send", "read") and e[2] == method]
    assert [e[0] for e in control] == ["send", "send", "read", "read"]
    assert {e[1] for e in control[:2]} == {0, 1}


def test_a_single_key_call_touches_only_its_shard(rig: ShardRig) -> None:
    key = keys_of(1)[0]
    own = shard_of(key, SHARDS)
    rig.client.put(key, b"one")
    assert rig.client.get(key) == b"one"
    assert rig.client.remove(key)
    assert rig.masters[own].seen
    assert rig.masters[1 - own].seen == []


def test_a_shard_that_is_down_fails_only_its_own_keys(rig: ShardRig) -> None:
    keys = keys_of(16)
    rig.client.put_many(keys, [b"v"] * len(keys))
    rig.masters[1].down = True
    got = rig.client.get_many(keys)
    assert [g is None for g in got] == [shard_of(k, SHARDS) == 1 for k in keys]
    new = keys_of(16, b"n")
    errors = rig.client.put_many(new, [b"w"] * len(new))
    for key, err in zip(new, errors, strict=True):
        if shard_of(key, SHARDS) == 1:
            assert isinstance(err, Unavailable) and err.key == key
        else:
            assert err is None
    assert rig.client.exists(keys) == [shard_of(k, SHARDS) == 0 for k in keys]
    codes = rig.client.remove_many(keys)
    assert codes == [Code.UNAVAILABLE if shard_of(k, SHARDS) else Code.OK for k in keys]


def test_a_call_whose_every_shard_is_down_raises_as_one_master_would(rig: ShardRig) -> None:
    for m in rig.masters:
        m.down = True
    with pytest.raises(Unavailable):
        rig.client.get_many(keys_of(8))
    with pytest.raises(Unavailable):
        rig.client.put(b"k1", b"v")


def test_each_shard_keeps_its_own_leader_epoch(rig: ShardRig) -> None:
    keys = keys_of(8)
    rig.client.put_many(keys, [b"v"] * len(keys))
    assert rig.state.epoch == rig.masters[0].epoch
    assert rig.state.epochs == {1: rig.masters[1].epoch}
    # Shard 0's epoch is the older: its replies are still taken.
    assert rig.client.get_many(keys) == [b"v"] * len(keys)


def _lookup_rig(rig: ShardRig) -> tuple[list[bytes], int]:
    """Keys stored but one of shard 1, with shard 0's keys present past it: the batch's
    prefix ends there, and shard 0 pins keys beyond it. Returns the keys and where the
    prefix ends."""
    keys = keys_of(12)
    shard = [shard_of(k, SHARDS) for k in keys]
    miss = next(i for i in range(2, len(keys)) if shard[i] == 1 and 0 in shard[:i]
                and 0 in shard[i + 1:])
    rig.client.put_many([k for i, k in enumerate(keys) if i != miss],
                        [b"v"] * (len(keys) - 1))
    return keys, miss


def test_a_lookup_prefix_ends_at_the_first_miss_of_any_shard(rig: ShardRig) -> None:
    keys, miss = _lookup_rig(rig)
    lease = rig.client.lookup(keys)
    assert lease.count == miss and lease.keys == keys[:miss]
    # Shard 0 pinned its keys past the miss; trimmed to those before it, one-way.
    before = [k for k in keys[:miss] if shard_of(k, SHARDS) == 0]
    part = lease.parts[0]
    assert rig.masters[0].trims == [(part.id, len(before))]
    assert rig.masters[0].leases[part.id] == before
    # Shard 1's prefix ends at the miss: nothing to trim.
    assert rig.masters[1].trims == []
    assert set(lease.parts) == {s for s in (0, 1) if any(shard_of(k, SHARDS) == s
                                                          for k in keys[:miss])}
    assert lease.expires_at == min(p.expires_at for p in lease.parts.values())


def test_a_lookup_whose_first_key_misses_pins_nothing_anywhere(rig: ShardRig) -> None:
    keys, _ = _lookup_rig(rig)
    first = shard_of(keys[0], SHARDS)
    rig.masters[first].objects.pop(keys[0])
    lease = rig.client.lookup(keys)
    assert lease.count == 0 and not lease.id and lease.parts == {}
    for m in rig.masters:
        assert m.leases == {}  # each shard's pins released


def test_one_lease_reads_renews_and_releases_on_every_shard(rig: ShardRig) -> None:
    import numpy as np

    keys = keys_of(8)
    _on_both(keys)
    rig.client.put_many(keys, [b"%08d" % i for i in range(8)])
    with rig.client.lookup(keys, ttl=5.0) as lease:
        assert lease.count == 8 and set(lease.parts) == {0, 1}
        dst = np.zeros(8 * 8, dtype=np.uint8)
        rig.client.register(dst)
        bufs = [dst[i * 8:(i + 1) * 8] for i in range(8)]
        assert rig.client.get_into(keys, bufs, lease) == [None] * 8
        assert bytes(dst) == b"".join(b"%08d" % i for i in range(8))
        # Each shard's read went under that shard's own lease, not a fresh one.
        assert all(len(m.leases) == 1 for m in rig.masters)
        rig.masters[1].ttl = 1.0  # shard 1 grants less: the Lease ends with it
        rig.client.renew(lease, ttl=0)
        assert sorted(rig.sent("RenewLease")) == [0, 1]
        assert lease.expires_at == lease.parts[1].expires_at < lease.parts[0].expires_at
    assert sorted(rig.sent("release")) == [0, 1]  # one-way on each shard's channel
    assert all(m.leases == {} for m in rig.masters) and lease.id == 0


def test_release_keep_first_keeps_each_shards_keys_among_the_first(rig: ShardRig) -> None:
    keys = keys_of(8)
    rig.client.put_many(keys, [b"v"] * 8)
    lease = rig.client.lookup(keys)
    rig.client.release(lease, keep_first=3)
    assert lease.keys == keys[:3]
    for m in rig.masters:
        mine = [k for k in keys[:3] if shard_of(k, SHARDS) == m.shard]
        assert sorted(k for held in m.leases.values() for k in held) == sorted(mine)
    assert set(lease.parts) == {shard_of(k, SHARDS) for k in keys[:3]}


@pytest.mark.parametrize("shards", [1, SHARDS])
@pytest.mark.parametrize("transport", ["fast", "grpc"])
def test_a_release_is_one_way_only_where_the_channel_keeps_order(shards: int,
                                                                 transport: str) -> None:
    """The fast channel handles one connection's frames in order, so a release there is a
    one-way frame (the next call sees it done); gRPC's calls race one another, so a
    release there is a call, waited for. Either way the same pins are gone."""
    rig = ShardRig(shards=shards)
    for control in [rig.client._control, *rig.client._others.values()]:
        control.transport = transport
    keys = keys_of(8)
    rig.client.put_many(keys, [b"v"] * 8)
    lease = rig.client.lookup(keys)
    rig.trace.clear()
    rig.client.release(lease, keep_first=0)
    one_way, called = rig.sent("release"), rig.sent("ReleaseLease")
    assert sorted(one_way if transport == "fast" else called) == list(range(shards))
    assert (called if transport == "fast" else one_way) == []
    assert all(m.leases == {} for m in rig.masters) and lease.id == 0


def test_get_into_under_a_lease_that_holds_nothing_on_a_shard(rig: ShardRig) -> None:
    import numpy as np

    keys = keys_of(8)
    rig.client.put_many(keys, [b"v"] * 8)
    ones = [k for k in keys if shard_of(k, SHARDS) == 0]
    lease = rig.client.lookup(ones)
    dst = np.zeros(8, dtype=np.uint8)
    rig.client.register(dst)
    other = next(k for k in keys if shard_of(k, SHARDS) == 1)
    out = rig.client.get_into([ones[0], other], [dst[:4], dst[4:]], lease)
    assert out[0] is None and isinstance(out[1], LeaseNotFound) and out[1].key == other


def test_a_large_batch_uses_a_staging_buffer_per_shard(rig: ShardRig) -> None:
    keys = keys_of(40)
    values = [bytes([i]) * 30_000 for i in range(40)]  # more than one buffer's worth
    assert rig.client.put_many(keys, values) == [None] * 40
    assert rig.client.get_many(keys) == values
    assert set(rig.state.stagings) == {1}


def test_the_async_client_fans_out_the_same_way(monkeypatch: pytest.MonkeyPatch) -> None:
    small_thresholds(monkeypatch)
    rig = ShardRig(aio=True)
    keys = keys_of(16)
    values = [b"async %s" % k for k in keys]

    async def main() -> None:
        assert await rig.client.put_many(keys, values) == [None] * 16
        assert await rig.client.get_many(keys) == values
        lease = await rig.client.lookup(keys)
        assert lease.count == 16
        await rig.client.release(lease)

    asyncio.run(main())
    assert all(m.leases == {} for m in rig.masters)


def test_one_shard_sends_untagged_steps_and_needs_no_grouping(rig: ShardRig) -> None:
    one = ShardRig(shards=1)
    keys = keys_of(6)
    assert one.client.put_many(keys, [b"x"] * 6) == [None] * 6
    assert one.client.get_many(keys) == [b"x"] * 6
    assert one.state.epochs == {} and one.state.stagings == {}
    assert set(one.sent("PutStart")) == {0}


# -- discovery ----------------------------------------------------------------------------


def test_master_addresses_name_each_shards_leader_and_the_count(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """WhoLeads(shard=k) asked of a master of another shard is refused (WRONG_SHARD) and
    skipped; the replies' `shards` give the count."""
    serves = {"m0:1": 0, "m1:1": 1}

    def who_leads(address: str, creds: Any, timeout: float, shard: int) -> Any:
        if serves[address] != shard:
            return pb.WhoLeadsResponse(error={"code": Code.WRONG_SHARD, "message": "no"},
                                       shard=serves[address], shards=2)
        return pb.WhoLeadsResponse(address=f"leader-of-{shard}:1", master_id=f"m{shard}",
                                   is_leader=True, shard=shard, shards=2)

    monkeypatch.setattr(discovery, "_who_leads", who_leads)
    masters = "m0:1,m1:1"
    assert discovery.find_shards("", Layout(), masters, 1.0) == 2
    for shard in (0, 1):
        record = discovery.find_leader("", Layout("default", shard, 2), masters, 1.0,
                                       shard=shard)
        assert record.address == f"leader-of-{shard}:1"
    with pytest.raises(Unavailable) as exc:
        discovery.find_leader("", Layout("default", 1, 2), "m0:1", 1.0, shard=1)
    assert "m0:1: serves another shard than 1" in exc.value.message


def test_a_cluster_whose_masters_say_no_count_has_one_shard(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(discovery, "_who_leads",
                        lambda *_: pb.WhoLeadsResponse(address="a:1", is_leader=True))
    assert discovery.find_shards("", Layout(), "a:1", 1.0) == 1
    monkeypatch.setattr(discovery, "_who_leads", lambda *_: "UNIMPLEMENTED")
    assert discovery.find_shards("", Layout(), "a:1", 1.0) == 1


def test_the_count_is_read_from_etcd(monkeypatch: pytest.MonkeyPatch) -> None:
    stored: dict[bytes, bytes] = {}
    monkeypatch.setattr(discovery, "read_key_sync",
                        lambda _e, key, timeout=3.0: stored.get(key))
    assert discovery.find_shards("etcd:1", Layout(), None, 1.0) == 1  # absent: one shard
    stored[Layout().shard_count] = b"4"
    assert discovery.find_shards("etcd:1", Layout(), None, 1.0) == 4
    stored[Layout("default", 3, 4).leader] = b'{"master_id": "m3", "address": "x:1", "pid": 1}'
    assert discovery.find_leader("etcd:1", Layout("default", 3, 4), None, 1.0,
                                 shard=3).address == "x:1"


def test_a_shards_failover_is_followed_by_that_shard_alone(rig: ShardRig) -> None:
    """Shard 1's leader is deposed (it answers NOT_LEADER): the client looks up shard 1's
    leader only, opens a channel to it, and takes its epoch as shard 1's; shard 0's
    channel and epoch stay as they were."""
    old = rig.masters[1]
    new = ShardMaster(rig.node, rig.transfer, rig.trace, 1, SHARDS, itertools.count(500))
    new.epoch = old.epoch + 1
    deposed = pb.PutStartResponse(error={"code": Code.NOT_LEADER, "message": "deposed"})
    old.call = lambda method, request: deposed  # type: ignore[method-assign]
    found: list[int] = []

    def find_leader(shard: int = 0) -> MasterRecord:
        found.append(shard)
        return MasterRecord("m-new", "new-leader-of-1:1", 1, fast="new-leader-of-1:2")

    c = rig.client
    c.find_leader = find_leader
    c._open = lambda record, given_up="": ShardControl(new, rig.trace)
    first = c._control
    keys = keys_of(16)
    assert c.put_many(keys, [b"v"] * len(keys)) == [None] * len(keys)
    assert found == [1]
    assert c._control is first and c._others[1].master is new
    assert rig.state.epochs[1] == new.epoch and rig.state.epoch == rig.masters[0].epoch
    assert set(new.objects) == {k for k in keys if shard_of(k, SHARDS) == 1}
    assert c.stats.failovers == 1


def test_a_lease_rebuilt_from_its_id_is_released_on_every_shard(rig: ShardRig) -> None:
    """An adapter hands a lease's id on and releases `Lease(id, [], 0.0)` later: the
    client that made the lease finds its parts by that id."""
    keys = keys_of(8)
    _on_both(keys)
    rig.client.put_many(keys, [b"v"] * 8)
    lease = rig.client.lookup(keys)
    assert all(m.leases for m in rig.masters)
    rig.client.release(Lease(lease.id, [], 0.0))
    assert all(m.leases == {} for m in rig.masters)
    assert rig.state.shard_leases == {}


def test_a_lease_another_client_made_is_read_under_short_leases(rig: ShardRig) -> None:
    import numpy as np

    keys = keys_of(8)
    rig.client.put_many(keys, [b"%04d" % i for i in range(8)])
    stranger = Lease(987654, keys, rig.state.now() + 30.0)  # its parts are elsewhere
    dst = np.zeros(32, dtype=np.uint8)
    rig.client.register(dst)
    assert rig.client.get_into(keys, [dst[i * 4:(i + 1) * 4] for i in range(8)],
                               stranger) == [None] * 8
    assert bytes(dst) == b"".join(b"%04d" % i for i in range(8))
    rig.trace.clear()
    rig.client.release(stranger)  # names nothing at any master: nothing is sent
    assert rig.sent("release") == [] and rig.sent("ReleaseLease") == []


def test_list_keys_asks_every_shard_and_merges_in_key_order(rig: ShardRig) -> None:
    keys = keys_of(12)
    rig.client.put_many(keys, [b"v"] * 12)
    reply = rig.client._call("ListKeys", pb.ListKeysRequest(prefix=b"k", limit=5))
    assert [o.key for o in reply.objects] == sorted(keys)[:5] and reply.truncated
    assert sorted(rig.sent("ListKeys")) == [0, 1]
    whole = rig.client._call("ListKeys", pb.ListKeysRequest(prefix=b"k", limit=50))
    assert [o.key for o in whole.objects] == sorted(keys) and not whole.truncated


def _even(prefix: bytes, per_shard: int = 4) -> list[bytes]:
    """Keys with `per_shard` of each shard's: every batch's parts have one shape."""
    out: list[bytes] = []
    count = dict.fromkeys(range(SHARDS), 0)
    for key in keys_of(64, prefix):
        k = shard_of(key, SHARDS)
        if count[k] < per_shard:
            count[k] += 1
            out.append(key)
    assert len(out) == per_shard * SHARDS
    return out


@pytest.mark.parametrize("aio", [False, True], ids=["sync", "async"])
def test_a_batch_over_both_shards_commits_in_one_call_at_each(
        monkeypatch: pytest.MonkeyPatch, aio: bool) -> None:
    """Space started ahead per shard (reservations.py): from the third batch of a shape
    on, each shard's part is one PutCommit at its own shard, of placeholders of its own
    pool (a foreign placeholder would be refused whole, as WrongShard), and each refill
    is asked of the part's shard."""
    small_thresholds(monkeypatch)
    monkeypatch.setattr(reservations, "REFILL_TO", 0)
    rig = ShardRig(aio=aio)
    rig.state.reservations = Reservations(rig.state.writer_id, 1 << 20)
    rig.state.shard_pools(SHARDS, b"")
    batches = [(_even(b"b%d-" % j), [bytes([j]) * 512] * 8) for j in range(4)]

    def put(keys: list[bytes], values: list[bytes]) -> list[Any]:
        if not aio:
            return rig.client.put_many(keys, values)  # type: ignore[no-any-return]
        return asyncio.run(rig.client.put_many(keys, values))  # type: ignore[no-any-return]

    for keys, values in batches[:2]:
        assert put(keys, values) == [None] * 8
    assert rig.client.stats.one_call_puts == 0  # the first of a shape, then the one that asks
    for keys, values in batches[2:]:
        rig.trace.clear()
        assert put(keys, values) == [None] * 8
        assert sorted(rig.sent("PutCommit")) == [0, 1]
        # No PutStart of the batch's keys, no PutEnd: the PutStarts are the refills.
        assert rig.sent("PutEnd") == [] and sorted(rig.sent("PutStart")) == [0, 1]
        if not aio:
            # Each refill's reply is left for its own shard's next call: the second
            # part's refill did not wait for the first's (a connection answers in order,
            # two shards' connections do not answer each other's).
            assert sorted(rig.client._later) == [0, 1]
    assert rig.client.stats.one_call_puts == 16
    for m in rig.masters:
        held = [p for p in m.pending if p.startswith(reservations.PREFIX)]
        assert held and all(shard_of(p, SHARDS) == m.shard for p in held)
        assert len(held) == reservations.DEPTH * 4  # DEPTH parts' worth, as one shard's
    got = rig.client.get_many(batches[2][0]) if not aio else \
        asyncio.run(rig.client.get_many(batches[2][0]))
    assert got == batches[2][1]


def test_zero_copy_puts_over_both_shards_commit_in_one_call_at_each(
        monkeypatch: pytest.MonkeyPatch) -> None:
    small_thresholds(monkeypatch)
    monkeypatch.setattr(reservations, "REFILL_TO", 0)
    rig = ShardRig()
    rig.state.reservations = Reservations(rig.state.writer_id, 1 << 20)
    rig.state.shard_pools(SHARDS, b"")
    for j in range(3):
        keys = _even(b"z%d-" % j)
        values = [bytes([j + 1]) * 512] * len(keys)
        src = np.frombuffer(b"".join(values), dtype=np.uint8).copy()
        rig.client.register(src)
        rig.trace.clear()
        assert rig.client.put_from(keys, [src[i * 512:(i + 1) * 512]
                                          for i in range(len(keys))]) == [None] * len(keys)
    assert sorted(rig.sent("PutCommit")) == [0, 1] and rig.sent("PutEnd") == []
    assert rig.client.stats.one_call_puts == len(keys)
    assert rig.client.get_many(keys) == values


def test_each_shards_pool_holds_a_share_of_the_budget() -> None:
    rig = ShardRig(shards=4)
    rig.state.reservations = Reservations(rig.state.writer_id, 1 << 20)
    rig.state.shard_pools(4, b"t/")
    pools = rig.state.all_pools()
    assert [k for k, _ in pools] == [0, 1, 2, 3]
    assert all(rs.budget == (1 << 20) // 4 for _, rs in pools)
    assert rig.state.reservations_of(2) is pools[2][1]
    # Asked again (every connect fits the state): the same pools, not new ones.
    rig.state.shard_pools(4, b"t/")
    assert rig.state.all_pools() == pools
