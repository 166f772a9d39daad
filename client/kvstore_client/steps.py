"""The steps a flow yields, and what each step's value is.

Every operation is a generator (`Flow`) that yields these steps and receives each
step's result; it does no I/O and reads no clock of its own (the client's clock comes in
through the state). A driver (client.py: blocking calls; aio.py: coroutines) runs the
steps its own way, so both clients behave identically by construction: the idea of
h11's sans-I/O state machine. A step that fails is thrown into the flow as its
KVStoreError.

- `Rpc`: a control call to the master, waited for; `Ask` sends one and goes on, and
  `Answer` waits for its reply (the same value and errors as an Rpc's).
- `Later`: a control call nobody waits for; its reply is handed to `then` before the
  client's next control call, or at once on `Settle`.
- `Start`: submit a batch of transfers and go on (the value is its Ticket); `Finish`
  waits for it; `Move` is both at once. The value of Finish and Move is, per store
  node, its failure. Whatever ends a flow, the driver finishes every started batch
  before the call returns: nothing a call started still moves.
- `Release`: a lease release nobody waits for (the lease expires on its own if lost).
- `Wait`: sleep this long (the driver sleeps; a flow never does).

`shard`: which master shard a control step goes to (0, the only one, in a cluster of
one shard). A flow of one shard's keys never says; the fan-out of a batch over several
shards (sharded.py) tags each step of a shard's part with its shard.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any, TypeVar

from kvstore.errors import KVStoreError
from kvstore_client.datapath import Plan, Target, Ticket

T = TypeVar("T")

@dataclass(slots=True)
class Rpc:
    method: str
    request: Any
    shard: int = 0


@dataclass(slots=True)
class Move:
    plan: Plan
    write: bool


@dataclass(slots=True)
class Start:
    """Submit a batch of transfers and go on at once; the value is its Ticket. Targets in
    `dead` failed earlier in the same call and are not tried again. `at_once`: submit a
    small batch now too (see DataPath.start_transfers)."""

    plan: Plan
    write: bool
    dead: dict[Target, KVStoreError] | None = None
    at_once: bool = False


@dataclass(slots=True)
class Finish:
    """Wait for a started batch; the value is, per target node, its failure."""

    ticket: Ticket


@dataclass(slots=True)
class Ask:
    """Send a control request and go on at once; the value is what `Answer` takes."""

    method: str
    request: Any
    shard: int = 0


@dataclass(slots=True)
class Answer:
    """Wait for the reply to an `Ask`: the same value (and errors) as an Rpc step's."""

    asked: Any


@dataclass(slots=True)
class Later:
    """Send a control request and go on; `then` gets its reply, or None if it failed,
    some time before the client's next control call (the flow never waits for it)."""

    method: str
    request: Any
    then: Callable[[Any], None]
    shard: int = 0


@dataclass(slots=True)
class Settle:
    """Hand over the reply of a Later step still unread (the driver reads it now)."""


@dataclass(slots=True)
class Release:
    """A lease released without waiting; `keep_first` > 0: only what it pinned beyond its
    first `keep_first` keys (ReleaseLease's keep_first_n)."""

    lease_id: int
    shard: int = 0
    keep_first: int = 0


@dataclass(slots=True)
class Wait:
    seconds: float


Step = Rpc | Ask | Answer | Later | Settle | Move | Start | Finish | Release | Wait
Flow = Generator[Step, Any, T]

