"""Finding the leader and calling it: what the sync and async clients share."""

from __future__ import annotations

from typing import Any

from kvstore.coord.etcd import read_key_sync
from kvstore.coord.layout import Layout, MasterRecord
from kvstore.errors import Code, Unavailable, error_for

GRPC_OPTIONS = [
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
    ("grpc.max_send_message_length", 64 * 1024 * 1024),
]
RETRIABLE = frozenset({"UNAVAILABLE", "DEADLINE_EXCEEDED"})


def backoff(attempt: int, remaining: float) -> float:
    """Bounded exponential backoff between retries of one control call."""
    return max(0.0, min(0.05 * 2**attempt, 1.0, remaining))


def from_stale_leader(reply: Any, epoch: int) -> bool:
    """A reply from a deposed leader (or a standby) is never used: look the leader up again."""
    return bool(reply.error.code == Code.NOT_LEADER or reply.epoch < epoch)


def timed_out(method: str, timeout: float, last: str) -> Unavailable:
    return Unavailable(f"{method} could not complete within {timeout:.1f} s ({last}); the "
                       "master may be failing over or down")


def discover(etcd: str, layout: Layout, fixed: str | None, timeout: float) -> str:
    """The leader's gRPC address (or the fixed one the user gave)."""
    if fixed:
        return fixed
    raw = read_key_sync(etcd, layout.leader, timeout=min(timeout, 3.0))
    if raw is None:
        raise Unavailable(
            f"no kvstore master is registered in etcd at {etcd}; start one with "
            f"`kvstore master --etcd {etcd}` (or `kvstore up` for a dev cluster)"
        )
    return MasterRecord.decode(raw).address


def check_reply(reply: Any) -> Any:
    """Raise the typed error a reply carries."""
    if reply.error.code:
        raise error_for(reply.error.code, reply.error.message)
    return reply


def unanswered(method: str, address: str, code: str) -> Unavailable:
    return Unavailable(f"the kvstore master at {address} did not answer {method} ({code}); "
                       "is it running?")
