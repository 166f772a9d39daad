"""Facts about the host this process runs on, shared by store nodes and clients."""

from __future__ import annotations


def boot_id() -> str:
    """This kernel boot's id: same-host clients compare it before mapping a segment."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return ""
