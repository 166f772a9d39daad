"""The object checksum: XXH3-64 over the object's bytes.

Chosen for speed (tens of GB/s, so verifying every read costs far less than moving the
bytes) rather than cryptographic strength: it guards against torn, stale and misplaced
bytes, not against an attacker who can already write into a segment.
"""

from __future__ import annotations

import xxhash
from typing_extensions import Buffer


def checksum(data: Buffer) -> int:
    return xxhash.xxh3_64_intdigest(data)
