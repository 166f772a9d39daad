"""The one object check of the core: what a usable size and checksum are, for every verb.

A size is an int > 0; a checksum an int in [0, MAX_CHECKSUM), the store's 64-bit
unsigned checksum. Both must be exactly `int`: a bool is an int to Python, but True
is neither a size nor a checksum anyone computed, so it is refused like any other
wrong type (the batch path compares types, and the per-key path must agree with it,
or the twin test's two cores answer differently). keys.py holds the key check.
"""

from __future__ import annotations

from collections.abc import Sequence

MAX_CHECKSUM = 1 << 64


def is_size(size: object) -> bool:
    return type(size) is int and size > 0


def is_checksum(checksum: object) -> bool:
    return type(checksum) is int and 0 <= checksum < MAX_CHECKSUM


def bad_object(size: object, checksum: object) -> str | None:
    """Why an object of this size and checksum is refused; None if it is not."""
    if not is_size(size):
        return f"object size must be > 0 bytes, got {size}"
    if not is_checksum(checksum):
        return f"checksum must be an unsigned 64-bit integer, got {checksum}"
    return None


def all_objects(sizes: Sequence[object], checksums: Sequence[object], largest: int) -> bool:
    """True when is_size and is_checksum hold for every size and checksum and no size
    is above `largest`, checked without a Python-level loop (batches are up to
    max_batch keys); False for an empty batch."""
    try:
        return (
            bool(sizes)
            and set(map(type, sizes)) == {int}
            and set(map(type, checksums)) == {int}
            and min(sizes) > 0 and max(sizes) <= largest  # type: ignore[type-var,operator]
            and min(checksums) >= 0 and max(checksums) < MAX_CHECKSUM  # type: ignore[type-var,operator]
        )
    except TypeError:
        return False
