"""The backend's counters and latency samples (what get_stats reports)."""

from __future__ import annotations

from collections import deque
from dataclasses import asdict, dataclass, field
from typing import Any

# Latency samples kept per operation for get_stats.
SAMPLES = 1024


@dataclass
class Stats:
    """Counters since the backend was built (get_stats adds latency percentiles)."""

    exists_calls: int = 0
    pages_queried: int = 0
    hits: int = 0  # pages batch_exists reported
    misses: int = 0  # pages queried but not reported
    pages_read: int = 0
    pages_read_failed: int = 0
    leased_reads: int = 0  # pages read under the lease their batch_exists took
    lease_expired: int = 0  # pages whose lease ran out before the read
    pages_written: int = 0
    pages_write_failed: int = 0
    pages_write_skipped: int = 0  # MLA ranks that are not the group's writer
    bytes_read: int = 0
    bytes_written: int = 0
    store_down: int = 0  # times the store was found down
    latency: dict[str, deque[float]] = field(default_factory=lambda: {
        "exists": deque(maxlen=SAMPLES), "get": deque(maxlen=SAMPLES),
        "set": deque(maxlen=SAMPLES)})

    def snapshot(self) -> dict[str, Any]:
        out = {k: v for k, v in asdict(self).items() if k != "latency"}
        for op, samples in self.latency.items():
            xs = sorted(samples)
            out[f"{op}_p50_ms"] = 1e3 * xs[len(xs) // 2] if xs else 0.0
            out[f"{op}_p99_ms"] = 1e3 * xs[min(len(xs) - 1, int(len(xs) * 0.99))] if xs else 0.0
        return out
