"""Pins: the only writer of pin counts, and the glue between leases and objects.

A COMPLETE object's pin count (ObjectTable.pins) says whether it may be evicted,
moved or re-allocated; its phase (PENDING, COMPLETE) is ObjectTable's to write, and
the moves between both are lifecycle.py's table. Every pin count is written here, for
one of three reasons:
  * commit and adopt: a PENDING object becomes COMPLETE (or a node's object is
    recorded as COMPLETE) with no pins, at the recent end of its LRU;
  * leases: a lookup or a read pins each object once per lease position, and the
    lease's release, trim or expiry unpins it (leases.py only records the tokens);
  * tier moves: a move holds a synthetic pin, so nothing evicts or re-allocates the
    object while a node copies it (tiers.py).
An object with pins is off its LRU, and its DRAM counts as pinned in the ledger, so
this module is also where objects join and leave the LRU lists when pinned.
"""

from __future__ import annotations

from collections.abc import Iterable

from .leases import Lease
from .objects import SLOT_BITS, SLOT_MASK
from .state import CoreState

# The most pins one round of lease expiry unpins (a tick, or MasterCore.expire_leases):
# leases that many clients never released must not hold the master for one long stretch.
EXPIRE_PINS = 1024


class Pins:
    def __init__(self, state: CoreState) -> None:
        self._state = state
        self._t = state.objects
        self._lru = state.lru
        self._ledger = state.ledger

    # -- objects becoming COMPLETE ------------------------------------------------

    def commit(self, done: list[int]) -> None:
        """PENDING slots (touched already) become COMPLETE with no pins."""
        if not done:
            return
        t = self._t
        pins = t.pins
        for s in done:
            pins[s] = 0
        t.complete(done)
        # What one push per object would do: none of these was on the LRU (PENDING
        # objects never are, and they are all in DRAM).
        self._lru.push_all(done)
        state = self._state
        if state.journal is not None:
            key_of = t.key_of
            for s in done:
                state.journal_replicas(s, key_of[s], True)  # type: ignore[arg-type]
        size = t.size
        space = t.space
        self._ledger.committed(sum([space[s] for s in done]), sum([size[s] for s in done]))

    def adopt(self, s: int) -> None:
        """A slot just indexed for an object a node already holds: COMPLETE, no pins."""
        t = self._t
        self._state.grow_lrus()
        t.pins[s] = 0
        t.complete([s])
        self._state.lru_of(s).push(s)
        self._ledger.adopted(t.size[s])

    # -- leases -------------------------------------------------------------------

    def pin(self, slots: list[int], now: float) -> list[int]:
        """Pin each slot (all COMPLETE) once; returns their tokens in order."""
        t = self._t
        pins = t.pins
        gen = t.gen
        touched = t.touched
        tokens: list[int] = []
        token = tokens.append
        newly: list[int] = []
        for s in slots:
            p = pins[s]
            if p == 0:
                newly.append(s)
            pins[s] = p + 1
            touched[s] = now
            token(s | gen[s] << SLOT_BITS)
        if newly:
            state = self._state
            if state.tiered or state.ssd_lru:
                for s in newly:
                    state.lru_of(s).unlink(s)
            else:
                self._lru.unlink_all(newly)
            space = t.space
            self._ledger.pinned_now(sum([space[s] for s in newly]))
        return tokens

    def touch(self, slots: list[int], now: float) -> None:
        """A read without a pin: each slot becomes the most recently used (a pinned one,
        off the LRU, goes to its end when its last pin goes)."""
        t = self._t
        pins = t.pins
        touched = t.touched
        state = self._state
        lru_of = state.lru_of if state.tiered or state.ssd_lru else None
        for s in slots:
            touched[s] = now
            if pins[s] == 0:
                (self._lru if lru_of is None else lru_of(s)).touch(s)

    def unpin(self, tokens: Iterable[int]) -> None:
        t = self._t
        pins = t.pins
        gen = t.gen
        freed: list[int] = []
        for token in tokens:
            s = token & SLOT_MASK
            if gen[s] != token >> SLOT_BITS:
                continue  # force-removed or lost with its node since it was pinned
            p = pins[s] - 1
            pins[s] = p
            if p == 0:
                freed.append(s)
        if freed:
            state = self._state
            if state.tiered or state.ssd_lru:
                for s in freed:
                    state.lru_of(s).push(s)
            else:
                self._lru.push_all(freed)
            space = t.space
            self._ledger.unpinned(sum([space[s] for s in freed]))

    def grant(self, holder: str, keys: list[bytes], slots: list[int], ttl: float, now: float,
              owner: str) -> Lease:
        """Pin the slots under a new lease naming `keys` (one per slot, in order)."""
        tokens = self.pin(slots, now)
        lease = self._state.leases.grant(holder, keys, tokens, ttl, now, owner)
        self._state.counts.leases_granted += 1
        return lease

    def release(self, lease_id: int, keep_first_n: int | None, now: float,
                owner: str | None) -> None:
        leases = self._state.leases
        if keep_first_n is None:
            lease = leases.release(lease_id, now, owner)
            self.unpin(lease.tokens)
            self._state.counts.leases_released += 1
        else:
            self.unpin(leases.trim(lease_id, keep_first_n, now, owner))

    def expire(self, now: float, pins: int | None = None) -> int:
        """Unpin what the leases past their deadline pinned (with `pins`: about that many
        pins' worth, see LeaseTable.expire); returns how many leases expired."""
        n = 0
        for lease in self._state.leases.expire(now, pins):
            self.unpin(lease.tokens)
            n += 1
        self._state.counts.leases_expired += n
        return n

    # -- tier moves ---------------------------------------------------------------

    def hold(self, s: int, now: float | None = None) -> None:
        """A move's synthetic pin on COMPLETE object s (`now`: touch it too)."""
        t = self._t
        p = t.pins[s]
        if p == 0:
            self._state.lru_of(s).unlink(s)
            self._ledger.pinned_now(t.space[s])
        t.pins[s] = p + 1
        if now is not None:
            t.touched[s] = now

    def end_hold(self, s: int) -> int:
        """Take back a move's synthetic pin; returns the pins left. An object left with
        none goes back on an LRU only when the caller says (settle), once its replicas
        are where the move left them: which LRU depends on its tier."""
        t = self._t
        p = t.pins[s] - 1
        t.pins[s] = p
        if p == 0:
            self._ledger.unpinned(t.space[s])
        return p

    def settle(self, s: int) -> None:
        """Put s on its tier's LRU if nothing pins it."""
        if self._t.pins[s] == 0:
            self._state.lru_of(s).push(s)
