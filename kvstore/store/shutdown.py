"""A clean stop keeps the cache: a node stopped with SIGTERM (systemd's stop or restart,
a rolling upgrade) writes the objects its DRAM holds to its SSD tier before it leaves.

The next start re-indexes them with the rest of the tier and the leader adopts them (see
docs/ssd.md), so a node restarted at once comes back with its whole cache, not only what
had been demoted. Without this, a rolling restart of every node loses every object that
was still in DRAM.

Bounded by a deadline (`--shutdown-flush`, seconds): a service manager kills a process
that takes longer than its stop timeout, and a flush cut short by SIGKILL keeps only what
was synced. What is written by the deadline is synced and kept; the rest is lost as it
was before. The flush never evicts SSD objects to make room: once the next object does
not fit in the tier's free bytes, it stops.

It uses the tier's public API only (put without fsync, then one sync: group commit),
and reads the DRAM copies through the inventory the leader keeps on the node: those are
the committed objects (every file is checksummed as it is written, so a range a stale
inventory entry points at is refused, never stored).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from kvstore.errors import CorruptObject, KVStoreError
from kvstore.store.inventory import Held
from kvstore.store.ssd import SsdTier

log = logging.getLogger(__name__)

# Per object on disk beyond its bytes: the file header and the key, rounded up to the
# tier's block (ssd_format's worst case). Used only to stop before the cap would evict.
_OVERHEAD = 64 + 1024
_BLOCK = 4096


@dataclass(frozen=True, slots=True)
class FlushReport:
    written: int = 0  # objects written to the SSD tier now
    written_bytes: int = 0
    already: int = 0  # already on the SSD tier (a demoted or promoted copy)
    corrupt: int = 0  # the DRAM range no longer matched its checksum: not stored
    left: int = 0  # not written: the deadline came, the tier filled, or it failed
    seconds: float = 0.0
    why_left: str = ""  # "", "deadline", "full", or the tier's error


def _room(size: int, key: bytes) -> int:
    return -(-(size + len(key) + _OVERHEAD) // _BLOCK) * _BLOCK


def flush_to_ssd(held: Sequence[tuple[bytes, Held]], view: memoryview, ssd: SsdTier,
                 budget: float, clock: Callable[[], float] = time.monotonic) -> FlushReport:
    """Write the DRAM objects `held` (read from the segment `view`) to `ssd` within
    `budget` seconds, then sync once. Blocking: run it in a worker thread."""
    started = clock()
    deadline = started + budget
    written = written_bytes = already = corrupt = 0
    why = ""
    stats = ssd.stats()
    free = stats.capacity_bytes - stats.used_bytes
    done = 0
    for key, h in held:
        if clock() >= deadline:
            why = "deadline"
            break
        if ssd.contains(key):
            already += 1
            done += 1
            continue
        need = _room(h.size, key)
        if need > free:
            why = "full"
            break
        end = h.offset + h.size
        if h.size <= 0 or end > len(view):
            corrupt += 1
            done += 1
            continue
        part = view[h.offset:end]
        try:
            ssd.put(key, part, h.checksum, sync=False)
        except CorruptObject:
            corrupt += 1  # a stale entry: its range holds other bytes now
        except KVStoreError as exc:
            why = exc.message
            break
        else:
            written += 1
            written_bytes += h.size
            free -= need
        finally:
            part.release()
        done += 1
    try:
        ssd.sync()
    except KVStoreError as exc:  # the tier deleted what the failed flush covered
        why, written, written_bytes = exc.message, 0, 0
    return FlushReport(written, written_bytes, already, corrupt, len(held) - done,
                       clock() - started, why)


def log_report(node_id: str, report: FlushReport, budget: float) -> None:
    if report.left == 0:
        log.info("node %s: wrote %d DRAM objects (%d bytes) to its SSD tier before stopping "
                 "(%d were there already) in %.2f s; a restart brings them back", node_id,
                 report.written, report.written_bytes, report.already, report.seconds)
        return
    why = {"deadline": f"the --shutdown-flush deadline ({budget:g} s) came",
           "full": "the SSD tier is full"}.get(report.why_left, report.why_left)
    log.warning("node %s: wrote %d DRAM objects (%d bytes) to its SSD tier before stopping; "
                "%d were not written because %s, and are lost with this process", node_id,
                report.written, report.written_bytes, report.left, why)
