"""A put's OK waits for the intent sent at PutStart, not for its commit: the durable put
with no leader-to-node round trip in sequence (kvstore.master.durability; the node side
in kvstore.store.service and inventory.py; docs/durability.md, section 1).

The leader side runs the real Recorder and NodeLinks against fake nodes whose Apply is
held by a gate; the node side runs the real StoreNodeService over a real DRAM segment.
"""

from __future__ import annotations

import asyncio
from typing import Any

from kvstore.checksum import checksum
from kvstore.errors import Code
from kvstore.master.core import Location, ReplicaChange
from kvstore.master.durability import Placed, Recorder
from kvstore.store.inventory import Held, Inventory
from kvstore.store.segment import DramSegment
from kvstore.store.service import StoreNodeService
from kvstore.store.tier_metrics import TierCounters
from kvstore.v1 import master_pb2 as pb
from kvstore.v1 import store_pb2 as spb
from tests.unit.polling import wait_until_async
from tests.unit.test_master_durability import links_with, taker

BASE = 1 << 30  # the fake nodes' DRAM base address


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def placed(key: bytes, offset: int, *nodes: str, size: int = 4, checksum: int = 1) -> Placed:
    return Placed(key, checksum, [Location(n, f"seg-{n}", BASE + offset, size) for n in nodes])


def committed(node: str, key: bytes, offset: int, added: bool = True) -> ReplicaChange:
    return ReplicaChange(node, "dram", key, offset, 4, 1, added)  # type: ignore[arg-type]


def changes(calls: list[spb.ApplyRequest]) -> list[tuple[bytes, int, str]]:
    """Every change the node was sent, in order: (key, offset, intent/commit/drop)."""
    return [(c.replica.key, c.replica.offset,
             "drop" if c.drop else "intent" if c.replica.pending else "commit")
            for call in calls for c in call.changes]


def recorder(journal: list[ReplicaChange], *nodes: str, timeout: float = 30) -> Any:
    links, fakes = links_with(*nodes)
    return Recorder(taker(journal), links, timeout, lambda _n: BASE), links, fakes


async def settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


def test_put_start_sends_the_intent_at_once_and_its_reply_does_not_wait() -> None:
    async def main() -> None:
        journal: list[ReplicaChange] = []
        rec, links, nodes = recorder(journal, "a", "b")
        nodes["a"].gate.clear()
        assert rec.record("PutStart", pb.PutStartResponse(), {},
                          [placed(b"k", 64, "a", "b", checksum=9)]) is None
        await wait_until_async(lambda: nodes["a"].calls and nodes["b"].calls,
                               what="the intents reached both nodes")
        for n in ("a", "b"):
            (c,) = nodes[n].calls[0].changes
            assert (c.replica.key, c.replica.offset, c.replica.size, c.replica.checksum,
                    c.replica.pending, c.drop) == (b"k", 64, 4, 9, True, False)
        nodes["a"].gate.set()
        await links.close()
    run(main())


def test_put_end_after_the_intent_landed_does_not_wait_for_the_commit() -> None:
    async def main() -> None:
        journal: list[ReplicaChange] = []
        rec, links, nodes = recorder(journal, "a")
        rec.record("PutStart", pb.PutStartResponse(), {}, [placed(b"k", 64, "a")])
        await wait_until_async(lambda: links._links["a"].applied == 1, what="the intent landed")
        nodes["a"].gate.clear()  # the commit will not land while the reply is decided
        journal.append(committed("a", b"k", 64))
        reply = pb.CodesResponse(codes=[Code.OK])
        assert rec.record("PutEnd", reply) is None, "the reply waited for the commit"
        assert rec.early == 1
        await wait_until_async(lambda: len(nodes["a"].calls) == 2, what="the commit was sent")
        assert changes(nodes["a"].calls) == [(b"k", 64, "intent"), (b"k", 64, "commit")]
        nodes["a"].gate.set()
        await links.close()
    run(main())


def test_commits_nothing_waits_for_share_one_apply_and_intents_go_at_once(
        monkeypatch: Any) -> None:
    """Commits acknowledged on their landed intents are held back (DEFER) to share an
    Apply; a PutStart's intents are sent at once, taking the held commits along."""
    from kvstore.master import nodes as node_links
    monkeypatch.setattr(node_links, "DEFER", 3600.0)  # held until something goes now

    async def main() -> None:
        journal: list[ReplicaChange] = []
        rec, links, nodes = recorder(journal, "a")
        rec.record("PutStart", pb.PutStartResponse(), {},
                   [placed(b"k%d" % i, 64 * i, "a") for i in range(5)])
        await wait_until_async(lambda: links._links["a"].applied == 5, what="intents landed")
        for i in range(5):
            journal.append(committed("a", b"k%d" % i, 64 * i))
            assert rec.record("PutEnd", pb.CodesResponse(codes=[Code.OK])) is None
            await settle()
        assert len(nodes["a"].calls) == 1, "a commit nothing waits for was sent alone"
        rec.record("PutStart", pb.PutStartResponse(), {}, [placed(b"n", 640, "a")])
        await wait_until_async(lambda: len(nodes["a"].calls) == 2, what="the intent went")
        assert changes(nodes["a"].calls[1:]) == [
            *((b"k%d" % i, 64 * i, "commit") for i in range(5)), (b"n", 640, "intent")]
        await links.close()
    run(main())


def test_a_held_delta_goes_when_a_reply_waits_for_the_node() -> None:
    async def main() -> None:
        journal: list[ReplicaChange] = []
        rec, links, nodes = recorder(journal, "a")
        journal.append(committed("a", b"old", 0, added=False))  # a free: nothing waits
        assert rec.record("PutEnd", pb.CodesResponse()) is None
        journal.append(committed("a", b"k", 64))  # no intent: its reply waits
        reply = pb.CodesResponse(codes=[Code.OK])
        wait = rec.record("PutEnd", reply)
        assert wait is not None
        await wait
        assert reply.error.code == 0
        assert changes(nodes["a"].calls) == [(b"old", 0, "drop"), (b"k", 64, "commit")]
        await links.close()
    run(main())


def test_put_end_before_the_intent_landed_waits_for_the_intent_only() -> None:
    async def main() -> None:
        journal: list[ReplicaChange] = []
        rec, links, nodes = recorder(journal, "a")
        nodes["a"].gate.clear()
        rec.record("PutStart", pb.PutStartResponse(), {}, [placed(b"k", 64, "a")])
        await settle()
        journal.append(committed("a", b"k", 64))
        reply = pb.CodesResponse(codes=[Code.OK])
        wait = rec.record("PutEnd", reply)
        assert wait is not None
        task = asyncio.ensure_future(wait)
        await settle()
        assert not task.done(), "the reply left before the node had the intent"
        link = links._links["a"]
        # Let exactly the intent's Apply through; the commit's waits behind the gate.
        nodes["a"].gate.set()
        await wait_until_async(lambda: link.applied >= 1, what="the intent's Apply")
        nodes["a"].gate.clear()
        await task
        assert reply.error.code == 0 and rec.early == 1
        nodes["a"].gate.set()
        await links.close()
    run(main())


def test_a_commit_with_no_intent_waits_for_its_own_delta() -> None:
    """PutCommit (space started ahead: no checksum at PutStart) and a commit whose node
    base is unknown keep the old rule: the reply waits for the commit itself."""
    async def main() -> None:
        journal = [committed("a", b"k", 64)]
        rec, links, nodes = recorder(journal, "a")
        nodes["a"].gate.clear()
        reply = pb.CodesResponse(codes=[Code.OK])
        wait = rec.record("PutCommit", reply)
        assert wait is not None
        task = asyncio.ensure_future(wait)
        await settle()
        assert not task.done()
        nodes["a"].gate.set()
        await task
        assert reply.error.code == 0 and rec.early == 0
        await links.close()
    run(main())


def test_a_revoked_put_drops_its_intent_before_the_range_is_placed_again() -> None:
    async def main() -> None:
        journal: list[ReplicaChange] = []
        rec, links, nodes = recorder(journal, "a")
        nodes["a"].gate.clear()
        rec.record("PutStart", pb.PutStartResponse(), {}, [placed(b"k", 64, "a")])
        assert rec.record("PutRevoke", pb.CodesResponse(), {}, (), [b"k"]) is None
        rec.record("PutStart", pb.PutStartResponse(), {}, [placed(b"j", 64, "a")])
        nodes["a"].gate.set()
        await wait_until_async(lambda: links._links["a"].applied == 3, what="all delivered")
        assert changes(nodes["a"].calls) == [(b"k", 64, "intent"), (b"k", 64, "drop"),
                                             (b"j", 64, "intent")]
        await links.close()
    run(main())


def test_a_put_committed_elsewhere_drops_the_earlier_attempts_intent() -> None:
    async def main() -> None:
        journal: list[ReplicaChange] = []
        rec, links, nodes = recorder(journal, "a", "b")
        rec.record("PutStart", pb.PutStartResponse(), {}, [placed(b"k", 64, "a")])
        rec.record("PutStart", pb.PutStartResponse(), {}, [placed(b"k", 128, "b")])
        await wait_until_async(lambda: links._links["a"].applied == 2, what="a's deltas")
        assert changes(nodes["a"].calls) == [(b"k", 64, "intent"), (b"k", 64, "drop")]
        rec.forget([b"k"])  # reclaimed: the intent on b goes as well
        await wait_until_async(lambda: links._links["b"].applied == 2, what="b's deltas")
        assert changes(nodes["b"].calls)[-1] == (b"k", 128, "drop")
        await links.close()
    run(main())


def test_a_remove_waits_for_an_intent_drop_still_in_flight() -> None:
    """No intent outlives a removal: a new leader would adopt it back if its bytes
    verified."""
    async def main() -> None:
        journal: list[ReplicaChange] = []
        rec, links, nodes = recorder(journal, "a", "b")
        nodes["b"].gate.clear()  # b is slow
        rec.record("PutStart", pb.PutStartResponse(), {}, [placed(b"k", 64, "b")])
        rec.record("PutRevoke", pb.CodesResponse(), {}, (), [b"k"])  # its drop waits on b
        rec.record("PutStart", pb.PutStartResponse(), {}, [placed(b"k", 64, "a")])
        await wait_until_async(lambda: links._links["a"].applied == 1, what="a's intent")
        journal.append(committed("a", b"k", 64))
        assert rec.record("PutEnd", pb.CodesResponse(codes=[Code.OK])) is None
        journal.append(committed("a", b"k", 64, added=False))
        reply = pb.CodesResponse(codes=[Code.OK])
        wait = rec.record("Remove", reply, {}, (), [b"k"])
        assert wait is not None
        task = asyncio.ensure_future(wait)
        await wait_until_async(lambda: links._links["a"].applied == links._links["a"].queued,
                               what="a applied the removal")
        await settle()
        assert not task.done(), "the removal was acknowledged with b's intent still there"
        nodes["b"].gate.set()
        await task
        assert reply.error.code == 0
        await links.close()
    run(main())


# -- the node side -----------------------------------------------------------------


def _node() -> tuple[StoreNodeService, DramSegment, Inventory]:
    segment = DramSegment(1 << 20, prefault=False)
    inv = Inventory()
    return StoreNodeService("n0", inv, segment, None, TierCounters()), segment, inv


def _intent(key: bytes, offset: int, data: bytes, pending: bool = True) -> spb.Change:
    return spb.Change(replica=spb.Replica(key=key, offset=offset, size=len(data),
                                          checksum=checksum(data), tier="dram",
                                          pending=pending))


def test_a_new_leader_adopts_an_intent_whose_bytes_verify_and_misses_a_torn_one() -> None:
    async def main() -> None:
        service, segment, inv = _node()
        good, torn, unwritten = b"g" * 4096, b"t" * 4096, b"u" * 4096
        await service.Apply(spb.ApplyRequest(epoch=3, changes=[
            _intent(b"good", 0, good), _intent(b"torn", 8192, torn),
            _intent(b"never", 16384, unwritten)]), None)
        segment.view[0:4096] = good  # written whole, PutEnd acknowledged on the intent
        segment.view[8192:8192 + 2048] = torn[:2048]  # a write abandoned half way
        reply = await service.Inventory(spb.InventoryRequest(epoch=4), None)
        assert [(r.key, r.offset, r.checksum) for r in reply.replicas] == [
            (b"good", 0, checksum(good))]
        # The old leader's intents are settled: the verified one is a plain entry now,
        # the others are forgotten (no leader can commit them any more).
        assert inv.dram() == [(b"good", Held(0, 4096, checksum(good)))]
        segment.close()
    run(main())


def test_the_current_leaders_unverified_intents_are_kept() -> None:
    """A leader that reads the inventory again (a node's SSD objects re-adopted) must not
    make the node forget the intents of its own puts still in flight."""
    async def main() -> None:
        service, segment, inv = _node()
        data = b"x" * 100
        await service.Apply(spb.ApplyRequest(epoch=5, changes=[_intent(b"k", 0, data)]), None)
        reply = await service.Inventory(spb.InventoryRequest(epoch=5), None)
        assert list(reply.replicas) == []
        assert [k for k, _ in inv.pending()] == [b"k"]
        segment.view[0:100] = data
        reply = await service.Inventory(spb.InventoryRequest(epoch=5), None)
        assert [r.key for r in reply.replicas] == [b"k"]
        segment.close()
    run(main())


def test_changes_apply_in_the_leaders_order() -> None:
    """An intent, its commit and a removal in one Apply leave nothing; an intent, a drop
    and a new intent at the same offset leave the new one."""
    async def main() -> None:
        service, segment, inv = _node()
        data = b"d" * 10
        drop = spb.Change(replica=spb.Replica(key=b"a", offset=0, tier="dram"), drop=True)
        await service.Apply(spb.ApplyRequest(epoch=1, changes=[
            _intent(b"a", 0, data), _intent(b"a", 0, data, pending=False), drop]), None)
        assert inv.dram() == []
        drop_b = spb.Change(replica=spb.Replica(key=b"b", offset=64, tier="dram"), drop=True)
        await service.Apply(spb.ApplyRequest(epoch=1, changes=[
            _intent(b"b", 64, data), drop_b, _intent(b"b", 64, b"e" * 10)]), None)
        assert inv.dram() == [(b"b", Held(64, 10, checksum(b"e" * 10), 1))]
        segment.close()
    run(main())


def test_a_node_whose_delta_fails_is_reported_down_until_one_lands() -> None:
    async def main() -> None:
        import grpc

        health: list[tuple[str, bool]] = []
        links, _ = links_with("a")
        links.on_health = lambda n, ok: health.append((n, ok))
        failures = [2]

        class Dead:
            async def Apply(self, request: spb.ApplyRequest, timeout: float) -> spb.ApplyResponse:
                if failures[0]:
                    failures[0] -= 1
                    raise grpc.aio.AioRpcError(grpc.StatusCode.UNAVAILABLE, None, None)  # type: ignore[arg-type]
                return spb.ApplyResponse()

        links._links["a"].stub = Dead()  # type: ignore[assignment]
        rec = Recorder(taker([]), links, 30, lambda _n: BASE)
        rec.record("PutStart", pb.PutStartResponse(), {}, [placed(b"k", 0, "a")])
        await wait_until_async(lambda: health == [("a", False)], what="a reported down")
        assert links.down == {"a"}
        await wait_until_async(lambda: links._links["a"].applied == 1, what="a answers again")
        assert health == [("a", False), ("a", True)] and not links.down
        await links.close()
    run(main())
