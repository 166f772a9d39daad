"""Writes: put_start (the general path), put_end, put_commit, put_revoke, remove, and
the reclaim of PENDING objects whose writer vanished.

An object is PENDING from put_start until put_end (or put_commit) makes it COMPLETE;
readers never see it before. Placement, eviction for room, demotion and quotas are the
other collaborators' decisions; this module orders them for one key (put_one) and
keeps the writer-ownership rule (writer_may). The batch fast path is batch_put.py.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence

from kvstore.errors import Code, InvalidArgument

from .batch_put import BatchPut
from .checks import bad_object, is_checksum, is_size
from .eviction import Eviction
from .keys import bad_key_message, norm_key, norm_keys
from .lifecycle import COMPLETE, PENDING
from .objects import PendingWrite
from .pins import Pins
from .placement import place
from .quarantine import Until
from .quotas import Quotas
from .results import Event, EventKind, Location, PutStartResult
from .segments import DRAM
from .state import CoreState, Frees
from .tiers import Tiers

# Space started ahead (put_start(ahead=True)) is granted only while all PENDING space
# stays under this share of the DRAM pool: a client's pool of placeholders must never
# crowd out the writes themselves on a small store.
AHEAD_SHARE = 0.25
# The most record room a placeholder may ask for: a record of the longest key fits.
MAX_RECORD_ROOM = 2048
# Space started ahead leaves the PENDING table this long after its grant (or at the put
# timeout, if shorter), however long the put timeout is. A writer only ever writes a
# placeholder in the first half of this (the PutStart reply says so: PutStartResponse's
# put_timeout, see kvstore_client.reservations), so by then it has used it or given it
# up; but a writer that went quiet (or died, or lost its pool to a failover's retries)
# revokes its placeholders only at its next call, if ever, and they would otherwise
# show as PENDING, and count against AHEAD_SHARE, until the put timeout (tests run
# with 600 s). Their ranges stay held until the writer's next call for them or the put
# timeout (Until.WRITER), exactly as long as before: a late write lands nowhere in use.
AHEAD_TIMEOUT = 10.0


def writer_may(owner: str, writer: str) -> bool:
    """Whether `writer` may finish or revoke a PENDING object `owner` started.
    Anonymous writers ("") are trusted; two named writers must match."""
    return not writer or not owner or writer == owner


class Writes:
    def __init__(self, state: CoreState, pins: Pins, eviction: Eviction, tiers: Tiers,
                 quotas: Quotas) -> None:
        self._state = state
        self._t = state.objects
        self._pins = pins
        self._eviction = eviction
        self._tiers = tiers
        self._quotas = quotas
        self.batch = BatchPut(state)
        # Placeholders granted, in grant order: (reclaimed from, slot, its PendingWrite;
        # the slot still holds that placeholder while t.pending[slot] is that object).
        self._ahead: deque[tuple[float, int, PendingWrite]] = deque()

    def ahead_timeout(self) -> float:
        """How long a placeholder stays PENDING (see AHEAD_TIMEOUT)."""
        return min(AHEAD_TIMEOUT, self._state.config.put_timeout)

    # -- put_start ----------------------------------------------------------------

    def put_start(
        self,
        keys: Sequence[bytes],
        sizes: Sequence[int],
        checksums: Sequence[int],
        replicas: int | None,
        writer: str,
        ahead: bool,
        record_room: int = 0,
    ) -> list[PutStartResult]:
        """MasterCore.put_start."""
        state = self._state
        n = len(keys)
        if len(sizes) != n or len(checksums) != n:
            raise InvalidArgument(
                f"put_start needs one size and one checksum per key: got {n} keys, "
                f"{len(sizes)} sizes, {len(checksums)} checksums"
            )
        state.check_batch(n)
        if record_room and (not ahead or not 0 < record_room <= MAX_RECORD_ROOM):
            raise InvalidArgument(
                f"record_room is for placeholders (ahead) and at most {MAX_RECORD_ROOM} "
                f"bytes, got {record_room} (ahead={ahead})")
        config = state.config
        want = replicas if replicas else config.default_replicas
        if not 1 <= want <= config.max_replicas:
            raise InvalidArgument(
                f"replicas must be between 1 and {config.max_replicas}, got {replicas}"
            )
        now = state.clock.now()
        dram = state.dram
        want = min(want, len(dram))
        largest = max((s.alloc.capacity for s in dram), default=0)
        deadline = now + config.put_timeout
        if ahead:
            return self.put_ahead(keys, sizes, checksums, want, writer, now, deadline, largest,
                                  record_room)
        batch = self.batch.put(keys, sizes, checksums, want, writer, now, deadline, largest)
        if batch is None:
            results = self.put_each(keys, sizes, checksums, want, writer, now, deadline, largest)
        else:
            results = self.fill_batch(batch, keys, sizes, checksums, want, writer, now,
                                      deadline, largest)
        self._eviction.to_watermark(now)
        self._eviction.flush()
        return results

    def put_ahead(
        self,
        keys: Sequence[bytes],
        sizes: Sequence[int],
        checksums: Sequence[int],
        want: int,
        writer: str,
        now: float,
        deadline: float,
        largest: int,
        room: int = 0,
    ) -> list[PutStartResult]:
        """put_start(ahead=True): all of the batch from free space, or none of it."""
        state = self._state
        mask = state.align_mask
        ints = all(map(is_size, sizes))
        need = sum((z + room + mask) & ~mask for z in sizes) * want if ints else 0
        cap = state.pool_capacity
        batch = None
        if ints and cap and state.ledger.pending + need <= AHEAD_SHARE * cap \
                and state.pool_used() + need <= state.config.evict_high * cap:
            # The batch path places only what surely fits: it never evicts and never refuses.
            batch = self.batch.put(keys, sizes, checksums, want, writer, now, deadline, largest,
                                   room)
        if batch is None:
            refused = PutStartResult(Code.STORE_FULL, [], message="no free space to start "
                                     "ahead; put the values the usual way")
            return [refused] * len(keys)
        results = self.fill_batch(batch, keys, sizes, checksums, want, writer, now, deadline,
                                  largest)
        until = now + self.ahead_timeout()
        t = self._t
        index, pending, ahead = t.index, t.pending, self._ahead
        for k, r in zip(norm_keys(keys), results, strict=True):
            if r.code == Code.OK and k is not None and (s := index.get(k)) is not None \
                    and (pw := pending.get(s)) is not None:
                ahead.append((until, s, pw))
        return results

    def fill_batch(
        self,
        batch: tuple[list[PutStartResult | None], bool],
        keys: Sequence[bytes],
        sizes: Sequence[int],
        checksums: Sequence[int],
        want: int,
        writer: str,
        now: float,
        deadline: float,
        largest: int,
    ) -> list[PutStartResult]:
        """The batch path's results with the positions it left (None) answered as
        put_each would: a bad key refused, a repeat given its first occurrence's answer,
        the rest put_one's (which, for these keys, never reaches placement)."""
        made, whole = batch
        if whole:
            return made  # type: ignore[return-value]  # no None in it
        results: list[PutStartResult] = []
        seen: dict[bytes, PutStartResult] = {}
        for done, key, size, checksum in zip(made, keys, sizes, checksums, strict=True):
            k = norm_key(key)
            if done is not None:
                seen[k] = done  # type: ignore[index]  # placed, so a valid key
                results.append(done)
                continue
            if k is None:
                results.append(self.put_failed("invalid_argument", bad_key_message(key)))
                continue
            answer = seen.get(k)
            if answer is None:
                answer = seen[k] = self.put_one(k, size, checksum, want, writer, now,
                                                deadline, largest)
            results.append(answer)
        return results

    def put_each(
        self,
        keys: Sequence[bytes],
        sizes: Sequence[int],
        checksums: Sequence[int],
        want: int,
        writer: str,
        now: float,
        deadline: float,
        largest: int,
    ) -> list[PutStartResult]:
        """put_start one key at a time: the general path."""
        results: list[PutStartResult] = []
        seen: dict[bytes, PutStartResult] = {}
        for key, size, checksum in zip(keys, sizes, checksums, strict=True):
            k = norm_key(key)
            if k is None:
                results.append(self.put_failed("invalid_argument", bad_key_message(key)))
                continue
            r = seen.get(k)
            if r is None:
                r = seen[k] = self.put_one(k, size, checksum, want, writer, now, deadline, largest)
            results.append(r)
        return results

    def put_failed(self, reason: str, message: str,
                   code: Code = Code.INVALID_ARGUMENT) -> PutStartResult:
        failures = self._state.counts.put_failures
        failures[reason] = failures.get(reason, 0) + 1
        return PutStartResult(code, [], message)

    def put_one(
        self,
        key: bytes,
        size: int,
        checksum: int,
        want: int,
        writer: str,
        now: float,
        deadline: float,
        largest: int,
    ) -> PutStartResult:
        bad = bad_object(size, checksum)
        if bad is not None:
            return self.put_failed("invalid_argument", bad)
        state = self._state
        t = self._t
        s = t.index.get(key)
        if s is not None:
            return self._put_again(s, size, checksum, writer)
        dram = state.dram
        if not dram:
            return self.put_failed("no_segment", *self._no_segment())
        if t.usage is not None:
            refused = self._quotas.room(key, size, now)
            if refused is not None:
                return self.put_failed(*refused, Code.QUOTA_EXCEEDED)
        if size > largest:
            return self.put_failed(
                "too_large",
                f"object of {size} bytes is larger than the largest segment ({largest} bytes)",
                Code.STORE_FULL,
            )
        asize = (size + state.align_mask) & ~state.align_mask
        placed = place(dram, asize, want)
        if not placed and state.tiered and now >= state.hold_until \
                and self._tiers.demote_for(asize):
            # Dropping would lose objects the SSD tier has room for: make the writer
            # wait a few ms for the demotions instead.
            return self.put_failed(
                "busy", f"making room: {state.ledger.demoting} bytes are moving to SSD; "
                "retry in a few milliseconds", Code.BUSY)
        if not placed:
            placed = self._eviction.evict_for(asize, want, now)
        if not placed:
            return self.put_failed("store_full", self._full_message(now), Code.STORE_FULL)
        handles = []
        for seg, offset in placed:
            handles.append(seg.handle(offset))
        space = asize * len(placed)
        s = t.new(key, size, checksum, handles, space, now)
        if s >= len(state.lru.prev):
            state.grow_lrus()
        t.pending[s] = PendingWrite(writer, deadline)
        state.ledger.started(space, size)
        return PutStartResult(
            Code.OK,
            [Location(seg.node_id, seg.name, seg.base_addr + off, size, seg.tier) for seg, off in placed],
            placement=t.placed[s],
        )

    def _put_again(self, s: int, size: int, checksum: int, writer: str) -> PutStartResult:
        """put_start of a key already in slot s: stored, the same writer retrying a
        put_start whose reply it lost, or another write in progress."""
        t = self._t
        if t.phase[s] == COMPLETE:
            return PutStartResult(Code.ALREADY_EXISTS, [])
        owner = t.pending[s].writer
        if writer and owner == writer and t.size[s] == size and t.checksum[s] == checksum:
            return PutStartResult(Code.OK, self._state.locations(s), placement=t.placed[s])
        return self.put_failed(
            "in_progress",
            f"key is being written by {owner or 'another writer'}; retry after it "
            f"commits or after put_timeout ({self._state.config.put_timeout:g} s)",
            Code.IN_PROGRESS,
        )

    def _full_message(self, now: float) -> str:
        state = self._state
        free = max((s.alloc.largest_free() for s in state.dram), default=0)
        msg = (
            f"store full: {state.ledger.pinned} bytes pinned, {state.ledger.pending} bytes "
            f"pending, {free} bytes free in the largest free extent"
        )
        if now < state.hold_until:
            msg += (f"; eviction is held for {state.hold_until - now:.1f} s more after a "
                    "master failover")
        return msg

    def _no_segment(self) -> tuple[str, Code]:
        state = self._state
        if state.unresponsive and state.segments.tier(DRAM):
            # Retryable: a node that missed a record is taken back at its next one.
            return ("no store node with a DRAM segment answers the master (each missed its "
                    "last record: down or unreachable); retry once one is back, or add a node",
                    Code.UNAVAILABLE)
        if state.draining and state.segments.tier(DRAM):
            return ("every store node with a DRAM segment is draining; undrain one "
                    "(kvstore drain NODE --cancel) or add a node", Code.STORE_FULL)
        # Not full: nothing is there yet (a cluster starting, every node restarting).
        # Retryable, unlike StoreFull.
        return ("no store node has mounted a DRAM segment yet; retry once one has "
                "(kvstore status lists the mounted nodes)", Code.UNAVAILABLE)

    # -- commit -------------------------------------------------------------------

    def put_end(self, keys: Sequence[bytes], writer: str) -> list[Code]:
        """MasterCore.put_end. The shape of `_per_key`, written out: a call per key costs
        this hot path a quarter more time."""
        state = self._state
        state.check_batch(len(keys))
        t = self._t
        now = state.clock.now()
        index = t.index
        phase = t.phase
        pending = t.pending
        touched = t.touched
        ok, not_found, exists, in_progress = (Code.OK, Code.NOT_FOUND, Code.ALREADY_EXISTS,
                                              Code.IN_PROGRESS)
        out: list[Code] = []
        seen: dict[bytes, Code] = {}
        # Slots to commit, in key order: each key has its own slot, and a repeated key
        # is answered from `seen`, so committing them after the loop changes no answer.
        done: list[int] = []
        for k in norm_keys(keys):
            if k is None:
                out.append(Code.INVALID_ARGUMENT)
                continue
            code = seen.get(k)
            if code is None:
                s = index.get(k)
                if s is None:
                    code = not_found
                elif phase[s] != PENDING:
                    code = exists
                elif writer and not writer_may(pending[s].writer, writer):
                    code = in_progress
                else:
                    del pending[s]
                    touched[s] = now
                    done.append(s)
                    code = ok
                seen[k] = code
            out.append(code)
        self._pins.commit(done)
        state.quarantine.writer_done(keys, writer)
        return out

    def put_commit(self, placeholders: Sequence[bytes], keys: Sequence[bytes],
                   sizes: Sequence[int], checksums: Sequence[int], writer: str) -> list[Code]:
        """MasterCore.put_commit."""
        n = len(keys)
        if len(placeholders) != n or len(sizes) != n or len(checksums) != n:
            raise InvalidArgument(
                f"put_commit needs one placeholder, size and checksum per key: got {n} keys, "
                f"{len(placeholders)} placeholders, {len(sizes)} sizes, "
                f"{len(checksums)} checksums")
        state = self._state
        state.check_batch(n)
        t = self._t
        now = state.clock.now()
        index, pending, size_of = t.index, t.pending, t.size
        quotas = state.quotas
        out: list[Code] = []
        # Committed after the loop (Pins.commit), so PENDING is read from `pending`,
        # which the loop keeps current: a slot is in it exactly while it is PENDING.
        done: list[int] = []
        for pk, k, size, checksum in zip(norm_keys(placeholders), norm_keys(keys), sizes,
                                         checksums, strict=True):
            if k is None or pk is None:
                out.append(Code.INVALID_ARGUMENT)
                continue
            s = index.get(pk)
            if s is None or (pw := pending.get(s)) is None:
                out.append(Code.NOT_FOUND)
                continue
            # Placeholders are a named writer's own: no anonymous writer commits one.
            if not writer or pw.writer != writer:
                out.append(Code.IN_PROGRESS)
                continue
            if size_of[s] != size or not is_checksum(checksum):
                out.append(Code.INVALID_ARGUMENT)
                continue
            other = index.get(k)
            if other is not None:
                out.append(Code.IN_PROGRESS if other in pending else Code.ALREADY_EXISTS)
                continue
            if quotas and self._quotas.crosses(pk, k):
                # Bytes would enter a tenant with a quota without its check (put_start's).
                out.append(Code.INVALID_ARGUMENT)
                continue
            t.rename(s, k)
            t.checksum[s] = checksum
            del pending[s]
            t.touched[s] = now
            done.append(s)
            out.append(Code.OK)
        self._pins.commit(done)
        state.quarantine.writer_done(placeholders, writer)
        return out

    # -- taking objects back ------------------------------------------------------

    def put_revoke(self, keys: Sequence[bytes], writer: str, unsettled: bool = False) -> list[Code]:
        """MasterCore.put_revoke."""
        t = self._t
        drop = self._state.drop
        until = Until.TIMEOUT if unsettled else Until.NOW

        def revoke(_key: bytes, s: int) -> Code:
            if t.phase[s] != PENDING:
                return Code.ALREADY_EXISTS
            if not writer_may(t.pending[s].writer, writer):
                return Code.IN_PROGRESS
            drop(s, until=until)
            return Code.OK

        out = self._per_key(keys, revoke)
        if not unsettled:
            self._state.quarantine.writer_done(keys, writer)
        return out

    def remove(self, keys: Sequence[bytes], force: bool) -> list[Code]:
        """MasterCore.remove."""
        state = self._state
        t = self._t
        phase, pins, size_of = t.phase, t.pins, t.size
        removed: list[bytes] = []
        removed_size = 0
        # The batch's ranges, freed together at the end: a batch written together sits
        # together, and adjacent ranges then cost one free instead of one each.
        frees: Frees = {}

        def take(key: bytes, s: int) -> Code:
            nonlocal removed_size
            if (phase[s] == PENDING or pins[s]) and not force:
                return Code.IN_PROGRESS
            removed.append(key)
            removed_size += size_of[s]
            state.drop(s, frees)
            return Code.OK

        try:
            out = self._per_key(keys, take)
        finally:
            for seg, ranges in frees.items():
                seg.give_many(ranges)
        if removed:
            state.events.emit(Event(EventKind.REMOVED, removed, removed_size))
        return out

    def _per_key(self, keys: Sequence[bytes], decide: Callable[[bytes, int], Code]) -> list[Code]:
        """The answers of a verb taken key by key (put_revoke, remove; put_end has the same
        loop written out), after the batch check: INVALID_ARGUMENT for a bad key, NOT_FOUND
        for one not stored, else what decide(the key, its slot) says (and does). A key
        repeated in the batch is decided once: the repeats get its first answer."""
        self._state.check_batch(len(keys))
        index = self._t.index
        out: list[Code] = []
        seen: dict[bytes, Code] = {}
        for k in norm_keys(keys):
            if k is None:
                out.append(Code.INVALID_ARGUMENT)
                continue
            code = seen.get(k)
            if code is None:
                s = index.get(k)
                code = seen[k] = Code.NOT_FOUND if s is None else decide(k, s)
            out.append(code)
        return out

    def reclaim(self, now: float) -> int:
        """Drop the PENDING objects past their put_timeout, and the placeholders past
        the ahead timeout; returns how many."""
        state = self._state
        t = self._t
        zombies: list[int] = []
        for s, pw in t.pending.items():
            if pw.deadline > now:
                break
            zombies.append(s)
        ahead = self._ahead
        if not zombies and not (ahead and ahead[0][0] <= now):
            return 0
        keys: list[bytes] = []
        size = 0
        for s in zombies:
            keys.append(t.key_of[s])  # type: ignore[arg-type]
            size += t.size[s]
            state.drop(s, until=Until.NOW)  # past the put timeout: its writer gave up
        n = len(zombies)
        pending = t.pending
        while ahead and ahead[0][0] <= now:
            _, s, pw = ahead.popleft()
            if pending.get(s) is not pw:
                continue  # committed, revoked or dropped already
            keys.append(t.key_of[s])  # type: ignore[arg-type]
            size += t.size[s]
            # Its writer is past the time it would write it; until the writer says so
            # (its next call for the key) or the put timeout, a late write may land.
            state.drop(s, until=Until.WRITER)
            n += 1
        if not n:
            return 0
        state.counts.reclaimed += n
        state.events.emit(Event(EventKind.RECLAIMED, keys, size))
        return n
