"""Per-request timeline of a load, and the counters and histograms the connector reports.

The points are those of the seed article's section 9:

    t0 lookup_start        scheduler: get_num_new_matched_tokens begins the lookup
    t1 lookup_committed    scheduler: the lease is granted (the hit is a promise)
    t2 blocks_allocated    scheduler: update_state_after_alloc names the local blocks
    t3 transfer_submitted  worker: start_load_kv hands the reads to the I/O thread
    t4 layer_ready[l]      worker: layer l's KV is in its blocks
    t5 forward_start       worker: the first attention layer of the step is entered
    t6 transfer_complete   worker: every layer is in (or failed)
    t7 request_resumed     scheduler: the step's output, with the first token, is back

Times are `time.monotonic()` seconds, which on Linux is one clock for every process of
a host (scheduler and workers of one engine). The worker also measures how long the
forward actually blocked waiting for loads (`load_wait`): transfer time minus that is
the part hidden behind the forward. Pure Python; no vLLM.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

LOOKUP_START = "lookup_start"
LOOKUP_COMMITTED = "lookup_committed"
BLOCKS_ALLOCATED = "blocks_allocated"
TRANSFER_SUBMITTED = "transfer_submitted"
FORWARD_START = "forward_start"
TRANSFER_COMPLETE = "transfer_complete"
REQUEST_RESUMED = "request_resumed"

# Histogram bucket upper bounds, milliseconds (the last bucket is open).
BUCKETS_MS: tuple[float, ...] = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0,
                                 500.0, 1000.0, 2500.0, 5000.0)

# Intervals derived from a finished timeline: name -> (from point, to point).
INTERVALS: dict[str, tuple[str, str]] = {
    "lookup": (LOOKUP_START, LOOKUP_COMMITTED),
    "alloc_delay": (LOOKUP_COMMITTED, BLOCKS_ALLOCATED),
    "submit_delay": (BLOCKS_ALLOCATED, TRANSFER_SUBMITTED),
    "transfer": (TRANSFER_SUBMITTED, TRANSFER_COMPLETE),
    "resume_delay": (TRANSFER_COMPLETE, REQUEST_RESUMED),
    "lookup_to_resume": (LOOKUP_START, REQUEST_RESUMED),
}


@dataclass
class Timeline:
    """The points of one request's load; missing points are simply absent."""

    points: dict[str, float] = field(default_factory=dict)
    layer_ready: dict[str, float] = field(default_factory=dict)
    load_wait: float = 0.0  # seconds the forward blocked on this request's loads

    def mark(self, point: str, t: float) -> None:
        self.points.setdefault(point, t)

    def merge(self, other: Timeline) -> None:
        """Fold in points from another process (TP ranks: the latest completion wins)."""
        for k, v in other.points.items():
            if k in (TRANSFER_COMPLETE,):
                self.points[k] = max(v, self.points.get(k, v))
            else:
                self.points.setdefault(k, v)
        for k, v in other.layer_ready.items():
            self.layer_ready[k] = max(v, self.layer_ready.get(k, v))
        self.load_wait = max(self.load_wait, other.load_wait)

    def intervals(self) -> dict[str, float]:
        out = {}
        for name, (a, b) in INTERVALS.items():
            if a in self.points and b in self.points:
                out[name] = max(0.0, self.points[b] - self.points[a])
        if TRANSFER_COMPLETE in self.points and FORWARD_START in self.points:
            # How far the transfer ran past the forward's start: >0 means the forward
            # began while bytes were still moving (it then waited only `load_wait`).
            out["transfer_after_forward_start"] = max(
                0.0, self.points[TRANSFER_COMPLETE] - self.points[FORWARD_START])
        out["load_wait"] = self.load_wait
        return out

    def hidden(self) -> float:
        """Share of the transfer the forward did not wait for (0..1): the part that ran
        behind the step's input preparation or behind earlier layers."""
        iv = self.intervals()
        transfer = iv.get("transfer", 0.0)
        if transfer <= 0:
            return 1.0
        return max(0.0, min(1.0, 1.0 - self.load_wait / transfer))

    def overlapped(self) -> bool:
        """True when part of the transfer ran while the forward was already running."""
        iv = self.intervals()
        return iv.get("transfer_after_forward_start", 0.0) > iv.get("load_wait", 0.0) + 1e-4

    def describe(self) -> str:
        """The debug line's body: each point relative to t0 in ms, then intervals."""
        t0 = self.points.get(LOOKUP_START, min(self.points.values(), default=0.0))
        pts = " ".join(f"{k}=+{(v - t0) * 1e3:.2f}ms" for k, v in
                       sorted(self.points.items(), key=lambda kv: kv[1]))
        layers = ",".join(f"{(v - t0) * 1e3:.2f}" for _, v in
                          sorted(self.layer_ready.items(), key=lambda kv: kv[1]))
        return (f"{pts} layer_ready_ms=[{layers}] load_wait={self.load_wait * 1e3:.2f}ms "
                f"hidden={self.hidden():.0%} overlapped_forward={self.overlapped()}")


# -- counters and histograms, as plain data (serialisable across processes) ------------


def new_stats_data() -> dict[str, Any]:
    return {"counters": {}, "hist": {}}


def add_counter(data: dict[str, Any], name: str, value: float = 1) -> None:
    c = data["counters"]
    c[name] = c.get(name, 0) + value


def observe(data: dict[str, Any], name: str, seconds: float) -> None:
    h = data["hist"].setdefault(name, [0] * (len(BUCKETS_MS) + 2))
    # The last two slots hold the count's sum of values (ms) and nothing else: keep the
    # list flat so it survives any serialiser.
    ms = seconds * 1e3
    h[bisect.bisect_left(BUCKETS_MS, ms)] += 1
    h[-1] += ms


def merge_stats_data(into: dict[str, Any], other: Mapping[str, Any]) -> dict[str, Any]:
    for k, v in other.get("counters", {}).items():
        add_counter(into, k, v)
    for k, counts in other.get("hist", {}).items():
        mine = into["hist"].setdefault(k, [0] * len(counts))
        for i, n in enumerate(counts):
            mine[i] += n
    return into


def stats_empty(data: Mapping[str, Any]) -> bool:
    return not data.get("counters") and not data.get("hist")


def quantile_ms(counts: list[float], q: float) -> float:
    """Upper bound of the bucket holding quantile q (the open bucket reports its lower)."""
    n = sum(counts[:-1])
    if n == 0:
        return 0.0
    rank = q * n
    seen = 0.0
    for i, c in enumerate(counts[:-1]):
        seen += c
        if seen >= rank and c:
            return BUCKETS_MS[i] if i < len(BUCKETS_MS) else BUCKETS_MS[-1]
    return BUCKETS_MS[-1]


def reduce_stats(data: Mapping[str, Any]) -> dict[str, int | float]:
    """A flat summary for vLLM's periodic 'KV Transfer metrics' log line."""
    out: dict[str, int | float] = {}
    for k, v in sorted(data.get("counters", {}).items()):
        out[k] = round(v, 3) if isinstance(v, float) else v
    for k, counts in sorted(data.get("hist", {}).items()):
        n = int(sum(counts[:-1]))
        if not n:
            continue
        out[f"{k}_count"] = n
        out[f"{k}_avg_ms"] = round(counts[-1] / n, 3)
        out[f"{k}_p50_ms"] = quantile_ms(counts, 0.5)
        out[f"{k}_p90_ms"] = quantile_ms(counts, 0.9)
    return out
