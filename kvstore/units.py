"""Byte sizes as people write them on command lines: 512MiB, 4GiB, 100GB, 65536."""

from __future__ import annotations

import re

from kvstore.errors import InvalidArgument

_UNITS = {
    "": 1, "b": 1,
    "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3, "gb": 1000**3,
    "t": 1000**4, "tb": 1000**4,
    "ki": 1024, "kib": 1024, "mi": 1024**2, "mib": 1024**2, "gi": 1024**3, "gib": 1024**3,
    "ti": 1024**4, "tib": 1024**4,
}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")


def parse_size(text: str) -> int:
    m = _SIZE.match(text)
    unit = m.group(2).lower() if m else ""
    if not m or unit not in _UNITS:
        raise InvalidArgument(f"cannot read {text!r} as a size; write e.g. 512MiB, 4GiB or 1000000")
    return int(float(m.group(1)) * _UNITS[unit])


def format_size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"
