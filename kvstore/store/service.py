"""gRPC handlers of a store node (called by the leader)."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from kvstore import put_record
from kvstore.checksum import matches
from kvstore.errors import MAX_KEY_BYTES, Code, KVStoreError
from kvstore.rpc.delta_columns import DROP, PENDING, RECORD, SSD, Columns
from kvstore.shards import MAX_SHARDS, shard_of
from kvstore.store.inventory import Held, Inventory, ShardInventories
from kvstore.store.segment import DramSegment
from kvstore.store.ssd import SsdTier
from kvstore.store.tier_metrics import TierCounters
from kvstore.v1 import common_pb2 as cpb
from kvstore.v1 import store_pb2 as spb
from kvstore.v1 import store_pb2_grpc as spbg

_STALE = "a newer leader has taken over; this master's epoch is stale"
# Demotions of objects up to this size in one Move are written as one pack file.
PACK_BELOW = 256 << 10
MAX_RECORD_BYTES = put_record.record_bytes(MAX_KEY_BYTES)


def _stale(response: Any, shard: int = 0) -> Any:
    message = _STALE if not shard else f"{_STALE} (shard {shard})"
    return response(error=cpb.Error(code=Code.NOT_LEADER, message=message))  # type: ignore[arg-type]


def _no_such_shard(response: Any, shard: int) -> Any:
    return response(error=cpb.Error(
        code=Code.INVALID_ARGUMENT,  # type: ignore[arg-type]
        message=f"shard {shard} cannot exist: a cluster has at most {MAX_SHARDS} shards "
                f"(0 to {MAX_SHARDS - 1})"))


class StoreNodeService(spbg.StoreNodeServicer):
    def __init__(self, node_id: str, inventory: Inventory | ShardInventories,
                 segment: DramSegment, ssd: SsdTier | None, counters: TierCounters) -> None:
        """`inventory`: the node's per-shard inventories, or shard 0's alone (one shard)."""
        self.node_id = node_id
        # Every master shard's leader keeps its own inventory and epoch on this node:
        # each call works on its request's shard's (docs/scaling.md).
        self.inventories = (inventory if isinstance(inventory, ShardInventories)
                            else ShardInventories(inventory))
        self.inventory = self.inventories.of(0)
        self.segment = segment
        self.ssd = ssd
        self.counters = counters
        self.ssd_tokens: dict[bytes, int] = {}  # key -> the leader's SSD reservation
        # Promotions read on threads of their own: a reader waits for them, and in the
        # shared pool they queued behind a flood of demotion writes.
        self._promoting = ThreadPoolExecutor(4, thread_name_prefix="promote")
        self.segment_name = ""  # the Transfer Engine's, once registered (Inventory says it)

    def _of(self, shard: int) -> Inventory | None:
        return self.inventories.of(shard) if 0 <= shard < MAX_SHARDS else None

    async def Apply(self, request: spb.ApplyRequest, context: Any) -> spb.ApplyResponse:
        inventory = self._of(request.shard)
        if inventory is None:
            return _no_such_shard(spb.ApplyResponse, request.shard)
        if not inventory.admit_epoch(request.epoch):
            return _stale(spb.ApplyResponse, request.shard)
        if request.add or request.drop:
            inventory.apply(
                [(r.key, Held(r.offset, r.size, r.checksum)) for r in request.add
                 if r.tier != "ssd"],
                [(r.key, r.offset) for r in request.drop if r.tier != "ssd"],
            )
        ssd_drops = [(r.key, r.offset) for r in request.drop if r.tier == "ssd"]
        if request.changes:
            epoch = request.epoch or 1
            ordered: list[tuple[bytes, Held | int]] = []
            for c in request.changes:
                r = c.replica
                if r.tier == "ssd":
                    if c.drop:
                        ssd_drops.append((r.key, r.offset))
                elif c.drop:
                    ordered.append((r.key, r.offset))
                else:
                    ordered.append((r.key, Held(r.offset, r.size, r.checksum,
                                                epoch if r.pending else 0,
                                                r.pending and r.record)))
            inventory.replay(ordered)
        await self._drop_ssd(ssd_drops)
        return spb.ApplyResponse()

    async def apply_columns(self, rows: Columns) -> spb.ApplyResponse:
        """Apply, for the delta channel's rows in columns (kvstore/rpc/delta_columns.py)."""
        inventory = self._of(rows.shard)
        if inventory is None:
            return _no_such_shard(spb.ApplyResponse, rows.shard)
        if not inventory.admit_epoch(rows.epoch):
            return _stale(spb.ApplyResponse, rows.shard)
        epoch = rows.epoch or 1
        ordered: list[tuple[bytes, Held | int]] = []
        ssd_drops: list[tuple[bytes, int]] = []
        add = ordered.append
        new = tuple.__new__  # Held(...) without its constructor's defaults: once per row
        for key, offset, size, checksum, f in zip(rows.keys, rows.offsets, rows.sizes,
                                                  rows.checksums, rows.flags, strict=True):
            if f & SSD:
                if f & DROP:
                    ssd_drops.append((key, offset))
            elif f & DROP:
                add((key, offset))
            elif f & PENDING:
                add((key, new(Held, (offset, size, checksum, epoch, bool(f & RECORD)))))
            else:
                add((key, new(Held, (offset, size, checksum, 0, False))))
        inventory.replay(ordered)
        await self._drop_ssd(ssd_drops)
        return spb.ApplyResponse()

    async def _drop_ssd(self, drops: list[tuple[bytes, int]]) -> None:
        # A drop names the reservation it frees: skip it if the key has been demoted
        # again since (a newer copy under a newer reservation).
        gone = [key for key, offset in drops if self.ssd_tokens.get(key, offset) == offset]
        for key in gone:
            self.ssd_tokens.pop(key, None)
        if gone and self.ssd is not None:
            ssd = self.ssd
            await asyncio.to_thread(lambda: [ssd.remove(k) for k in gone])

    async def Inventory(self, request: spb.InventoryRequest,
                        context: Any) -> spb.InventoryResponse:
        inventory = self._of(request.shard)
        if inventory is None:
            return _no_such_shard(spb.InventoryResponse, request.shard)
        if not inventory.admit_epoch(request.epoch):
            return _stale(spb.InventoryResponse, request.shard)
        if request.identity_only:
            return spb.InventoryResponse(node_id=self.node_id, segment=self.segment_name,
                                         base_addr=self.segment.base_addr,
                                         size=self.segment.size)
        pending = inventory.pending()
        verified: list[tuple[bytes, Held]] = []
        if pending:
            # Intents count only where their bytes verify: a put acknowledged on the
            # intent alone wrote its bytes before its PutEnd, while a write torn,
            # abandoned or never made is a miss here, never wrong bytes.
            verified, recorded = await asyncio.to_thread(self._verified, pending,
                                                         request.epoch)
            ok = {k for k, _ in verified} | recorded.keys()
            # A placeholder of the current leader is still its own: neither adopted nor
            # forgotten (its writer may still be writing it).
            torn = [(k, h) for k, h in pending
                    if k not in ok and not (h.record and h.pending >= request.epoch)]
            inventory.settle_pending(verified, torn, request.epoch, recorded)
            verified += list(recorded.values())
        replicas = [
            spb.Replica(key=k, offset=h.offset, size=h.size, checksum=h.checksum, tier="dram")
            for k, h in inventory.dram() if not h.pending
        ]
        listed = {r.key for r in replicas}  # a verified intent of an older leader is plain now
        replicas += [spb.Replica(key=k, offset=h.offset, size=h.size, checksum=h.checksum,
                                 tier="dram") for k, h in verified if k not in listed]
        if self.ssd is not None:
            # One SSD tier serves every shard: a shard's leader reads back the objects
            # whose keys are its own (all of them with one shard).
            shards, shard = request.shards, request.shard
            replicas += [spb.Replica(key=e.key, size=e.size, checksum=e.checksum, tier="ssd")
                         for e in self.ssd.entries()
                         if shards <= 1 or shard_of(e.key, shards) == shard]
        return spb.InventoryResponse(node_id=self.node_id, replicas=replicas,
                                     segment=self.segment_name,
                                     base_addr=self.segment.base_addr, size=self.segment.size)

    def _verified(self, pending: list[tuple[bytes, Held]], epoch: int,
                  ) -> tuple[list[tuple[bytes, Held]], dict[bytes, tuple[bytes, Held]]]:
        """The intents whose bytes verify; and, for the placeholders of leaders older than
        `epoch`, the key and entry their intact put record names (kvstore/put_record.py)."""
        out = []
        recorded: dict[bytes, tuple[bytes, Held]] = {}
        size = self.segment.size
        for key, held in pending:
            end = held.offset + held.size
            if held.size == 0 or end > size:
                continue
            if held.record:
                if held.pending < epoch:
                    found = self._recorded(key, held)
                    if found is not None:
                        recorded[key] = found
                continue
            view = self.segment.view[held.offset:end]
            try:
                if matches(view, held.checksum):
                    out.append((key, held))
            finally:
                view.release()
        return out, recorded

    def _recorded(self, placeholder: bytes, held: Held) -> tuple[bytes, Held] | None:
        end = held.offset + held.size
        room = self.segment.view[end:min(end + MAX_RECORD_BYTES, self.segment.size)]
        try:
            rec = put_record.resolve(room, placeholder, held.size)
        finally:
            room.release()
        if rec is None:
            return None
        view = self.segment.view[held.offset:end]
        try:
            if not matches(view, rec.checksum):
                return None
        finally:
            view.release()
        return rec.key, Held(held.offset, held.size, rec.checksum)

    async def Move(self, request: spb.MoveRequest, context: Any) -> spb.MoveResponse:
        inventory = self._of(request.shard)
        if inventory is None:
            return _no_such_shard(spb.MoveResponse, request.shard)
        if not inventory.admit_epoch(request.epoch):
            return _stale(spb.MoveResponse, request.shard)
        items = list(request.items)
        # Disk I/O runs in worker threads, several at once, off the event loop: the
        # node keeps answering the leader (and its etcd keepalive) meanwhile.
        loop = asyncio.get_running_loop()
        small = [i for i, item in enumerate(items) if item.kind == "demote"
                 and 0 < item.size <= PACK_BELOW and item.dram_offset + item.size <= self.segment.size]
        if len(small) < 2 or self.ssd is None:
            small = []
        packed = set(small)
        codes = list(await asyncio.gather(*(
            loop.run_in_executor(self._promoting if item.kind == "promote" else None,
                                 self._move, item)
            for i, item in enumerate(items) if i not in packed)))
        if small:
            # Small demotions go to SSD together, as one pack file: creating a file per
            # object is most of a small object's demotion (docs/perf-notes.md).
            packed_codes = await asyncio.to_thread(self._demote_packed, [items[i] for i in small])
            rest = iter(codes)
            it = iter(packed_codes)
            codes = [next(it) if i in packed else next(rest) for i in range(len(items))]
        demoted = [i for i, item in enumerate(items)
                   if item.kind == "demote" and codes[i] == Code.OK]
        ssd = self.ssd
        if demoted and ssd is not None and ssd.fsync:
            # Group commit: the demotions were written without fsync; one flush of the
            # tier covers the whole batch (and those of concurrent Moves), and no
            # demotion is acknowledged before it returns. The master frees the DRAM
            # copy and records the SSD one only on OK.
            try:
                await asyncio.to_thread(ssd.sync)
            except KVStoreError as exc:
                for i in demoted:
                    codes[i] = int(exc.code)
                    if self.ssd_tokens.get(items[i].key) == items[i].ssd_offset:
                        del self.ssd_tokens[items[i].key]
                demoted = []
        for i in demoted:
            self.counters.demotions += 1
            self.counters.demoted_bytes += items[i].size
        return spb.MoveResponse(codes=codes)  # type: ignore[arg-type]

    def _demote_packed(self, items: list[spb.MoveItem]) -> list[int]:
        ssd = self.ssd
        assert ssd is not None
        views = [self.segment.view[m.dram_offset:m.dram_offset + m.size] for m in items]
        try:
            results = ssd.put_many([(m.key, v, m.checksum) for m, v in zip(items, views,
                                                                              strict=True)])
        finally:
            for v in views:
                v.release()
        codes = []
        for m, r in zip(items, results, strict=True):
            if isinstance(r, KVStoreError):
                if r.code == Code.CORRUPT:
                    self.counters.corrupt += 1
                codes.append(int(r.code))
            else:
                self.ssd_tokens[m.key] = m.ssd_offset
                codes.append(int(Code.OK))
        return codes

    def _move(self, item: spb.MoveItem) -> int:
        ssd = self.ssd
        if ssd is None:
            return int(Code.NOT_FOUND)
        end = item.dram_offset + item.size
        if item.size == 0 or end > self.segment.size:
            return int(Code.INVALID_ARGUMENT)
        view = self.segment.view[item.dram_offset:end]
        try:
            if item.kind == "demote":
                # put() refuses bytes that do not match the checksum (CORRUPT): never
                # persist a copy that is already wrong (a torn or stray write). No fsync
                # here: Move flushes the batch once (group commit) before answering.
                ssd.put(item.key, view, item.checksum, sync=False)
                self.ssd_tokens[item.key] = item.ssd_offset
            elif item.kind == "promote":
                ssd.read_into(item.key, view)  # verifies the file's checksum
                if not matches(view, item.checksum):
                    return int(Code.CORRUPT)
                self.counters.promotions += 1
                self.counters.promoted_bytes += item.size
            else:
                return int(Code.INVALID_ARGUMENT)
        except KVStoreError as exc:
            if exc.code == Code.CORRUPT:
                self.counters.corrupt += 1
            return int(exc.code)
        finally:
            view.release()
        return int(Code.OK)
