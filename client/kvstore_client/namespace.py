"""The namespace digest the engine adapters put at the front of every object key.

An adapter describes what makes two engines' bytes interchangeable (model, parallel
shard, page geometry, its own format version) as plain fields; equal descriptions give
equal digests, any difference gives another digest, so a mismatched engine misses
instead of misreading. The canonical form is JSON with sorted keys and no blanks:
changing it would change every key already stored.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

NAMESPACE_BYTES = 16


def namespace_digest(fields: Mapping[str, Any], size: int = NAMESPACE_BYTES) -> bytes:
    """The digest of a namespace's fields (JSON-serializable values, nested allowed)."""
    canon = json.dumps(dict(fields), sort_keys=True, separators=(",", ":"))
    return hashlib.blake2b(canon.encode(), digest_size=size).digest()
