"""The SSD tier: demotion (DRAM -> SSD instead of dropping) and promotion (back).

An object lives in one tier at a time: DRAM (one or more replicas) or SSD (one replica,
a file on one node). Moving it is a copy the store node makes, so a move is two steps:
the core reserves the destination and holds the object with a synthetic pin (nothing
evicts or re-allocates it meanwhile; readers still read the source), the I/O layer has
the node copy (take_tier_moves), then finish_tier_move swaps the replica and frees the
source. A move whose node fails to copy leaves the object where it was (promotion) or
drops it (a demotion was an eviction anyway).
"""

from __future__ import annotations

from collections.abc import Sequence

from kvstore.errors import Code

from .eviction import Eviction
from .keys import norm_key
from .lifecycle import COMPLETE
from .objects import SLOT_BITS
from .pins import Pins
from .quarantine import move_tag
from .results import MoveKind, TierMove
from .segments import DRAM, OFFSET_BITS, OFFSET_MASK, SSD, alloc_size
from .state import TIER_COUNTERS, CoreState, Move

DEMOTE = MoveKind.DEMOTE
PROMOTE = MoveKind.PROMOTE


class Tiers:
    def __init__(self, state: CoreState, pins: Pins, eviction: Eviction) -> None:
        self._state = state
        self._t = state.objects
        self._pins = pins
        self._eviction = eviction

    def take_tier_moves(self) -> list[TierMove]:
        state = self._state
        out, state.move_queue = state.move_queue, []
        return out

    def moving(self, key: bytes) -> bool:
        s = self._t.index.get(key)
        return s is not None and s in self._state.moves

    def tier_counters(self) -> dict[str, int]:
        c = self._state.counts
        return {name: getattr(c, name) for name in TIER_COUNTERS}

    def _queued(self) -> None:
        wake = self._state.on_move_queued
        if wake is not None:
            wake()

    # -- promotion ----------------------------------------------------------------

    def queue_promotion(self, s: int) -> None:
        """A reader wants SSD object s: start its promotion (once) and wake the mover."""
        key = self._t.key_of[s]
        if key is not None and s not in self._state.moves:
            self._state.move_queue.extend(self.promote([key]))
            self._queued()

    def promote(self, keys: Sequence[bytes]) -> list[TierMove]:
        """MasterCore.promote."""
        state = self._state
        state.check_batch(len(keys))
        t = self._t
        now = state.clock.now()
        started: list[TierMove] = []
        by_id = state.segments.by_id
        moves = state.moves
        for key in keys:
            k = norm_key(key)
            s = t.index.get(k) if k is not None else None
            if s is None or t.phase[s] != COMPLETE or s in moves:
                continue
            h = t.where[s]
            seg = by_id.get(h >> OFFSET_BITS)
            if seg is None or seg.tier == DRAM:
                continue
            dram = state.segments.get(seg.node_id, DRAM)
            if dram is None:
                continue
            size = t.size[s]
            off = dram.take(size)
            if off < 0:
                # Make room by demoting (never by dropping: that would trade one
                # object for another); the reader asks again and finds room then.
                if now >= state.hold_until:
                    self.demote_for(size)
                continue
            moves[s] = Move(PROMOTE, s | t.gen[s] << SLOT_BITS, dram.handle(off))
            self._pins.hold(s, now)
            started.append(TierMove(PROMOTE, seg.node_id, k, size, t.checksum[s], off))  # type: ignore[arg-type]
        self._eviction.flush()
        return started

    # -- demotion -----------------------------------------------------------------

    def demote_for(self, asize: int) -> bool:
        """Demote oldest-first until in-flight demotions will free `asize` bytes;
        True if any demotion is in flight (the caller should retry shortly)."""
        ledger = self._state.ledger
        lru = self._state.lru
        while ledger.demoting < asize:
            s = lru.oldest()
            if not s or not self.start_demotion(s):
                break
        return ledger.demoting > 0

    def start_demotion(self, s: int) -> bool:
        """Reserve SSD room on the node of s's first DRAM replica and queue the copy;
        False when that node has no SSD tier or no room even after SSD eviction."""
        state = self._state
        t = self._t
        seg = state.segments.by_id[t.where[s] >> OFFSET_BITS]
        ssd = state.segments.get(seg.node_id, SSD)
        if ssd is None or s in state.moves:
            return False
        size = t.size[s]
        need = alloc_size(SSD, size)
        off = ssd.take(need)
        lru = state.ssd_lru.get(seg.node_id)
        while off < 0 and lru is not None and lru.oldest():
            self._eviction.evict(lru.oldest(), tier=SSD)
            off = ssd.take(need)
        if off < 0:
            state.counts.demotion_failures += 1
            return False
        self._pins.hold(s)
        state.ledger.demotion_started(t.space[s])
        key = t.key_of[s]
        assert key is not None
        state.moves[s] = Move(DEMOTE, s | t.gen[s] << SLOT_BITS, ssd.handle(off))
        state.move_queue.append(TierMove(DEMOTE, seg.node_id, key, size, t.checksum[s],
                                         t.where[s] & OFFSET_MASK, off))
        self._queued()
        return True

    # -- the node's answer --------------------------------------------------------

    def finish_tier_move(self, move: TierMove, code: Code) -> None:
        """MasterCore.finish_tier_move."""
        state = self._state
        t = self._t
        s = t.index.get(move.key)
        m = state.moves.get(s) if s is not None else None
        if s is None or m is None or m.kind != move.kind or t.slot_of(m.token) != s:
            # The object went (removed, lost with its node) while moving. A demotion the
            # node carried out left a file under this move's reservation, which nothing
            # else will ever free: tell the node to drop it (the node skips the drop if
            # the key has been demoted again since, under another reservation). Its
            # destination, held since the object went, is free again: the copy is over.
            state.quarantine.release(move_tag(move.key))
            if move.kind == DEMOTE and code == Code.OK and state.journal is not None:
                state.journal_range(move.node_id, SSD, move.key, move.ssd_offset, move.size,
                                    move.checksum, False)
            return
        del state.moves[s]
        dest = state.segments.by_id.get(m.dest >> OFFSET_BITS)
        size = t.size[s]
        demotion = move.kind == DEMOTE
        self._pins.end_hold(s)
        if demotion:
            state.ledger.demotion_ended(t.space[s])
        c = state.counts
        if code == Code.OK and dest is not None:
            if state.journal is not None:
                state.journal_replicas(s, move.key, False)
            state.free_replicas(t.handles(s), t.extent(s))
            t.room.pop(s, None)  # the new copy was allocated for the value alone
            state.set_replicas(s, (m.dest,), state.footprint((m.dest,), size))
            if state.journal is not None:
                state.journal_replicas(s, move.key, True)
            if demotion:
                c.demotions += 1
                c.demoted_bytes += size
            else:
                c.promotions += 1
                c.promoted_bytes += size
            self._pins.settle(s)
            return
        state.free_replicas((m.dest,), size)
        if demotion:
            c.demotion_failures += 1
        else:
            c.promotion_failures += 1
        bad_copy = not demotion and code in (Code.CORRUPT, Code.NOT_FOUND)
        if t.pins[s] == 0:
            self._pins.settle(s)
            if demotion or bad_copy:
                # The demotion was an eviction: finish it by dropping the object.
                self._eviction.evict(s)
                self._eviction.flush()
        elif bad_copy:
            state.drop(s)  # readers under a lease get NOT_FOUND, never bad bytes
