"""Object keys: what makes two engines' KV interchangeable, and nothing else.

An object is the KV of one layer for one block of `block_size` tokens, as one TP/PP
rank holds it. Its key is

    namespace digest (16 bytes) | chained block hash | layer tag (4 bytes)

The chained block hash (vLLM's `request.block_hashes`) already names the whole prefix
up to the end of the block, including any cache salt. The namespace digest names
everything else that must match for the bytes to be usable: the model's identity, the
KV dtype, the block size, the block-hash algorithm and its seed, the TP size and rank,
the PP size and rank, the KV layout and this package's object format. Two engines
with equal namespaces and equal prefixes produce equal keys; any difference in the
namespace gives disjoint keys, so a mismatched engine simply misses.

This module is pure: no vLLM, no I/O.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace

from kvstore_client.namespace import namespace_digest

# Bump when the bytes of an object change meaning (layout of a page, what an object
# spans). Old objects then stop matching instead of being misread.
FORMAT_VERSION = 1

LAYER_TAG_BYTES = 4


@dataclass(frozen=True)
class Namespace:
    """The identity of one rank's KV objects (see the module docstring)."""

    model: str  # name or path, plus a fingerprint of the weights' description
    revision: str
    kv_dtype: str
    block_size: int
    hash_algo: str
    hash_seed: str  # a digest of the seed, never the seed itself
    tp_size: int
    tp_rank: int
    pp_size: int
    pp_rank: int
    layout: str  # the engine's KV cache layout and page geometry
    format_version: int = FORMAT_VERSION

    def for_rank(self, tp_rank: int, pp_rank: int) -> Namespace:
        return replace(self, tp_rank=tp_rank, pp_rank=pp_rank)

    @property
    def digest(self) -> bytes:
        return namespace_digest(asdict(self))

    def describe(self) -> str:
        """One line for the start-up log: every field and the digest."""
        fields = " ".join(f"{k}={v}" for k, v in asdict(self).items())
        return f"{fields} digest={self.digest.hex()}"


def layer_tag(layer_name: str) -> bytes:
    return hashlib.blake2b(layer_name.encode(), digest_size=LAYER_TAG_BYTES).digest()


def seed_digest(seed: str) -> str:
    return hashlib.sha256(seed.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class RankLayers:
    """The layers one (tp, pp) rank holds, in the order its keys are listed."""

    namespace: Namespace
    layers: tuple[str, ...]

    def keys(self, block_hash: bytes) -> list[bytes]:
        prefix = self.namespace.digest + bytes(block_hash)
        return [prefix + layer_tag(name) for name in self.layers]


class KeyPlan:
    """Keys for a list of blocks across every rank that must hold them.

    The scheduler looks up all ranks' keys of a block together (a block is a hit only
    if every rank can load its share); a worker reads and writes only its own rank's.
    Keys are listed block-major, so the store's "longest contiguous prefix" counts
    whole blocks once divided by `keys_per_block`.
    """

    def __init__(self, ranks: Sequence[RankLayers]) -> None:
        if not ranks or not all(r.layers for r in ranks):
            raise ValueError("a key plan needs at least one rank with at least one layer")
        self.ranks = tuple(ranks)
        # Digests are cached: computing one hashes the namespace's JSON.
        self._prefixes = [(r.namespace.digest, [layer_tag(n) for n in r.layers]) for r in ranks]
        self.keys_per_block = sum(len(r.layers) for r in ranks)

    def block_keys(self, block_hash: bytes) -> list[bytes]:
        out: list[bytes] = []
        h = bytes(block_hash)
        for digest, tags in self._prefixes:
            base = digest + h
            out.extend(base + t for t in tags)
        return out

    def keys(self, block_hashes: Sequence[bytes]) -> list[bytes]:
        out: list[bytes] = []
        for h in block_hashes:
            out.extend(self.block_keys(h))
        return out

    def whole_blocks(self, key_count: int) -> int:
        return key_count // self.keys_per_block


def block_hashes_for_blocks(request_hashes: Sequence[bytes], block_size: int,
                            hash_block_size: int) -> list[bytes]:
    """One hash per full block: the chained hash at the block's last hash unit."""
    if hash_block_size <= 0 or block_size % hash_block_size:
        raise ValueError(f"block size {block_size} is not a multiple of the hash block size "
                         f"{hash_block_size}")
    ratio = block_size // hash_block_size
    if ratio == 1:
        return [bytes(h) for h in request_hashes]
    n = len(request_hashes) // ratio
    return [bytes(request_hashes[(i + 1) * ratio - 1]) for i in range(n)]
