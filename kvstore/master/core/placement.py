"""Where new replicas go: distinct nodes, the emptiest first.

Preferring the node with the most free bytes spreads load and keeps the nodes' fill
levels close, so one node does not start evicting while others sit empty. Placement
only allocates; whether to evict to make room is the caller's decision.
"""

from __future__ import annotations

from collections.abc import Iterable

from .segments import Segment


def place(
    candidates: Iterable[Segment], size: int, want: int, exclude: Iterable[str] = ()
) -> list[tuple[Segment, int]]:
    """Allocate up to `want` replicas of `size` bytes on distinct nodes.

    Returns (segment, offset) for each replica placed (taken: Segment.take); fewer than `want` (possibly
    none) when the other nodes have no extent large enough.
    """
    taken = set(exclude)
    placed: list[tuple[Segment, int]] = []
    if want == 1 and not taken:
        # The common case: one replica, no sort.
        best: Segment | None = None
        for seg in candidates:
            if seg.alloc.largest_free() >= size and (
                best is None or seg.alloc.free_bytes > best.alloc.free_bytes
            ):
                best = seg
        if best is not None:
            placed.append((best, best.take(size)))
        return placed
    for seg in sorted(candidates, key=lambda s: s.alloc.free_bytes, reverse=True):
        if seg.node_id in taken:
            continue
        offset = seg.take(size)
        if offset < 0:
            continue
        placed.append((seg, offset))
        taken.add(seg.node_id)
        if len(placed) == want:
            break
    return placed
