"""The I/O the client's shared layer (session.py) leaves to a driver, one op per kind.

The shared layer yields these (and a flow's transfer steps, Start, Finish and Move,
as they are); a driver runs each and sends back its value, or throws in its error:
client.py with blocking calls, aio.py as coroutines (transfers in a worker thread).

- `Find`: the leader's record of one shard (Session.find_leader).
- `Call`, `Answer`: a control call on `control` (Control.call), or the reply to what
  Control.ask sent (Control.answer); Retry or a typed KVStoreError when they fail.
- `Close`: close a control channel the client no longer uses.
- `Sleep`: sleep this long (a backoff, a flow's Wait).
- `Drain`: wait until none of these transfer batches moves any more.
- `Quick`: a quick single get (quick.py); its value is quick.read_one's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvstore_client.buffers import Dest
from kvstore_client.control import Control
from kvstore_client.datapath import Ticket


@dataclass(slots=True)
class Find:
    shard: int = 0


@dataclass(slots=True)
class Call:
    control: Control[Any]
    method: str
    request: Any
    timeout: float
    spin: bool


@dataclass(slots=True)
class Answer:
    control: Control[Any]
    handle: Any
    method: str
    spin: bool


@dataclass(slots=True)
class Close:
    control: Control[Any]


@dataclass(slots=True)
class Sleep:
    seconds: float


@dataclass(slots=True)
class Drain:
    tickets: list[Ticket]


@dataclass(slots=True)
class Quick:
    control: Control[Any]
    key: bytes
    dest: Dest | None
    shard: int = 0
