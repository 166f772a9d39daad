"""The synchronous client: runs the flows of `flows.py` with blocking calls.

The driver does the I/O the flows leave out: control calls (with retries across a
failover), the transfers behind Start/Finish/Move (datapath.py), releases, and the
sleeping (a flow's Wait steps, and between polls of a transfer batch). A single get of
a known object takes the quick path (quick.py) before any flow.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from kvstore.coord.layout import Layout
from kvstore.errors import Code, KVStoreError, NotFound
from kvstore.v1 import master_pb2 as pb
from kvstore_client import flows, quick
from kvstore_client.buffers import Dest
from kvstore_client.control import (
    Control,
    Retry,
    backoff,
    check_reply,
    discover_record,
    open_control,
    reply_spin,
    target,
    timed_out,
    unreachable_fast,
)
from kvstore_client.datapath import Target, Ticket
from kvstore_client.drive import Pump, handle
from kvstore_client.options import ClientOptions
from kvstore_client.state import Lease
from kvstore_client.stats import ClientStats
from kvstore_client.steps import (
    Answer,
    Ask,
    Finish,
    Flow,
    Later,
    Move,
    Release,
    Rpc,
    Settle,
    Start,
    Wait,
)

T = TypeVar("T")


@dataclass(slots=True)
class _Asked:
    method: str
    request: Any
    control: Control | None
    handle: Any = None


class KVStoreClient:
    """Blocking client. Not thread-safe: use one per thread (or AsyncKVStoreClient).

    `KVStoreClient(etcd="127.0.0.1:2379")` finds the leader through etcd;
    `KVStoreClient(master="127.0.0.1:50051")` talks to one master directly.
    On the same host as a store node it maps that node's segment and copies directly
    (`same_host=False` turns this off); elsewhere bytes go over the Transfer Engine.
    Control calls take the master's fast channel when its etcd record announces one
    (`transport="grpc"` forces gRPC; a fixed `master=` address is always gRPC).
    Every setting is a keyword argument, or comes in `options=ClientOptions(...)`
    (options.py says what each one does).
    """

    # For profilers (bench.vs_mooncake --phases): set on a client, it is called with a
    # phase's name as each step of a call begins (see _phase; "quick get" for a quick
    # single get) and with None as it ends. None: nothing is timed.
    phase_timer: Callable[[str | None], None] | None = None

    # How this driver sleeps: for a flow's Wait steps and between polls of a transfer
    # batch. A test that puts a ManualClock on the state sets the clock's `advance` here.
    _sleep = staticmethod(time.sleep)

    def __init__(self, etcd: str | None = None, *, options: ClientOptions | None = None,
                 **settings: Any) -> None:
        self.options = opts = ClientOptions.of(options, etcd, settings)
        self.etcd = opts.etcd
        self._creds = opts.credentials()
        self.timeout = opts.timeout
        self.transport = opts.transport_name()
        reply_spin()  # a bad KVSTORE_REPLY_SPIN_US fails here, not at the first call
        self._layout = Layout(opts.cluster)
        self._fixed_master = opts.master
        self._control: Control | None = None
        self._fast_given_up = ""  # a fast address that would not take connections
        self.master_address = ""  # where control calls go (the fast or the gRPC address)
        self._later: tuple[_Asked, Any] | None = None  # a Later step's call, not yet read
        self._connect()
        self._state = opts.state(self._layout)

    @property
    def stats(self) -> ClientStats:
        return self._state.stats

    @property
    def writer_id(self) -> str:
        return self._state.writer_id

    # -- lifecycle --------------------------------------------------------------------

    def __enter__(self) -> KVStoreClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        control = getattr(self, "_control", None)  # None too if __init__ failed early
        state = getattr(self, "_state", None)
        if control is not None and state is not None and state.reservations is not None:
            if self._later is not None:
                self._settle_later()
            self._revoke_quietly(state.reservations.drain())
        if control is not None:
            control.close()
            self._control = None
        if getattr(self, "_state", None) is not None:
            self._state.close()

    def _connect(self) -> None:
        record = discover_record(self.etcd, self._layout, self._fixed_master, self.timeout,
                                 self._creds)
        control = self._control
        self._fast_given_up = unreachable_fast(control, self._fast_given_up)
        want = target(record, self.transport, self._fast_given_up)
        if control is None or (control.transport, control.address) != want:
            if control is not None:
                control.close()
            self._control = open_control(record, self.transport, self._fast_given_up,
                                  self._creds)
            self.master_address = self._control.address

    def _call(self, method: str, request: Any, spin: bool = True) -> Any:
        """One control round trip. Follows the leader across a failover, retrying with
        bounded backoff, and fails with Unavailable once `timeout` has passed. `spin`
        False: engine transfers of this call are moving, so the reply is waited for
        asleep rather than polled for (see `_run`)."""
        if self._later is not None:
            # Sent before the Later call's reply is read (a connection answers in order):
            # the master works on this one while the client takes in that one.
            return self._answer(self._ask(method, request), spin)
        deadline = time.monotonic() + self.timeout
        last = "no attempt"
        for attempt in range(1 << 30):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            assert self._control is not None
            try:
                reply = self._control.call(method, request, remaining, spin)
            except Retry as exc:
                last = str(exc)
            else:
                if self._state.current(reply):
                    return check_reply(reply)
                last = f"{self.master_address} is not the leader"
                self.stats.failovers += 1
            time.sleep(backoff(attempt, deadline - time.monotonic()))
            self._reconnect_quietly()
        raise timed_out(method, self.timeout, last)

    def _ask(self, method: str, request: Any) -> _Asked:
        """Send a control request without waiting (see `_answer`). A failure to send is
        not reported here: `_answer` then makes the whole call, retries included. A Later
        call's reply still unread is read after sending (replies come in order)."""
        asked = _Asked(method, request, self._control)
        if self._control is not None:
            with contextlib.suppress(Retry):
                asked.handle = self._control.ask(method, request, self.timeout)
        if self._later is not None:
            self._settle_later()
        return asked

    def _answer(self, asked: _Asked, spin: bool = True) -> Any:
        """The reply to an `_ask`; when that attempt failed (or came from a stale
        leader), the call is made again the usual way (`_call`)."""
        control = self._control
        if asked.handle is not None and control is asked.control and control is not None:
            try:
                reply = control.answer(asked.handle, asked.method, spin)
            except Retry:
                pass
            else:
                if self._state.current(reply):
                    return check_reply(reply)
                self.stats.failovers += 1
                self._reconnect_quietly()
        return self._call(asked.method, asked.request, spin)

    def _send_later(self, method: str, request: Any, then: Any) -> None:
        """A Later step: sent now; its reply is read before the next control call's."""
        asked = self._ask(method, request)
        if asked.handle is None:
            then(None)
        else:
            self._later = (asked, then)

    def _settle_later(self) -> None:
        """Read the reply of the Later call in flight and hand it on (None if it failed:
        nobody retries it, nobody waits for it)."""
        assert self._later is not None
        asked, then = self._later
        self._later = None
        reply = None
        control = self._control
        if control is not None and control is asked.control:
            try:
                got = control.answer(asked.handle, asked.method)
            except (Retry, KVStoreError):
                pass
            else:
                if not got.error.code and self._state.current(got):
                    reply = got
        then(reply)

    def _revoke_quietly(self, keys: list[bytes]) -> None:
        """Free placeholders as the client closes; a master that does not answer soon
        reclaims them itself after its put timeout."""
        if not keys or self._control is None:
            return
        with contextlib.suppress(Retry, KVStoreError):
            self._control.call("PutRevoke", pb.KeysRequest(keys=keys, writer=self.writer_id),
                               min(1.0, self.timeout))

    def _read_quick(self, key: bytes, dest: Dest | None) -> memoryview | quick.Slow | None:
        """A single get in straight-line code (quick.py), or quick.SLOW for the flow; never
        while a Later call's reply is unread (the flow's next call reads it first)."""
        if self._later is not None or self._control is None:
            return quick.SLOW
        timer = self.phase_timer
        if timer is None:
            return quick.read_one(self._state, self._control, key, dest, self.timeout)
        timer("quick get")
        try:
            return quick.read_one(self._state, self._control, key, dest, self.timeout)
        finally:
            timer(None)

    def _reconnect_quietly(self) -> None:
        with contextlib.suppress(KVStoreError):  # the next attempt reports the failure
            self._connect()

    def _release_async(self, lease_id: int) -> None:
        """Release without waiting: the lease expires on its own if this is lost."""
        assert self._control is not None
        self._control.release(lease_id, self.timeout)

    def _run(self, flow: Flow[T]) -> T:
        steps = _Steps(self)
        pump = Pump(flow)
        timer = self.phase_timer
        try:
            while (step := pump.next()) is not None:
                if timer is not None:
                    timer(_phase(step))
                try:
                    pump.give(handle(steps, step))
                except KVStoreError as exc:
                    pump.fail(exc)
                finally:
                    if timer is not None:
                        timer(None)
            return pump.result
        finally:
            # Whatever ended the flow, nothing it started may still be moving bytes.
            steps.finish_started()

    # -- the API --------------------------------------------------------------------------

    def exists(self, keys: Sequence[bytes]) -> list[bool]:
        return self._run(flows.exists(keys))

    def remove(self, key: bytes) -> bool:
        """Remove one object; False if it was not there."""
        return self.remove_many([key])[0] == Code.OK

    def remove_many(self, keys: Sequence[bytes], force: bool = False) -> list[Code]:
        return self._run(flows.remove_many(self._state, keys, force))

    def put(self, key: bytes, value: Any) -> None:
        err = self.put_many([key], [value])[0]
        if err is not None:
            raise err

    def put_many(self, keys: Sequence[bytes], values: Sequence[Any]) -> list[KVStoreError | None]:
        """Store each value under its key. Per key: None on success, else the error.
        A key already stored counts as success (content addressing: same key, same bytes)."""
        return self._run(flows.put_many(self._state, keys, values))

    def get(self, key: bytes) -> bytes | None:
        """The object's bytes, or None if the store does not hold it."""
        got = self._read_quick(key, None)
        if isinstance(got, memoryview):
            return bytes(got)
        if got is None:
            return None
        out = self._run(flows.get_many(self._state, [key]))[0]
        if isinstance(out, NotFound):
            return None
        if isinstance(out, KVStoreError):
            raise out
        return out

    def get_many(self, keys: Sequence[bytes]) -> list[bytes | None]:
        """Per key: the bytes, or None for a miss. A corrupt or unreachable replica is a
        miss too (a cache reader recomputes); `stats.errors` counts them."""
        out = self._run(flows.get_many(self._state, keys))
        return [None if isinstance(o, KVStoreError) else o for o in out]

    def lookup(self, keys: Sequence[bytes], ttl: float | None = None) -> Lease:
        """Pin the longest stored prefix of `keys` under a lease; `lease.count` says how many.

        Until the lease is released or expires, the master evicts none of them: a reader
        that saw `count` hits can load exactly those. Use it as a context manager.
        """
        lease = self._run(flows.lookup(self._state, keys, ttl))
        lease._client = self
        return lease

    def renew(self, lease: Lease, ttl: float | None = None) -> None:
        self._run(flows.renew(self._state, lease, ttl))

    def release(self, lease: Lease, keep_first: int | None = None) -> None:
        """Unpin the lease's keys; with `keep_first=n`, keep the first n pinned."""
        self._run(flows.release(lease, keep_first))

    def register(self, buffer: Any) -> None:
        """Register memory (any contiguous buffer or a CPU torch tensor) for zero-copy
        put_from/get_into. Slices of a registered buffer are usable too."""
        self._state.register(buffer)

    def unregister(self, buffer: Any) -> None:
        self._state.unregister(buffer)

    def put_from(self, keys: Sequence[bytes], buffers: Sequence[Any]) -> list[KVStoreError | None]:
        """Like put_many, but bytes go straight from registered memory to the store."""
        return self._run(flows.put_from(self._state, keys, buffers))

    def get_into(self, keys: Sequence[bytes], buffers: Sequence[Any],
                 lease: Lease | None = None) -> list[KVStoreError | None]:
        """Read each object straight into its registered buffer (no intermediate copy).

        Per key: None when the buffer holds the verified object, else the error
        (NotFound, CorruptObject, Unavailable). With `lease`, only keys pinned by it are
        read, and if the lease deadline passes before the transfer finishes the whole call
        raises LeaseExpired, even if bytes arrived: they may belong to a reused range.
        """
        if len(keys) == 1 and len(buffers) == 1 and lease is None:
            with contextlib.suppress(KVStoreError):  # the flow reports a bad buffer
                got = self._read_quick(keys[0], self._state.dest(buffers[0]))
                if got is None:
                    return [NotFound("not in the store", key=keys[0])]
                if isinstance(got, memoryview):
                    return [None]
        return self._run(flows.get_into(self._state, keys, buffers, lease))


class _Steps:
    """The blocking handlers of one run of a flow (drive.StepHandlers): each step as
    the client's own calls, and the transfer batches the run started."""

    __slots__ = ("_client", "started")

    def __init__(self, client: KVStoreClient) -> None:
        self._client = client
        self.started: list[Ticket] = []

    def rpc(self, step: Rpc) -> Any:
        return self._client._call(step.method, step.request, not _moving(self.started))

    def ask(self, step: Ask) -> _Asked:
        return self._client._ask(step.method, step.request)

    def answer(self, step: Answer) -> Any:
        return self._client._answer(step.asked, not _moving(self.started))

    def later(self, step: Later) -> None:
        self._client._send_later(step.method, step.request, step.then)

    def settle(self, step: Settle) -> None:
        if self._client._later is not None:
            self._client._settle_later()

    def start(self, step: Start) -> Ticket:
        ticket = self._client._state.start_transfers(step.plan, step.write, step.dead,
                                                     step.at_once)
        self.started.append(ticket)
        return ticket

    def finish(self, step: Finish) -> dict[Target, KVStoreError]:
        return self._client._state.finish_transfers(step.ticket, self._client._sleep)

    def move(self, step: Move) -> dict[Target, KVStoreError]:
        return self._client._state.run_transfers(step.plan, step.write, self._client._sleep)

    def release(self, step: Release) -> None:
        self._client._release_async(step.lease_id)

    def wait(self, step: Wait) -> None:
        self._client._sleep(step.seconds)

    def finish_started(self) -> None:
        for ticket in self.started:
            self._client._state.finish_transfers(ticket, self._client._sleep)


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
