"""The client written once: leader discovery and following, retries, connect, and every
public method, as generators of I/O steps (ops.py) that a driver runs.

A flow (flows.py) says what an operation does in steps of the client's vocabulary
(control calls, transfers, waits; steps.py). This layer runs those steps as far as it
can without I/O: it follows the leader across a failover, retries with bounded backoff,
pipelines a Later call's reply behind the next request, takes the quick single get
(quick.py), and revokes leftover placeholders on close. What remains is I/O, and it
yields that as ops: Find (the leader's record), Call and Answer on a control channel,
Close one, Sleep, the transfers (Start, Finish, Move, Drain) and Quick. `KVStoreClient`
(client.py) runs each op with a blocking call, `AsyncKVStoreClient` (aio.py) as a
coroutine; so both have the same features and the same behaviour by construction.

In a cluster of several master shards (docs/scaling.md) it holds one control channel
per shard, each following its own shard's leader (and epoch) across that shard's
failovers, and runs a batch's flow per shard side by side (sharded.py); with one shard,
the default, every call runs exactly as it did before shards.

`Io[T]` is such a generator: a driver's `_drive(io)` runs it and returns its T.
"""

from __future__ import annotations

import contextlib
from collections.abc import Generator, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

from kvstore.coord.layout import Layout, MasterRecord
from kvstore.errors import Code, KVStoreError, LeaseExpired, NotFound
from kvstore.shards import shard_of
from kvstore.v1 import master_pb2 as pb
from kvstore_client import flows, quick, sharded, steps
from kvstore_client.buffers import Dest
from kvstore_client.control import (
    Control,
    Retry,
    backoff,
    check_reply,
    discover_record,
    discover_shards,
    target,
    timed_out,
    unreachable_fast,
)
from kvstore_client.datapath import Ticket
from kvstore_client.discovery import find_key_prefix
from kvstore_client.drive import Pump
from kvstore_client.misuse import ClientClosed
from kvstore_client.ops import Answer, Call, Close, Drain, Find, Quick, Sleep
from kvstore_client.options import ClientOptions
from kvstore_client.state import ClientState, Lease
from kvstore_client.stats import ClientStats

T = TypeVar("T")
Io = Generator[Any, Any, T]  # yields ops (ops.py) and the transfer steps; returns a T


@dataclass(slots=True)
class _Asked:
    method: str
    request: Any
    control: Any
    handle: Any = None
    shard: int = 0


class Session:
    """What both clients hold and do; a driver subclasses it and runs its `Io`s."""

    # Which `with` a lease of this client takes (state.Lease checks it).
    is_async: ClassVar[bool] = False
    # For profilers (bench.vs_mooncake --phases): set on a client, it is called with a
    # phase's name as each step of a call begins ("rpc PutStart", "answer GetReplicas",
    # "start", "finish", "release"; "quick get" for a quick single get) and with None as
    # it ends. None: nothing is timed.
    phase_timer: Any = None
    _closed = False
    _control: Control[Any] | None = None
    # Per shard, a Later step's call whose reply is not read yet: a connection answers in
    # order, so it is read before that shard's next reply, and no other shard waits on it.
    _later: dict[int, tuple[_Asked, Any]]
    _state: ClientState
    # The cluster's master shards (learned at the first connect); `_control` is shard
    # 0's channel, `_others` the other shards' (made at each one's first call), and
    # `_given_up` their fast addresses given up (shard 0's: `_fast_given_up`).
    _shards = 1
    _counted = False
    # What the masters put before this client's keys (its token's tenant's prefix), which
    # a key's shard is hashed over (learned with the count; _fit_state gives it the state).
    _key_prefix = b""
    _others: dict[int, Control[Any]] | None = None
    _given_up: dict[int, str] | None = None

    def __init__(self, etcd: str | None, options: ClientOptions | None,
                 settings: dict[str, Any]) -> None:
        self.options = opts = ClientOptions.of(options, etcd, settings)
        self.etcd = opts.etcd
        self._creds = opts.credentials()
        self.timeout = opts.timeout
        self.transport = opts.transport_name()
        self._layout = Layout(opts.cluster)
        self._fixed_master = opts.master
        self._fast_given_up = ""  # a fast address that would not take connections
        self.master_address = ""  # where control calls go (the fast or the gRPC address)
        self._later = {}

    @property
    def stats(self) -> ClientStats:
        return self._state.stats

    @property
    def writer_id(self) -> str:
        return self._state.writer_id

    def register(self, buffer: Any) -> None:
        """Register memory (any contiguous buffer or a CPU torch tensor) for zero-copy
        put_from/get_into. Slices of a registered buffer are usable too."""
        self._check_open()
        self._state.register(buffer)

    def unregister(self, buffer: Any) -> None:
        self._check_open()
        self._state.unregister(buffer)

    def _check_open(self) -> None:
        if self._closed:
            raise ClientClosed(f"this client is closed; make a new {type(self).__name__} "
                               "to go on using the store")

    def _open(self, record: MasterRecord, given_up: str = "") -> Control[Any]:
        """A control channel to `record`'s master (`given_up`: its fast address, if it
        would not take connections: see control.unreachable_fast)."""
        raise NotImplementedError  # the driver's kind of control channel

    # -- the leader ----------------------------------------------------------------------

    def find_leader(self, shard: int = 0) -> MasterRecord:
        """The record of shard `shard`'s leader (blocking; the asyncio driver runs it in
        a worker thread). The one place the client learns where the masters are
        (kvstore_client.discovery: etcd, or the masters given as `master=`, asked who
        leads), and, the first time, how many shards the cluster has."""
        if not self._counted:
            self._shards = discover_shards(self.etcd, self._layout, self._fixed_master,
                                           self.timeout, self._creds)
            if self._shards > 1:
                # A key's shard is that of the key as stored, under the token's tenant.
                self._key_prefix = find_key_prefix(self.etcd, self._layout,
                                                   self._fixed_master, self.timeout,
                                                   self._creds, self._shards)
            self._counted = True
        layout = self._layout if self._shards <= 1 else \
            self._layout.for_shard(shard, self._shards)
        return discover_record(self.etcd, layout, self._fixed_master, self.timeout,
                               self._creds, shard)

    def _channel(self, shard: int) -> Control[Any] | None:
        """Shard `shard`'s control channel (None: not connected)."""
        if not shard:
            return self._control
        return self._others.get(shard) if self._others else None

    def _connect(self, shard: int = 0) -> Io[None]:
        record = yield Find(shard)
        if self._shards > 1:
            self._fit_state()
        if shard:
            yield from self._connect_other(shard, record)
            return
        control = self._control
        self._fast_given_up = unreachable_fast(control, self._fast_given_up)
        want = target(record, self.transport, self._fast_given_up)
        if control is None or (control.transport, control.address) != want:
            self._control = None
            if control is not None:
                yield Close(control)
            self._control = self._open(record, self._fast_given_up)
            self.master_address = self._control.address

    def _connect_other(self, shard: int, record: MasterRecord) -> Io[None]:
        """`_connect` for a shard other than 0: its own channel and fast address given up."""
        others = self._others if self._others is not None else {}
        given = self._given_up if self._given_up is not None else {}
        self._others, self._given_up = others, given
        control = others.get(shard)
        given[shard] = unreachable_fast(control, given.get(shard, ""))
        want = target(record, self.transport, given[shard])
        if control is None or (control.transport, control.address) != want:
            others.pop(shard, None)
            if control is not None:
                yield Close(control)
            others[shard] = self._open(record, given[shard])

    def _fit_state(self) -> None:
        """What a client of several shards holds per shard: a pool of space started
        ahead for each (a placeholder and the key it becomes must be one shard's; see
        sharded.py), and the key prefix its flows and placeholders route by."""
        state = getattr(self, "_state", None)
        if state is not None and self._shards > 1:
            state.key_prefix = self._key_prefix
            state.shard_pools(self._shards, self._key_prefix)

    def _reconnect_quietly(self, shard: int = 0) -> Io[None]:
        with contextlib.suppress(KVStoreError):  # the next attempt reports the failure
            yield from self._connect(shard)

    def _rpc(self, method: str, request: Any, spin: bool = True, shard: int = 0) -> Io[Any]:
        """One control round trip (to shard `shard`'s leader). Follows the leader across
        a failover, retrying with bounded backoff, and fails with Unavailable once
        `timeout` has passed. `spin` False: engine transfers of this call are moving, so
        the reply is waited for asleep rather than polled for."""
        if shard in self._later:
            # Sent before the Later call's reply is read (a connection answers in order):
            # the master works on this one while the client takes in that one.
            asked = yield from (self._ask(method, request, shard) if shard else
                                self._ask(method, request))
            return (yield from self._answer(asked, spin))
        st = self._state
        deadline = st.now() + self.timeout
        if (self._control if not shard else self._channel(shard)) is None:
            yield from self._connect(shard)  # no master registered: said at once
        last = "no attempt"
        for attempt in range(1 << 30):
            remaining = deadline - st.now()
            if remaining <= 0:
                break
            control = self._control if not shard else self._channel(shard)
            if control is not None:
                try:
                    reply = yield Call(control, method, request, remaining, spin)
                except Retry as exc:
                    last = str(exc)
                else:
                    if st.current(reply, shard):
                        return check_reply(reply)
                    last = f"{control.address} is not the leader"
                    st.stats.failovers += 1
            yield Sleep(backoff(attempt, deadline - st.now()))
            yield from self._reconnect_quietly(shard)
        raise timed_out(method, self.timeout, last)

    def _ask(self, method: str, request: Any, shard: int = 0) -> Io[_Asked]:
        """Send a control request without waiting (see `_answer`). A failure to send is
        not reported here: `_answer` then makes the whole call, retries included. A Later
        call's reply still unread is read after sending (replies come in order)."""
        asked = _Asked(method, request, self._control if not shard else self._channel(shard),
                       shard=shard)
        if asked.control is not None:
            with contextlib.suppress(Retry):
                asked.handle = asked.control.ask(method, request, self.timeout)
        if shard in self._later:
            yield from self._settle_later(shard)
        return asked

    def _answer(self, asked: _Asked, spin: bool = True) -> Io[Any]:
        """The reply to an `_ask`; when that attempt failed (or came from a stale
        leader), the call is made again the usual way (`_rpc`)."""
        shard = asked.shard
        control = self._control if not shard else self._channel(shard)
        if asked.handle is not None and control is asked.control and control is not None:
            try:
                reply = yield Answer(control, asked.handle, asked.method, spin)
            except Retry:
                pass
            else:
                if self._state.current(reply, shard):
                    return check_reply(reply)
                self.stats.failovers += 1
                yield from self._reconnect_quietly(shard)
        if shard:
            return (yield from self._rpc(asked.method, asked.request, spin, shard))
        return (yield from self._rpc(asked.method, asked.request, spin))

    def _send_later(self, method: str, request: Any, then: Any, shard: int = 0) -> Io[None]:
        """A Later step: sent now; its reply is read before the next control call's."""
        asked = yield from (self._ask(method, request, shard) if shard else
                            self._ask(method, request))
        if asked.handle is None:
            then(None)
        else:
            self._later[shard] = (asked, then)

    def _settle_later(self, shard: int) -> Io[None]:
        """Read the reply of shard `shard`'s Later call in flight and hand it on (None if
        it failed: nobody retries it, nobody waits for it)."""
        asked, then = self._later.pop(shard)
        reply = None
        control = self._channel(asked.shard)
        if control is not None and control is asked.control:
            try:
                got = yield Answer(control, asked.handle, asked.method, True)
            except (Retry, KVStoreError):
                pass
            else:
                if not got.error.code and self._state.current(got, asked.shard):
                    reply = got
        then(reply)

    def _release(self, lease_id: int, shard: int = 0, keep_first: int = 0) -> Io[None]:
        """Release without waiting: the lease expires on its own if this is lost. With
        `keep_first`, only what it pins beyond its first `keep_first` keys."""
        control = self._control if not shard else self._channel(shard)
        if control is not None:
            if keep_first:
                control.release(lease_id, self.timeout, keep_first)
            else:
                control.release(lease_id, self.timeout)
        return
        yield  # a generator, like every step's handler

    def _close(self) -> Io[None]:
        """Free the placeholders left, every shard's at its own master (a master that
        does not answer soon reclaims them itself after its put timeout), then the
        channels and the data side."""
        control, state = self._control, getattr(self, "_state", None)
        pools = state.all_pools() if state is not None else []
        if control is not None and state is not None and pools:
            for shard in list(self._later):
                yield from self._settle_later(shard)
            for shard, rs in pools:
                left = rs.drain()
                to = self._channel(shard)
                if left and to is not None:
                    with contextlib.suppress(Retry, KVStoreError):
                        yield Call(to, "PutRevoke", pb.KeysRequest(
                            keys=left, writer=state.writer_id), min(1.0, self.timeout), True)
        self._control = None
        if control is not None:
            yield Close(control)
        others, self._others = self._others, None
        for other in (others or {}).values():
            yield Close(other)
        if state is not None:
            state.close()
        self._closed = True

    # -- running a flow --------------------------------------------------------------------

    def _run(self, flow: steps.Flow[T]) -> Io[T]:
        pump = Pump(flow)
        started: list[Ticket] = []
        timer = self.phase_timer
        try:
            while (step := pump.next()) is not None:
                if timer is not None:
                    timer(_phase(step))
                try:
                    pump.give((yield from self._step(step, started)))
                except KVStoreError as exc:
                    pump.fail(exc)
                finally:
                    if timer is not None:
                        timer(None)
            return pump.result
        finally:
            # Whatever ended the flow, nothing it started may still be moving bytes.
            left = [t for t in started if not t.done]
            if left:
                yield Drain(left)

    def _step(self, step: steps.Step, started: list[Ticket]) -> Io[Any]:
        """One step of a flow (steps.py says what each means)."""
        if isinstance(step, steps.Rpc):
            if step.shard:
                return (yield from self._rpc(step.method, step.request, not _moving(started),
                                             step.shard))
            return (yield from self._rpc(step.method, step.request, not _moving(started)))
        if isinstance(step, steps.Start):
            ticket = yield step
            started.append(ticket)
            return ticket
        if isinstance(step, steps.Finish | steps.Move):
            return (yield step)
        if isinstance(step, steps.Ask):
            if step.shard:
                return (yield from self._ask(step.method, step.request, step.shard))
            return (yield from self._ask(step.method, step.request))
        if isinstance(step, steps.Answer):
            return (yield from self._answer(step.asked, not _moving(started)))
        if isinstance(step, steps.Later):
            return (yield from self._send_later(step.method, step.request, step.then,
                                                step.shard))
        if isinstance(step, steps.Settle):
            for shard in list(self._later):  # whichever shard's pool asked
                yield from self._settle_later(shard)
            return None
        if isinstance(step, steps.Release):
            if step.shard or step.keep_first:
                return (yield from self._release(step.lease_id, step.shard, step.keep_first))
            return (yield from self._release(step.lease_id))
        if isinstance(step, steps.Wait):
            return (yield Sleep(step.seconds))
        raise TypeError(f"not a step: {step!r}")

    def _read_quick(self, key: bytes, dest: Dest | None) -> Io[memoryview | quick.Slow | None]:
        """A single get in straight-line code (quick.py), or quick.SLOW for the flow; never
        while a Later call's reply is unread on its shard's channel (the flow's next call
        there reads it first)."""
        control, shard = self._control, 0
        if self._shards > 1:
            if type(key) is not bytes:
                return quick.SLOW  # the flow converts bytearray and memoryview keys
            shard = shard_of(self._key_prefix + key, self._shards)
            control = self._channel(shard)
        if control is None or shard in self._later:
            return quick.SLOW
        timer = self.phase_timer
        if timer is None:
            return (yield Quick(control, key, dest, shard))
        timer("quick get")
        try:
            return (yield Quick(control, key, dest, shard))
        finally:
            timer(None)

    # -- the API, once (the drivers' methods say what each does) -------------------------

    def _exists(self, keys: Sequence[bytes]) -> Io[list[bool]]:
        if self._shards > 1:
            return (yield from self._run(sharded.exists(keys, self._shards,
                                                        self._key_prefix)))
        return (yield from self._run(flows.exists(keys)))

    def _remove(self, key: bytes) -> Io[bool]:
        return (yield from self._remove_many([key], False))[0] == Code.OK

    def _remove_many(self, keys: Sequence[bytes], force: bool) -> Io[list[Code]]:
        if self._shards > 1:
            return (yield from self._run(sharded.remove_many(self._state, keys, force,
                                                             self._shards)))
        return (yield from self._run(flows.remove_many(self._state, keys, force)))

    def _put(self, key: bytes, value: Any) -> Io[None]:
        err = (yield from self._put_many([key], [value]))[0]
        if err is not None:
            raise err

    def _put_many(self, keys: Sequence[bytes],
                  values: Sequence[Any]) -> Io[list[KVStoreError | None]]:
        if self._shards > 1:
            return (yield from self._run(sharded.put_many(self._state, keys, values,
                                                          self._shards)))
        return (yield from self._run(flows.put_many(self._state, keys, values)))

    def _get(self, key: bytes) -> Io[bytes | None]:
        got = yield from self._read_quick(key, None)
        if isinstance(got, memoryview):
            return bytes(got)
        if got is None:
            return None
        out = (yield from self._run(self._get_flow([key])))[0]
        if isinstance(out, NotFound):
            return None
        if isinstance(out, KVStoreError):
            raise out
        return out

    def _get_flow(self, keys: Sequence[bytes]) -> steps.Flow[list[bytes | KVStoreError]]:
        if self._shards > 1:
            return sharded.get_many(self._state, keys, self._shards)
        return flows.get_many(self._state, keys)

    def _get_many(self, keys: Sequence[bytes]) -> Io[list[bytes | None]]:
        out = yield from self._run(self._get_flow(keys))
        return [None if isinstance(o, KVStoreError) else o for o in out]

    def _lookup(self, keys: Sequence[bytes], ttl: float | None) -> Io[Lease]:
        if self._shards > 1:
            lease = yield from self._run(sharded.lookup(self._state, keys, ttl, self._shards))
        else:
            lease = yield from self._run(flows.lookup(self._state, keys, ttl))
        lease._client = self
        return lease

    def _renew(self, lease: Lease, ttl: float | None) -> Io[None]:
        if self._shards > 1:
            yield from self._run(sharded.renew(self._state, lease, ttl))
            return
        yield from self._run(flows.renew(self._state, lease, ttl))

    def _release_lease(self, lease: Lease, keep_first: int | None) -> Io[None]:
        if self._shards > 1:
            yield from self._run(sharded.release(self._state, lease, keep_first,
                                                 self._shards, self._ordered()))
            return
        yield from self._run(flows.release(lease, keep_first, self._ordered()))

    def _ordered(self) -> bool:
        """Whether this client's control channels handle one connection's frames in order
        (the fast channel's): a release then goes one-way (flows.release)."""
        control = self._control
        return control is not None and control.transport == "fast"

    def _put_from(self, keys: Sequence[bytes],
                  buffers: Sequence[Any]) -> Io[list[KVStoreError | None]]:
        if self._shards > 1:
            return (yield from self._run(sharded.put_from(self._state, keys, buffers,
                                                          self._shards)))
        return (yield from self._run(flows.put_from(self._state, keys, buffers)))

    def _get_into(self, keys: Sequence[bytes], buffers: Sequence[Any],
                  lease: Lease | None) -> Io[list[KVStoreError | None]]:
        if lease is not None and not lease.id and lease.keys:
            raise LeaseExpired("this lease was released: it pins nothing any more (look "
                               "the keys up again)")
        if len(keys) == 1 and len(buffers) == 1 and lease is None:
            got: Any = quick.SLOW
            with contextlib.suppress(KVStoreError):  # the flow reports a bad buffer or key
                got = yield from self._read_quick(keys[0], self._state.dest(buffers[0]))
            if got is None:
                return [NotFound("not in the store", key=keys[0])]
            if isinstance(got, memoryview):
                return [None]
        if self._shards > 1:
            return (yield from self._run(sharded.get_into(self._state, keys, buffers, lease,
                                                          self._shards)))
        return (yield from self._run(flows.get_into(self._state, keys, buffers, lease)))


def _phase(step: object) -> str:
    """A step's name for `phase_timer`: its kind and the control method it sends or
    answers, e.g. "rpc PutStart", "answer GetReplicas", "start", "finish", "release"."""
    asked = getattr(step, "asked", None)
    method = getattr(step if asked is None else asked, "method", "")
    return f"{type(step).__name__.lower()} {method}".rstrip()


def _moving(started: list[Ticket]) -> bool:
    """Whether engine transfers of these tickets may still be moving. A control reply is
    then waited for asleep, not polled for, as the early reads' design has it (see
    early._read_while_asking): on a small host the polling takes the CPU that the
    engine's threads (here and on the store node) need to move the bytes (figures:
    docs/client-internals.md)."""
    return any(t.pending and not t.done for t in started)
