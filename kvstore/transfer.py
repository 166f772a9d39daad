"""The data path: a thin wrapper over Mooncake's Transfer Engine.

Store nodes register their segment with it; clients register their buffers and move
bytes with one-sided batch reads and writes addressed by (segment name, address). The
master never touches object bytes.

Here the engine runs over TCP with peer-to-peer handshakes (no metadata server); on
RDMA hardware pass `protocol="rdma"` and the NIC name as `device`.
"""

from __future__ import annotations

import logging
import math
import os
import threading
from collections.abc import Sequence
from typing import Any

from kvstore.errors import InvalidArgument, Unavailable

log = logging.getLogger(__name__)

PROTOCOLS = ("tcp", "rdma")

# The engine reads its transfer timeout (whole seconds; 30 when unset) from this variable
# when it is constructed, and bounds every batch by it. A peer that stops answering (a
# frozen process, a cut link) would otherwise hold a client call for 30 s, whatever
# timeout the client was given.
TIMEOUT_ENV = "MC_TRANSFER_TIMEOUT"
# The TCP transport's liveness deadlines (whole seconds, default 30; read from the
# environment whenever a connection waits): a connection that makes no progress for that
# long is dropped and its transfers fail. They must expire before the batch timeout: a
# batch the engine gives up on while its connection lives on is completed later, and the
# late bytes land in our buffer, by then holding another read (wrong bytes, seen with a
# cut link) or the caller's tensor. Dropping the connection first ends them for good.
LIVENESS_ENV = ("MC_TCP_PROGRESS_TIMEOUT_SEC", "MC_TCP_STATUS_TIMEOUT_SEC")
BATCH_SLACK = 2  # s: how much later than the liveness deadline a batch times out
# Without this, the engine's TCP transport opens a connection for every transfer and
# closes it when the transfer is over: a 32-object batch in 512 KiB pieces leaves 64
# sockets in TIME_WAIT on the client, a single get one more. Between two hosts (where
# Linux does not reuse TIME_WAIT ports for new connections) a client moving more than
# ~470 transfers a second to one store node runs out of ephemeral ports (~28,000 of
# them, 60 s of TIME_WAIT each). With the pool, each peer gets a few long-lived
# connections ("lanes") and transfers queue for them. Read when the engine is
# constructed; the operator's value (0 turns it off) wins.
POOL_ENV = "MC_TCP_ENABLE_CONNECTION_POOL"
_env_lock = threading.Lock()
_liveness_set: dict[str, int] = {}  # the liveness values we set (not the operator)


def _set_liveness(seconds: int) -> None:
    """Process-wide (the engine reads them per wait): the smallest client timeout wins;
    a value the operator set is left alone."""
    for name in LIVENESS_ENV:
        ours = _liveness_set.get(name)
        if ours is None and name in os.environ:
            continue
        value = seconds if ours is None else min(ours, seconds)
        os.environ[name] = str(value)
        _liveness_set[name] = value


def _engine_class() -> Any:
    try:
        from mooncake.engine import TransferEngine as Engine
    except ImportError as exc:
        raise Unavailable(
            f"the Mooncake Transfer Engine cannot be loaded ({exc}); install "
            "`mooncake-transfer-engine-non-cuda` (CPU) or `mooncake-transfer-engine` (CUDA), "
            "and Debian's libibverbs1 (`apt-get install libibverbs1`)"
        ) from exc
    return Engine


class Transfer:
    """One Transfer Engine instance: registered memory plus batch read/write."""

    def __init__(self, host: str = "127.0.0.1", protocol: str = "tcp", device: str = "",
                 timeout: float | None = None) -> None:
        """`timeout`: seconds (rounded up) without progress after which a transfer to a
        store node fails and its connection is dropped; the batch as a whole fails
        BATCH_SLACK s later at most. None: the engine's defaults (30 s). Variables the
        operator set (MC_TRANSFER_TIMEOUT, MC_TCP_*_TIMEOUT_SEC) win."""
        if protocol not in PROTOCOLS:
            raise InvalidArgument(f"unknown transfer protocol {protocol!r}; use one of {PROTOCOLS}")
        with _env_lock:
            given = os.environ.get(TIMEOUT_ENV)
            # Read by the engine only while it is constructed: set for that moment where
            # the operator did not set them, and not left for other engines to find.
            defaults = {POOL_ENV: "1"}
            if timeout is not None:
                seconds = max(1, math.ceil(timeout))
                _set_liveness(seconds)
                defaults[TIMEOUT_ENV] = str(seconds + BATCH_SLACK)
            ours = [name for name in defaults if name not in os.environ]
            for name in ours:
                os.environ[name] = defaults[name]
            try:
                self._engine = _engine_class()()
                rc = self._engine.initialize(host, "P2PHANDSHAKE", protocol, device)
            finally:
                for name in ours:
                    os.environ.pop(name, None)
        if rc != 0:
            raise Unavailable(
                f"the Transfer Engine failed to start ({protocol} on {host}, rc={rc}); "
                "check the address and, for rdma, the --device name"
            )
        self.host = host
        self.protocol = protocol
        self.segment_name = f"{host}:{self._engine.get_rpc_port()}"
        self._registered: dict[int, int] = {}
        # The engine's Python binding is not documented as thread-safe for concurrent
        # batches on one instance; the async client calls from worker threads.
        self._lock = threading.Lock()
        self.timeout = timeout
        # What the engine's blocking calls wait before they give up on a batch (its own
        # floor is 5 s); the client's polled transfers give up at the same point, after
        # the liveness deadlines have dropped a dead connection.
        self.batch_timeout = float(max(5, int(given)) if given and given.isdigit() else
                                   seconds + BATCH_SLACK if timeout is not None else 30)
        # Segments whose handshake port answered a probe since their last failed batch,
        # and probes still waiting for an answer (segment -> [rc] once answered).
        self._answered: set[str] = set()
        self._probes: dict[str, tuple[threading.Thread, list[int]]] = {}
        self._moving: dict[int, str] = {}  # started transfer id -> its segment

    def register(self, addr: int, length: int) -> None:
        if addr in self._registered:
            return
        rc = self._engine.register_memory(addr, length)
        if rc != 0:
            raise Unavailable(f"registering {length} bytes at {addr:#x} with the Transfer "
                              f"Engine failed (rc={rc})")
        self._registered[addr] = length

    def unregister(self, addr: int) -> None:
        if self._registered.pop(addr, None) is not None:
            self._engine.unregister_memory(addr)

    def _check_reachable(self, segment: str) -> None:
        """Before a batch to a segment not known to answer: probe its handshake port,
        waiting at most `timeout`.

        The engine's first batch to a segment (and its first after a failure) fetches the
        segment's description over a socket that waits up to 60 s for an answer, which
        MC_TRANSFER_TIMEOUT does not bound: a frozen or cut-off node would hold the caller
        that long. A probe that does not answer in time is left to finish on its own (it
        touches no buffer of ours) and the batch fails; until it finishes, later batches
        to that segment fail at once instead of waiting again."""
        if self.timeout is None or segment in self._answered:
            return
        probe = self._probes.get(segment)
        if probe is None:
            answer: list[int] = []
            thread = threading.Thread(target=lambda: answer.append(self._engine.send_probe(segment)),
                                      name=f"te-probe-{segment}", daemon=True)
            thread.start()
            probe = self._probes[segment] = (thread, answer)
            thread.join(self.timeout)
        if probe[0].is_alive():
            raise Unavailable(f"store node {segment} did not answer the Transfer Engine "
                              f"handshake within {self.timeout:g} s; it may be frozen or cut off")
        del self._probes[segment]
        if probe[1] != [0]:
            raise Unavailable(f"store node {segment} refused the Transfer Engine handshake "
                              f"(rc={probe[1][0] if probe[1] else '?'}); the node may be down")
        self._answered.add(segment)

    def write(self, segment: str, local: Sequence[int], remote: Sequence[int],
              lengths: Sequence[int]) -> None:
        """Copy local[i] -> remote[i] on `segment`; all or nothing from the caller's view."""
        with self._lock:
            self._check_reachable(segment)
            rc = self._engine.batch_transfer_sync_write(segment, list(local), list(remote),
                                                        list(lengths))
            if rc != 0:
                self._answered.discard(segment)
        if rc != 0:
            raise Unavailable(f"writing {len(lengths)} object(s) to store node {segment} "
                              f"failed (rc={rc}); the node may be down")

    def read(self, segment: str, local: Sequence[int], remote: Sequence[int],
             lengths: Sequence[int]) -> None:
        with self._lock:
            self._check_reachable(segment)
            rc = self._engine.batch_transfer_sync_read(segment, list(local), list(remote),
                                                       list(lengths))
            if rc != 0:
                self._answered.discard(segment)
        if rc != 0:
            raise Unavailable(f"reading {len(lengths)} object(s) from store node {segment} "
                              f"failed (rc={rc}); the node may be down")

    # -- asynchronous transfers ----------------------------------------------------------

    def ready(self, segment: str) -> bool:
        """Whether a transfer to `segment` can start without waiting for a probe."""
        return self.timeout is None or segment in self._answered

    def start(self, segment: str, local: int, remote: int, length: int, write: bool) -> int:
        """Submit one transfer without waiting for it; its id for `status`. Raises
        Unavailable if the node does not answer (see _check_reachable) or the engine
        refuses the transfer.

        One transfer per id, though the engine takes lists: `transfer_check_status`
        answers for the first transfer of a batch only, so a batch of several would be
        reported done while the others still move (docs/perf-notes.md), and the only
        whole-batch answer (`get_batch_transfer_status`) spins until the batch ends."""
        with self._lock:
            self._check_reachable(segment)
            if write:
                tid = self._engine.batch_transfer_async_write(segment, [local], [remote], [length])
            else:
                tid = self._engine.batch_transfer_async_read(segment, [local], [remote], [length])
            if tid <= 0:
                self._answered.discard(segment)
            else:
                self._moving[tid] = segment
        if tid <= 0:
            raise Unavailable(f"{'writing to' if write else 'reading from'} store node "
                              f"{segment} failed at submission; the node may be down")
        return int(tid)

    def status(self, tid: int) -> int:
        """Of a started transfer: 1 done, -1 failed, 0 still moving. Never blocks; once
        it said 1 or -1, the id is no longer valid, and asking again raises
        InvalidArgument, as does an id `start` never returned.

        The engine takes the id for the address of its batch record, which it frees once
        it reported the batch over: it would read freed memory (or, for 0, none at all)
        and crash the process. So only ids in flight reach it."""
        with self._lock:
            segment = self._moving.get(tid)
            if segment is None:
                raise InvalidArgument(
                    f"transfer {tid} is not in flight on this Transfer Engine: it was never "
                    "started, or its status already said it was over; this is a bug in "
                    "the caller (kvstore_client), please report it with the traceback")
            st = self._engine.transfer_check_status(tid)
            if st == 1 or (st < 0 and st != _TIMED_OUT):
                del self._moving[tid]
                if st != 1:
                    self._answered.discard(segment)
                    return -1
                return 1
        return 0

    def close(self) -> None:
        for addr in list(self._registered):
            self.unregister(addr)


# transfer_check_status says -2 for a transport-level timeout and keeps the id; the
# caller's own deadline decides.
_TIMED_OUT = -2
