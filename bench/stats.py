"""Pure helpers shared by the benchmarks: percentiles, ratios, number formats, tables.

Nothing here starts a process or touches the network, so it is unit-tested directly
(tests/unit/test_bench_stats.py).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass


def percentile(samples: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100), linearly interpolated between closest ranks
    (numpy's default method). Raises ValueError on an empty sample."""
    if not samples:
        raise ValueError("percentile of an empty sample")
    if not 0 <= q <= 100:
        raise ValueError(f"percentile must be within [0, 100], got {q}")
    ordered = sorted(samples)
    pos = (len(ordered) - 1) * q / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


@dataclass(frozen=True)
class Latency:
    """A latency sample summarised; every field in seconds."""

    n: int
    p50: float
    p99: float
    mean: float
    min: float
    max: float

    @classmethod
    def of(cls, samples: Sequence[float]) -> Latency:
        return cls(n=len(samples), p50=percentile(samples, 50), p99=percentile(samples, 99),
                   mean=sum(samples) / len(samples), min=min(samples), max=max(samples))

    def as_dict(self) -> dict[str, float]:
        return asdict(self)


def gbps(nbytes: float, seconds: float) -> float:
    """Decimal gigabytes per second (10^9 bytes/s)."""
    if seconds <= 0:
        raise ValueError(f"throughput over a non-positive duration ({seconds} s)")
    return nbytes / seconds / 1e9


def better_ratio(ours: float | None, theirs: float | None, *, higher_is_better: bool) -> float | None:
    """Ours relative to theirs, oriented so that > 1 always means ours is better:
    theirs/ours for latencies (lower is better), ours/theirs for rates."""
    if ours is None or theirs is None or ours <= 0 or theirs <= 0:
        return None
    return ours / theirs if higher_is_better else theirs / ours


def fmt_seconds(s: float | None) -> str:
    """A duration at a readable scale: 850 ns, 123 µs, 4.56 ms, 1.23 s."""
    if s is None:
        return "-"
    if s < 1e-6:
        return f"{s * 1e9:.0f} ns"
    if s < 1e-3:
        return f"{s * 1e6:.0f} µs"
    if s < 1:
        return f"{s * 1e3:.2f} ms"
    return f"{s:.2f} s"


def fmt_rate(x: float | None, unit: str = "/s") -> str:
    """A rate with a k/M prefix: 950/s, 12.3k/s, 1.45M/s."""
    if x is None:
        return "-"
    if x >= 1e6:
        return f"{x / 1e6:.2f}M{unit}"
    if x >= 1e3:
        return f"{x / 1e3:.1f}k{unit}"
    return f"{x:.0f}{unit}"


def fmt_gbps(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f} GB/s"


def fmt_ratio(r: float | None) -> str:
    return "-" if r is None else f"{r:.2f}x"


def format_table(headers: Sequence[str], rows: Sequence[Sequence[str]],
                 align: str | None = None) -> str:
    """A plain-text table. `align` has one letter per column, 'l' or 'r' (default:
    first column left, the rest right). Rows must have as many cells as headers."""
    ncol = len(headers)
    align = align or "l" + "r" * (ncol - 1)
    if len(align) != ncol:
        raise ValueError(f"align has {len(align)} letters for {ncol} columns")
    for row in rows:
        if len(row) != ncol:
            raise ValueError(f"row {list(row)} has {len(row)} cells, the table has {ncol} columns")
    widths = [max(len(str(c)) for c in col) for col in zip(headers, *rows, strict=True)]

    def line(cells: Sequence[str]) -> str:
        out = [str(c).ljust(w) if a == "l" else str(c).rjust(w)
               for c, w, a in zip(cells, widths, align, strict=True)]
        return "  ".join(out).rstrip()

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([line(headers), rule, *(line(r) for r in rows)])
