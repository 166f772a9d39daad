"""What a client holds besides its control channel: `ClientState`, and the `Lease` a
lookup hands out.

The state is the flows' one argument: the data path (datapath.py, which it extends),
the staging buffer, the registered memory, the placements early reads remember, the
space started ahead for puts, the newest leader epoch seen, the counters, and the clock
every flow reads its time from (clock.py; `ManualClock` in tests).
"""

from __future__ import annotations

import contextlib
import itertools
import secrets
import uuid
from dataclasses import dataclass, field
from typing import Any

from kvstore.coord.layout import Layout
from kvstore.errors import InvalidArgument, KVStoreError
from kvstore.transfer import Transfer
from kvstore_client.buffers import DEVICE_MEMORY, Dest, Regions, buffer_address, on_device
from kvstore_client.clock import MONOTONIC, Clock
from kvstore_client.control import from_stale_leader
from kvstore_client.datapath import DataPath
from kvstore_client.local import LocalSegments
from kvstore_client.misuse import WrongLeaseContext
from kvstore_client.placements import DEFAULT_CAPACITY, Placements
from kvstore_client.records import RecordArea
from kvstore_client.reservations import DEFAULT_BUDGET, Reservations
from kvstore_client.staging import Staging
from kvstore_client.stats import ClientStats

DEFAULT_PLACEMENTS = DEFAULT_CAPACITY  # objects whose placement a client remembers
DEFAULT_RESERVE = DEFAULT_BUDGET  # bytes of space a client starts ahead for its puts
DEFAULT_TIMEOUT = 10.0  # seconds: ClientOptions.timeout's default
HELD_LEASES = 4096  # leases over several shards held before expired ones are forgotten


@dataclass(frozen=True, slots=True)
class LeasePart:
    """One master shard's lease within a Lease over several shards."""

    id: int
    epoch: int  # of the shard's leader that granted it
    expires_at: float


@dataclass
class Lease:
    """Pins on the first `count` keys of a lookup. Release it (or leave the `with`: a
    plain `with` for a KVStoreClient's lease, `async with` for an AsyncKVStoreClient's)
    once loaded; it expires by itself at `expires_at` (on the client's clock: this host's
    time.monotonic()). After a release `keys` still says what it pinned (`id` is 0);
    after `release(keep_first=n)`, the n keys still pinned.

    In a cluster of several master shards the keys' pins are held by each of their
    shards: `parts` maps a shard to its own lease there (docs/scaling.md, "One Lease over
    several shards") and `expires_at` is the earliest of theirs. `id` is then the
    client's own name for the whole (no master's id; 0 once released): a Lease rebuilt
    from it, as an adapter does, finds its parts again in the client that made it
    (`ClientState.shard_leases`)."""

    id: int
    keys: list[bytes]
    expires_at: float
    _client: Any = field(default=None, repr=False)
    _clock: Clock = field(default=MONOTONIC, repr=False, compare=False)
    parts: dict[int, LeasePart] | None = field(default=None, repr=False)

    @property
    def count(self) -> int:
        return len(self.keys)

    @property
    def expired(self) -> bool:
        return self._clock.now() > self.expires_at

    def __enter__(self) -> Lease:
        self._check_with(asynchronous=False)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._client is not None and self.id:
            with contextlib.suppress(KVStoreError):  # it expires on its own
                self._client.release(self)

    async def __aenter__(self) -> Lease:
        self._check_with(asynchronous=True)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._client is not None and self.id:
            with contextlib.suppress(KVStoreError):
                await self._client.release(self)

    def _check_with(self, asynchronous: bool) -> None:
        """A lease is released by the client that made it, in that client's kind of
        `with`: a plain `with` cannot await an asyncio client's release, and an `async
        with` cannot await a blocking one's."""
        client = self._client
        if client is None or client.is_async == asynchronous:
            return
        if client.is_async:
            raise WrongLeaseContext("this lease comes from an AsyncKVStoreClient: use "
                                    "`async with` (a plain `with` could not release it)")
        raise WrongLeaseContext("this lease comes from a KVStoreClient: use a plain `with`, "
                                "not `async with`")


class ClientState(DataPath):
    """Everything a client holds except its control channel."""

    def __init__(self, transfer: Transfer, staging: Staging, local: LocalSegments,
                 writer_id: str, replicas: int, placements: Placements | None = None,
                 reserve_bytes: int = 0, clock: Clock = MONOTONIC,
                 timeout: float = DEFAULT_TIMEOUT) -> None:
        super().__init__(transfer, local, ClientStats(), clock)
        # The client's `timeout` (ClientOptions): what a flow that waits for the cluster
        # itself (a put while no store node has mounted) may spend of one call.
        self.timeout = timeout
        self.placements = placements if placements is not None else Placements(clock=clock)
        # Space started ahead for puts (reservations.py): shard 0's pool (the only one
        # with one shard); each other master shard's is in `pools` (see `shard_pools`).
        self.reservations = (Reservations(writer_id, reserve_bytes, clock=clock)
                             if reserve_bytes else None)
        self.pools: dict[int, Reservations] = {}
        self._pools_for: tuple[int, bytes] = (1, b"")  # (shards, key prefix) they route by
        # The newest leader epoch the driver has seen: replies of older ones are refused,
        # and space started ahead under an older leader is never written. Of shard 0;
        # each other master shard has its own, in `epochs` (one says nothing of another).
        self.epoch = 0
        self.epochs: dict[int, int] = {}
        # The staging buffers of the other shards' parts of a put_many or get_many over
        # several shards (their flows run side by side; see sharded.py).
        self.stagings: dict[int, Staging] = {}
        # Leases over several shards this client holds: their id -> their parts.
        self.shard_leases: dict[int, dict[int, LeasePart]] = {}
        # What the masters put before this client's keys (its token's tenant, b"team-a/";
        # b"" without one): on several shards a key's shard is that of the key as stored,
        # so the client routes this prefix and the key (learned at the first connect).
        self.key_prefix = b""
        self._lease_names = itertools.count(secrets.randbits(48) + 1)
        self.staging = staging
        self.records = RecordArea(transfer)
        self.writer_id = writer_id
        self.replicas = replicas
        self.regions = Regions()

    def current(self, reply: Any, shard: int = 0) -> bool:
        """Whether a reply comes from the newest leader seen (not a standby's, not a
        deposed leader's) of its shard; if so, its epoch becomes the newest seen."""
        if shard:
            if from_stale_leader(reply, self.epochs.get(shard, 0)):
                return False
            self.epochs[shard] = reply.epoch
            return True
        if from_stale_leader(reply, self.epoch):
            return False
        self.epoch = reply.epoch
        return True

    def epoch_of(self, shard: int) -> int:
        """The newest leader epoch seen of shard `shard` (0: none yet)."""
        return self.epochs.get(shard, 0) if shard else self.epoch

    def reservations_of(self, shard: int) -> Reservations | None:
        """Shard `shard`'s pool of space started ahead (None: puts there go the plain
        way)."""
        return self.pools.get(shard) if shard else self.reservations

    def all_pools(self) -> list[tuple[int, Reservations]]:
        """Every shard's pool, by shard."""
        first = [(0, self.reservations)] if self.reservations is not None else []
        return first + sorted(self.pools.items())

    def shard_pools(self, shards: int, key_prefix: bytes) -> None:
        """One pool per master shard for a cluster of `shards` (reservations.py: a
        placeholder must be its key's shard's), each named to route to its shard under
        `key_prefix` and holding an even share of the budget. Done once, when the
        client first learns the shard count, before any put; a later call for the same
        cluster keeps the pools and what they hold."""
        if (shards, key_prefix) == self._pools_for or self.reservations is None:
            return
        first = self.reservations
        self._pools_for = (shards, key_prefix)
        share = first.budget // max(shards, 1)
        made = [Reservations(self.writer_id, share, first.max_age, first.clock, k, shards,
                             key_prefix) for k in range(max(shards, 1))]
        self.reservations = made[0]
        self.pools = dict(enumerate(made[1:], start=1))

    def hold_lease(self, parts: dict[int, LeasePart]) -> int:
        """Name a lease over several shards (its parts), for `shard_leases`; leases long
        expired are forgotten meanwhile (a lease nobody released)."""
        held = self.shard_leases
        if len(held) >= HELD_LEASES:
            now = self.now()
            for name in [n for n, ps in held.items()
                         if all(p.expires_at < now for p in ps.values())]:
                del held[name]
        name = next(self._lease_names)
        held[name] = parts
        return name

    def staging_of(self, shard: int, shards: int) -> Staging:
        """The staging buffer for shard `shard`'s part of a batch over several shards:
        shard 0's is the client's own; the others' are made at first use, a share of its
        size each (one grows for an object larger than it)."""
        if not shard:
            return self.staging
        staging = self.stagings.get(shard)
        if staging is None:
            staging = self.stagings[shard] = Staging(self.transfer,
                                                     self.staging.size // max(shards, 1))
        return staging

    @classmethod
    def build(cls, etcd: str | None, layout: Layout, buffer_size: int, host: str, protocol: str,
              device: str, same_host: bool, replicas: int,
              timeout: float | None = None,
              placement_memory: int = DEFAULT_CAPACITY,
              reserve_bytes: int = DEFAULT_RESERVE, clock: Clock = MONOTONIC) -> ClientState:
        """A client's data side: its Transfer Engine, staging buffer and local maps.
        `timeout` bounds each transfer batch (a peer that stopped answering);
        `placement_memory` objects' placements are remembered (0: no early reads);
        up to `reserve_bytes` of space is started ahead for puts (0: none; see
        reservations.py)."""
        if reserve_bytes < 0:
            raise InvalidArgument(f"reserve_bytes must be >= 0, got {reserve_bytes}")
        transfer = Transfer(host, protocol, device, timeout=timeout)
        return cls(transfer, Staging(transfer, buffer_size),
                   LocalSegments(etcd, layout, enabled=same_host), uuid.uuid4().hex, replicas,
                   Placements(placement_memory, clock=clock), reserve_bytes, clock,
                   DEFAULT_TIMEOUT if timeout is None else timeout)

    def lease(self, lease_id: int, keys: list[bytes], expires_at: float) -> Lease:
        """A lease on this state's clock."""
        return Lease(lease_id, keys, expires_at, _clock=self.clock)

    # -- registered memory ---------------------------------------------------------------

    def register(self, buffer: Any) -> None:
        addr, nbytes = buffer_address(buffer)  # refuses what the engine cannot move
        self.transfer.register(addr, nbytes)
        self.regions.add(addr, nbytes)
        if on_device(buffer):
            DEVICE_MEMORY.add(addr, nbytes)

    def unregister(self, buffer: Any) -> None:
        addr, nbytes = buffer_address(buffer)
        self.transfer.unregister(addr)
        self.regions.remove(addr, nbytes)
        DEVICE_MEMORY.remove(addr, nbytes)

    def dest(self, buffer: Any) -> Dest:
        return self.regions.dest(buffer)

    def close(self) -> None:
        self.local.close()
        self.staging.close()
        for staging in self.stagings.values():
            staging.close()
        self.records.close()
        self.transfer.close()
