"""What a client counts (`client.stats`): its flows and its data path add to it."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class ClientStats:
    puts: int = 0
    gets: int = 0
    hits: int = 0
    bytes_written: int = 0
    bytes_read: int = 0
    corrupt_reads: int = 0
    local_transfers: int = 0  # objects moved by the same-host fast path
    early_reads: int = 0  # objects read while asking, kept (the answer confirmed them)
    early_wasted: int = 0  # objects read while asking, thrown away (moved or gone)
    one_call_puts: int = 0  # objects put into space started ahead (one control call)
    recorded_puts: int = 0  # of those, committed with their put record (no node wait)
    ssd_waits: int = 0  # objects a read waited for while they came back from SSD
    failovers: int = 0
    put_retries: int = 0  # objects put again after a failed transfer (a node down)
    errors: dict[str, int] = field(default_factory=dict)
