"""The synchronous client: runs the shared layer (session.py) with blocking calls.

Each op (ops.py) is one blocking call: a control call or reply on the channel, the
transfers behind Start/Finish/Move (datapath.py), a sleep. Everything else (leader
following, retries, the flows, the quick single get) is session.py's, shared with the
asyncio client.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, TypeVar

from kvstore.coord.layout import MasterRecord
from kvstore.errors import Code, KVStoreError
from kvstore_client import ops, quick, sharded, steps
from kvstore_client.control import Control, open_control, reply_spin
from kvstore_client.options import ClientOptions
from kvstore_client.session import Io, Session
from kvstore_client.state import Lease

T = TypeVar("T")


class KVStoreClient(Session):
    """Blocking client. Not thread-safe: use one per thread (or AsyncKVStoreClient).

    `KVStoreClient(etcd="127.0.0.1:2379")` finds the leader through etcd;
    `KVStoreClient(master="h1:50051,h2:50051")` asks those masters who leads, and needs
    no access to etcd. With `etcd=`, on the same host as a store node it maps that
    node's segment and copies directly (`same_host=False` turns this off); elsewhere
    bytes go over the Transfer Engine. Control calls take the master's fast channel
    when the leader announces one (`transport="grpc"` forces gRPC).
    Every setting is a keyword argument, or comes in `options=ClientOptions(...)`
    (options.py says what each one does). `phase_timer`: see session.Session.
    """

    # How this driver sleeps: for a flow's Wait steps and between polls of a transfer
    # batch. A test that puts a ManualClock on the state sets the clock's `advance` here.
    _sleep = staticmethod(time.sleep)

    def __init__(self, etcd: str | None = None, *, options: ClientOptions | None = None,
                 **settings: Any) -> None:
        super().__init__(etcd, options, settings)
        reply_spin()  # a bad KVSTORE_REPLY_SPIN_US fails here, not at the first call
        self._drive(self._connect())
        self._state = self.options.state(self._layout)
        self._fit_state()

    def _open(self, record: MasterRecord, given_up: str = "") -> Control[Any]:
        return open_control(record, self.transport, given_up, self._creds)

    def __enter__(self) -> KVStoreClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if not self._closed:
            self._drive(self._close())

    def _call(self, method: str, request: Any, spin: bool = True) -> Any:
        """One control call, retries and leader following included (for tools and
        adapters that need a method the API does not wrap, e.g. ListKeys, which a
        cluster of several shards answers from every shard, merged)."""
        if self._shards > 1 and method == "ListKeys":
            return self._drive(self._run(sharded.list_keys(request, self._shards)))
        return self._drive(self._rpc(method, request, spin))

    def _drive(self, io: Io[T]) -> T:
        """Run `io`, each op as a blocking call; an op's error is thrown back into it.
        (A Pump's loop inlined: a quick get's whole cost is a few µs of Python.)"""
        self._check_open()
        send, do = io.send, self._do
        try:
            op = send(None)
            while True:
                try:
                    value = do(op)
                except BaseException as exc:  # thrown in: its finally blocks run
                    op = io.throw(exc)
                else:
                    op = send(value)
        except StopIteration as done:
            return done.value

    def _do(self, op: Any) -> Any:
        kind = type(op)
        if kind is ops.Call:
            return op.control.call(op.method, op.request, op.timeout, op.spin)
        if kind is ops.Answer:
            return op.control.answer(op.handle, op.method, op.spin)
        if kind is steps.Start:
            return self._state.start_transfers(op.plan, op.write, op.dead, op.at_once)
        if kind is steps.Finish:
            return self._state.finish_transfers(op.ticket, self._sleep)
        if kind is steps.Move:
            return self._state.run_transfers(op.plan, op.write, self._sleep)
        if kind is ops.Quick:
            return quick.read_one(self._state, op.control, op.key, op.dest, self.timeout,
                                  op.shard)
        if kind is ops.Sleep:
            return self._sleep(op.seconds)
        if kind is ops.Drain:
            return [self._state.finish_transfers(t, self._sleep) for t in op.tickets]
        if kind is ops.Find:
            return self.find_leader(op.shard)
        if kind is ops.Close:
            return op.control.close()
        raise TypeError(f"not an op: {op!r}")

    # -- the API (each method is session.py's, run here) ----------------------------------

    def exists(self, keys: Sequence[bytes]) -> list[bool]:
        return self._drive(self._exists(keys))

    def remove(self, key: bytes) -> bool:
        """Remove one object; False if it was not there."""
        return self._drive(self._remove(key))

    def remove_many(self, keys: Sequence[bytes], force: bool = False) -> list[Code]:
        return self._drive(self._remove_many(keys, force))

    def put(self, key: bytes, value: Any) -> None:
        self._drive(self._put(key, value))

    def put_many(self, keys: Sequence[bytes], values: Sequence[Any]) -> list[KVStoreError | None]:
        """Store each value under its key. Per key: None on success, else the error.
        A key already stored counts as success (content addressing: same key, same bytes)."""
        return self._drive(self._put_many(keys, values))

    def get(self, key: bytes) -> bytes | None:
        """The object's bytes, or None if the store does not hold it."""
        return self._drive(self._get(key))

    def get_many(self, keys: Sequence[bytes]) -> list[bytes | None]:
        """Per key: the bytes, or None for a miss. A corrupt or unreachable replica is a
        miss too (a cache reader recomputes); `stats.errors` counts them."""
        return self._drive(self._get_many(keys))

    def lookup(self, keys: Sequence[bytes], ttl: float | None = None) -> Lease:
        """Pin the longest stored prefix of `keys` under a lease; `lease.count` says how many.

        Until the lease is released or expires, the master evicts none of them: a reader
        that saw `count` hits can load exactly those. Use it as a context manager.
        """
        return self._drive(self._lookup(keys, ttl))

    def renew(self, lease: Lease, ttl: float | None = None) -> None:
        self._drive(self._renew(lease, ttl))

    def release(self, lease: Lease, keep_first: int | None = None) -> None:
        """Unpin the lease's keys; with `keep_first=n`, keep the first n pinned."""
        self._drive(self._release_lease(lease, keep_first))

    def put_from(self, keys: Sequence[bytes], buffers: Sequence[Any]) -> list[KVStoreError | None]:
        """Like put_many, but bytes go straight from registered memory to the store."""
        return self._drive(self._put_from(keys, buffers))

    def get_into(self, keys: Sequence[bytes], buffers: Sequence[Any],
                 lease: Lease | None = None) -> list[KVStoreError | None]:
        """Read each object straight into its registered buffer (no intermediate copy).

        Per key: None when the buffer holds the verified object, else the error
        (NotFound, CorruptObject, Unavailable). With `lease`, only keys pinned by it are
        read, and if the lease deadline passes before the transfer finishes the whole call
        raises LeaseExpired, even if bytes arrived: they may belong to a reused range.
        """
        return self._drive(self._get_into(keys, buffers, lease))
