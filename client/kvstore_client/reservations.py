"""Space a client started ahead, so that a put costs one control call instead of two.

A plain put is PutStart (the master allocates ranges), the transfer, PutEnd. With
reservations the client has already started objects under *placeholder* keys of its own
(`~put/<writer>/<n>`, PENDING at the master, invisible to readers): a put writes its
bytes into placeholders of the right sizes, then one PutCommit renames each placeholder
to its key and commits it with its checksum. The PutStart that replaces the used
placeholders is sent right after the commit and its reply read before the next control
call (or, in the asyncio client, by a task of its own): the master answers it while the
caller does something else.

Why this is safe:
- A placeholder is the writer's (a named writer, checked by the master), so nobody else
  commits or revokes it; the master refuses a commit whose size is not the
  placeholder's.
- A placeholder is written only while young: at most `max_age` seconds (and half the
  master's put timeout) after its PutStart was sent. Older ones are revoked, never
  written: the master reclaims PENDING objects after its put timeout and may give their
  ranges to someone else.
- Whatever the master did meanwhile (reclaimed it, lost its node, a new leader knows
  nothing of it), the commit answers NOT_FOUND and the bytes are put again the plain
  way. A stale write into ranges that a new leader gave away could only corrupt
  bytes there, which readers' checksums turn into misses, as for a plain put whose
  transfer outlived the leader that started it.
- A key already stored leaves its placeholder PENDING and this client's: it goes back
  to the pool and is written again next time.
- The leader sets aside room after each placeholder's value, where the put appends its
  put record (key, size, checksum; kvstore/put_record.py) in the same transfer: the
  commit's OK then waits for no store node (docs/durability.md, section 1).

The pool is bounded by `budget` bytes; a batch larger than half of it goes the plain
way. It keeps, per (size, replicas), DEPTH times as many placeholders as the last batch
of that shape used: a put takes placeholders granted before the previous put, so the
refill asked after the previous put has the whole transfer to arrive, and its reply is
already waiting when the commit is sent. A steady stream of same-shaped batches (vLLM's
KV blocks) always finds them. Small batches (single puts) refill up to REFILL_TO
placeholders at once when they run low, so that their PutStart, and the intents it
sends to the node, are shared by many puts.

Several master shards (docs/scaling.md): a placeholder and the key it becomes must be
one shard's, since only that shard's leader knows either and each refuses a call naming
another's. So a client of several shards keeps one pool per shard, each asked of and
committed at its own shard, and names each pool's placeholders so that they route there:
`names` skips the numbers whose placeholder (as the masters store it, under the tenant's
prefix) hashes to another shard. The numbers of one writer's pools are then disjoint
without any coordination between them. The client's budget is split evenly between the
pools, as each shard owns an even part of every node's segment.
"""

from __future__ import annotations

import math
from collections import Counter, deque
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import count, repeat
from typing import Any

from kvstore.errors import Code
from kvstore.rpc.columns import MalformedReply, placed
from kvstore.shards import shard_of
from kvstore_client.clock import MONOTONIC, Clock

DEFAULT_BUDGET = 32 << 20  # bytes of placeholders a client holds at most
# Batches' worth of placeholders kept per shape: a put takes what was granted before the
# last one, so the refill asked after the last put is still free to arrive meanwhile.
DEPTH = 2
# A shape whose DEPTH batches are fewer placeholders than this is refilled up to this
# many at once, when it runs below DEPTH batches: a stream of single puts then asks
# once per that many puts, not once per put (each ask is a control call and a delta to
# the node for the master).
REFILL_TO = 16
MAX_AGE = 5.0  # seconds after its PutStart was sent that a placeholder is still written
PREFIX = b"~put/"

Shape = tuple[int, int]  # (size, replicas)


def names(writer: str, shard: int = 0, shards: int = 1, route: bytes = b"") -> Iterator[bytes]:
    """The placeholder keys of `writer`'s pool for shard `shard` of `shards`, in the
    order the pool uses them: `~put/<writer>/<n>` for n = 1, 2, ..., skipping each n
    whose key, after `route` (the tenant's key prefix, which the masters store it
    under), is another shard's. With one shard, every n."""
    base = PREFIX + writer.encode() + b"/"
    if shards <= 1:
        return (base + b"%d" % n for n in count(1))
    return _routed(base, shard, shards, route)


def _routed(base: bytes, shard: int, shards: int, route: bytes) -> Iterator[bytes]:
    for n in count(1):
        name = base + b"%d" % n
        if shard_of(route + name, shards) == shard:
            yield name


@dataclass(slots=True)
class Reserved:
    """One placeholder: its key, size, where its replicas sit, and until when (on the
    client's clock) it may be written."""

    key: bytes
    size: int
    epoch: int
    placement: int
    locations: list[tuple[tuple[str, str], int]]  # ((segment, node id), addr) per replica
    usable_until: float
    room: int = 0  # bytes after the value for its put record (kvstore/put_record.py)


class Reservations:
    __slots__ = ("_asked", "_cool", "_epoch", "_last", "_names", "_pool",
                 "_unsettled", "budget", "clock", "held", "max_age", "stale")

    def __init__(self, writer: str, budget: int = DEFAULT_BUDGET,
                 max_age: float = MAX_AGE, clock: Clock = MONOTONIC,
                 shard: int = 0, shards: int = 1, route: bytes = b"") -> None:
        """A pool of `budget` bytes; on a cluster of several master shards, the pool of
        shard `shard` of `shards`, its placeholders named to route there under `route`,
        the client's key prefix (see `names`)."""
        if budget < 0:
            raise ValueError(f"reservation budget must be >= 0 bytes, got {budget}")
        self.budget = budget
        self.max_age = max_age
        self.clock = clock
        self.held = 0  # bytes in the pool and asked for
        self._pool: dict[Shape, deque[Reserved]] = {}
        self._asked: Counter[Shape] = Counter()  # placeholders asked for, not answered yet
        self._names = names(writer, shard, shards, route)
        self._epoch = 0  # of the placeholders in the pool
        self._cool: dict[Shape, float] = {}  # shape -> not asked for again before then
        self._last: tuple[int, set[int]] = (0, set())  # the previous put: replicas, sizes
        self.stale: list[bytes] = []  # placeholders never to be written again: to revoke
        # Placeholders lost with writes that may still land: revoked as unsettled.
        self._unsettled: list[bytes] = []

    def __len__(self) -> int:
        return sum(len(q) for q in self._pool.values())

    def take(self, sizes: list[int], replicas: int, epoch: int = 0) -> list[Reserved] | None:
        """One young placeholder per size, or None (and nothing taken) if the pool lacks
        any: a batch goes one way or the other as a whole. `epoch`: the newest leader
        epoch the client has seen; placeholders of an older leader are dropped first."""
        if not self.budget:
            return None
        if epoch > self._epoch:
            self._forget_older(epoch)
        now = self.clock.now()
        need = Counter(sizes)
        for size, n in need.items():
            q = self._pool.get((size, replicas))
            if q is None:
                return None
            self._age_out(q, now)
            if len(q) < n:
                return None
        if len(need) == 1:  # one size (KV blocks): the queue's head, in one go
            q = self._pool[(sizes[0], replicas)]
            out = [q.popleft() for _ in sizes]
        else:
            pool = self._pool
            out = [pool[(size, replicas)].popleft() for size in sizes]
        self.held -= sum(r.size * len(r.locations) for r in out)
        return out

    def give_back(self, r: Reserved, replicas: int) -> None:
        """A placeholder still PENDING and this client's (its key was already stored)."""
        if r.usable_until <= self.clock.now():
            self.stale.append(r.key)
            return
        self._pool.setdefault((r.size, replicas), deque()).append(r)
        self.held += r.size * len(r.locations)

    def lost(self, r: Reserved, unsettled: bool = False) -> None:
        """A placeholder whose transfer failed: never written again, revoked
        (`unsettled`: as one whose bytes may still land, see kvstore.errors.Unsettled)."""
        (self._unsettled if unsettled else self.stale).append(r.key)

    def take_unsettled(self) -> list[bytes]:
        """The placeholders lost as unsettled since the last call: to revoke so."""
        out, self._unsettled = self._unsettled, []
        return out

    def asking(self) -> bool:
        """Whether placeholders were asked for and not answered yet."""
        return any(self._asked.values())

    def wanted(self, sizes: list[int], replicas: int) -> list[tuple[bytes, int]] | None:
        """(placeholder, size) to ask for so that the pool covers DEPTH batches of these
        sizes; None when it already does or that is over the budget. Only sizes the
        previous put had too are asked for: a stream of same-sized values (KV blocks)
        gets placeholders from its second put on, values of varied sizes never hold
        any. What is returned counts as held from now on (see `granted`)."""
        copies = max(replicas, 1)  # 0: the master's default, 1 at least
        counts = Counter(sizes)
        last, self._last = self._last, (replicas, set(counts))
        if not self.budget or not sizes or DEPTH * sum(sizes) * copies > self.budget:
            return None
        out: list[tuple[bytes, int]] = []
        for size, n in counts.items():
            if last[0] != replicas or size not in last[1]:
                continue  # not in the previous put: sizes that do not repeat get none
            shape = (size, replicas)
            if self._cool and self._cool.get(shape, 0.0) > self.clock.now():
                continue  # refused lately (see granted)
            have = len(self._pool.get(shape, ())) + self._asked[shape]
            missing = DEPTH * n - have
            if missing <= 0:
                continue
            if REFILL_TO - have > missing and \
                    self.held + (REFILL_TO - have) * size * copies <= self.budget:
                missing = REFILL_TO - have  # small batches: refill in one go (REFILL_TO)
            need = missing * size * copies
            if self.held + need > self.budget:
                self._shrink(need)
                if self.held + need > self.budget:
                    continue
            self._asked[shape] += missing
            self.held += need
            named = self._names
            out += [(next(named), size) for _ in range(missing)]
        return out or None

    def granted(self, asked: list[tuple[bytes, int]], replicas: int, reply: Any,
                sent_at: float) -> None:
        """The master's answer to the PutStart of `asked` (None: it never came): OK items
        join the pool; the rest were not started (or may have been: revoked)."""
        copies = max(replicas, 1)
        sizes = Counter(size for _key, size in asked)
        for size, n in sizes.items():
            self._asked[(size, replicas)] -= n
            self.held -= size * n * copies
        cols = None
        if reply is not None and reply.HasField("columns"):
            try:
                cols = placed(reply.columns, len(asked))
            except MalformedReply:
                reply = None
        if reply is None or reply.epoch < self._epoch or \
                (cols is None and len(reply.items) != len(asked)):
            # Unknown whether the master started them (or a deposed leader did): revoking
            # is harmless either way.
            self.stale += [key for key, _ in asked]
            return
        if reply.epoch > self._epoch:
            self._forget_older(reply.epoch)
        timeout = reply.put_timeout or 0.0
        until = sent_at + min(self.max_age, timeout / 2 if timeout else self.max_age)
        epoch = reply.epoch
        room = reply.record_room  # 0 from a master that set none aside: write no record
        pool, ok, held = self._pool, Code.OK, 0
        last, q = -1, deque[Reserved]()  # the queue of the size met last (usually one)
        # Per placeholder: (code, placement, ((segment, node id), addr) per replica).
        answers: Any = (zip(repeat(ok), *cols) if cols is not None else  # all placed
                        ((item.code, item.placement,
                          [((loc.segment, loc.node_id), loc.addr) for loc in item.locations])
                         for item in reply.items))
        for (key, size), (code, placement, where) in zip(asked, answers, strict=True):
            if code == ok and where and (not replicas or len(where) == replicas):
                if size != last:
                    last = size
                    q = pool.setdefault((size, replicas), deque())
                q.append(Reserved(key, size, epoch, placement, where, until, room))
                held += size * len(where)
            else:
                if code == ok:
                    self.stale.append(key)  # fewer replicas than asked: not used, freed
                # Refused (no free space, too few nodes): not asked again for a while, or
                # every put of a full store would cost the master a refused PutStart.
                self._cool[(size, replicas)] = self.clock.now() + self.max_age
        self.held += held

    def expired(self) -> list[bytes]:
        """Move every placeholder past its age to `stale` and return (and clear) it."""
        now = self.clock.now()
        for q in self._pool.values():
            self._age_out(q, now)
        out, self.stale = self.stale, []
        return out

    def drain(self) -> list[bytes]:
        """Every placeholder held (the client closes): to revoke."""
        for q in self._pool.values():
            self._age_out(q, math.inf)
        out, self.stale = self.stale, []
        return out

    def _forget_older(self, epoch: int) -> None:
        """A new leader knows none of an older one's placeholders: drop them (nothing to
        revoke; writing them could hit ranges the new leader gave away)."""
        self._epoch = epoch
        for q in self._pool.values():
            for r in [r for r in q if r.epoch != epoch]:
                q.remove(r)
                self.held -= r.size * len(r.locations)

    def _age_out(self, q: deque[Reserved], now: float) -> None:
        """Discard the placeholders of q no longer usable at `now` (oldest first)."""
        while q and q[0].usable_until <= now:
            self._discard(q.popleft())

    def _discard(self, r: Reserved) -> None:
        self.held -= r.size * len(r.locations)
        self.stale.append(r.key)

    def _shrink(self, need: int) -> None:
        """Make room for `need` bytes: revoke placeholders of other shapes, largest
        first (the batch that asks now is the one the caller makes)."""
        for shape in sorted(self._pool, key=lambda s: -s[0] * s[1]):
            q = self._pool[shape]
            while q and self.held + need > self.budget:
                self._discard(q.pop())
            if self.held + need <= self.budget:
                return
