"""A write's reply waits for its store nodes' record (kvstore.master.durability), and the
deltas of writes that wait together go to a node in one Apply (group commit)."""

from __future__ import annotations

import asyncio
from typing import Any

from kvstore.errors import Code
from kvstore.master.core import ReplicaChange
from kvstore.master.durability import Recorder
from kvstore.master.nodes import NodeLinks
from kvstore.v1 import common_pb2 as cpb
from kvstore.v1 import master_pb2 as pb
from kvstore.v1 import store_pb2 as spb
from tests.unit.polling import wait_until_async


class FakeNode:
    """Stands in for a store node's Apply: held until `gate` opens, then OK (or the
    answer given)."""

    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.gate.set()
        self.calls: list[spb.ApplyRequest] = []
        self.answer = spb.ApplyResponse()

    async def Apply(self, request: spb.ApplyRequest, timeout: float) -> spb.ApplyResponse:
        self.calls.append(request)
        await self.gate.wait()
        return self.answer


def links_with(*node_ids: str) -> tuple[NodeLinks, dict[str, FakeNode]]:
    links = NodeLinks(lambda: 7)
    nodes = {}
    for n in node_ids:
        links.set_node(n, f"127.0.0.1:{1000 + len(nodes)}")
        nodes[n] = FakeNode()
        links._links[n].stub = nodes[n]  # type: ignore[assignment]
    return links, nodes


def commit(node: str, key: bytes, added: bool = True) -> ReplicaChange:
    return ReplicaChange(node, "dram", key, 0, 4, 1, added)


def added(request: spb.ApplyRequest) -> list[spb.Replica]:
    """The replicas an Apply adds (the leader sends them in `changes`, in order)."""
    return [c.replica for c in request.changes if not c.drop]


def dropped(request: spb.ApplyRequest) -> list[spb.Replica]:
    return [c.replica for c in request.changes if c.drop]


def taker(journal: list[ReplicaChange]) -> Any:
    """The core's take_replica_changes over a plain list."""
    def take() -> list[ReplicaChange]:
        out = journal[:]
        journal.clear()
        return out
    return take


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def test_the_reply_waits_until_the_node_applied_the_commit() -> None:
    async def main() -> None:
        links, nodes = links_with("a")
        journal = [commit("a", b"k")]
        rec = Recorder(taker(journal), links, timeout=30)
        nodes["a"].gate.clear()
        reply = pb.CodesResponse(codes=[Code.OK])
        wait = rec.record("PutEnd", reply)
        assert wait is not None
        task = asyncio.ensure_future(wait)
        for _ in range(20):
            await asyncio.sleep(0)
        assert not task.done(), "the reply left before the node recorded the commit"
        assert [r.key for r in added(nodes["a"].calls[0])] == [b"k"]
        nodes["a"].gate.set()
        await task
        assert reply.error.code == 0
        await links.close()
    run(main())


def test_commits_waiting_together_go_in_one_apply() -> None:
    async def main() -> None:
        links, nodes = links_with("a")
        journal: list[ReplicaChange] = []
        rec = Recorder(taker(journal), links, timeout=30)
        nodes["a"].gate.clear()
        waits = []
        for i in range(10):
            journal.append(commit("a", b"k%d" % i))
            w = rec.record("PutEnd", pb.CodesResponse())
            assert w is not None
            waits.append(asyncio.ensure_future(w))
            await asyncio.sleep(0)
        assert len(nodes["a"].calls) == 1  # the first is in flight, the rest wait for it
        nodes["a"].gate.set()
        await asyncio.gather(*waits)
        assert len(nodes["a"].calls) == 2
        assert len(added(nodes["a"].calls[1])) == 9
        await links.close()
    run(main())


def test_a_node_that_does_not_record_in_time_fails_the_write() -> None:
    async def main() -> None:
        links, nodes = links_with("a", "b")
        journal = [commit("a", b"k1"), commit("b", b"k2")]
        rec = Recorder(taker(journal), links, timeout=0.05)
        nodes["b"].gate.clear()  # frozen
        reply = pb.CodesResponse()
        wait = rec.record("PutCommit", reply)
        assert wait is not None
        await wait
        assert reply.error.code == Code.UNAVAILABLE
        assert "b" in reply.error.message and "idempotent" in reply.error.message
        assert rec.refused == 1
        nodes["b"].gate.set()
        await links.close()
    run(main())


def test_one_recorded_replica_of_two_is_enough() -> None:
    async def main() -> None:
        links, nodes = links_with("a", "b")
        journal = [commit("a", b"k"), commit("b", b"k")]
        rec = Recorder(taker(journal), links, timeout=0.05)
        nodes["b"].gate.clear()
        reply = pb.CodesResponse()
        wait = rec.record("PutEnd", reply)
        assert wait is not None
        await wait
        assert reply.error.code == 0
        nodes["b"].gate.set()
        await links.close()
    run(main())


def test_a_node_that_knows_a_newer_leader_turns_the_reply_into_not_leader() -> None:
    async def main() -> None:
        links, nodes = links_with("a")
        nodes["a"].answer = spb.ApplyResponse(error=cpb.Error(code=Code.NOT_LEADER,
                                                              message="stale"))
        journal = [commit("a", b"k")]
        rec = Recorder(taker(journal), links, 30)
        reply = pb.CodesResponse()
        wait = rec.record("Remove", reply)
        assert wait is not None
        await wait
        assert reply.error.code == Code.NOT_LEADER
        await links.close()
    run(main())


def test_reads_and_failed_writes_do_not_wait() -> None:
    async def main() -> None:
        links, nodes = links_with("a")
        journal = [commit("a", b"k", added=False)]
        rec = Recorder(taker(journal), links, 30)
        nodes["a"].gate.clear()
        assert rec.record("PutStart", pb.PutStartResponse()) is None  # an eviction's free
        assert rec.record("PutEnd", pb.CodesResponse()) is None  # nothing changed
        nodes["a"].gate.set()
        await wait_until_async(lambda: nodes["a"].calls, what="the delta reached the node")
        assert [r.key for r in dropped(nodes["a"].calls[0])] == [b"k"]  # still delivered
        await links.close()
    run(main())


def test_a_node_unreachable_for_a_while_gets_the_deltas_in_order() -> None:
    async def main() -> None:
        import grpc

        links, _ = links_with("a")
        failures = [2]
        calls: list[spb.ApplyRequest] = []

        class Flaky:
            async def Apply(self, request: spb.ApplyRequest, timeout: float) -> spb.ApplyResponse:
                calls.append(request)
                if failures[0]:
                    failures[0] -= 1
                    raise grpc.aio.AioRpcError(grpc.StatusCode.UNAVAILABLE, None, None)  # type: ignore[arg-type]
                return spb.ApplyResponse()

        links._links["a"].stub = Flaky()  # type: ignore[assignment]
        journal = [commit("a", b"k1"), commit("a", b"k2")]
        rec = Recorder(taker(journal), links, 30)
        reply = pb.CodesResponse()
        wait = rec.record("PutEnd", reply)
        assert wait is not None
        await wait
        assert reply.error.code == 0
        assert len(calls) == 3
        assert [r.key for r in added(calls[-1])] == [b"k1", b"k2"]
        await links.close()
    run(main())


def test_a_key_found_stored_waits_for_its_record_still_in_flight() -> None:
    """A retry after a write whose reply said "not recorded in time" finds the key
    stored; its OK must still wait for the first write's record."""
    async def main() -> None:
        links, nodes = links_with("a")
        journal = [commit("a", b"k")]
        rec = Recorder(taker(journal), links, timeout=0.05)
        nodes["a"].gate.clear()  # the node is slow
        first = pb.CodesResponse()
        wait = rec.record("PutEnd", first)
        assert wait is not None
        await wait
        assert first.error.code == Code.UNAVAILABLE  # not recorded in time
        retry = pb.CodesResponse(codes=[Code.ALREADY_EXISTS])
        wait = rec.record("PutEnd", retry, {b"k": {"a"}})
        assert wait is not None, "the retry was acknowledged before the record landed"
        nodes["a"].gate.set()
        rec.timeout = 30
        again = rec.record("PutStart", pb.PutStartResponse(), {b"k": {"a"}})
        if again is not None:
            await again
        await links.close()
        # once recorded, a key found stored is acknowledged at once
        links2, _ = links_with("a")
        assert Recorder(taker([]), links2, 30).record("PutStart", pb.PutStartResponse(),
                                                      {b"k": {"a"}}) is None
        await links2.close()
    run(main())
