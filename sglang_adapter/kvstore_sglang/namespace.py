"""Object keys: which engines may share a page, and nothing else.

SGLang names a page by a hash string of its tokens (chained over the prefix). One
page of one rank is stored as `objects` objects, one per contiguous buffer the host
pool gives for it (`get_page_buffer_meta`: K and V for MHA, one for MLA), each under

    namespace digest (16 bytes) | SGLang's page key (UTF-8) | b"/" | object index

The namespace names everything else that must match for the bytes to be usable: the
model, the parallel shard (TP size and rank except for MLA, whose KV every TP rank
holds whole; PP, attention-CP, DCP), the host pool's page geometry (page size in tokens,
layout, dtype, layers, heads, head dims, bytes per object) and this package's format.
Engines with equal namespaces and equal page keys produce equal keys; any difference
gives disjoint keys, so a mismatched engine simply misses. The data-parallel rank is
not part of it: DP replicas of one model hold the same KV for the same tokens (with
DP attention, SGLang's tp_rank is already the rank inside the attention group), so
they share pages, as two engines do.

This module is pure: no SGLang, no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from kvstore_client.namespace import namespace_digest
from kvstore_sglang.errors import BadKey

# Bump when the bytes of an object change meaning.
FORMAT_VERSION = 1
# SGLang's page keys are 64 hex digits; longer ones would hit the store's key limit.
MAX_PAGE_KEY = 512


@dataclass(frozen=True)
class Shard:
    """The parallel identity of one rank's pages (from HiCacheStorageConfig)."""

    model: str
    mla: bool
    tp_size: int
    tp_rank: int  # -1 for MLA: every TP rank holds the same KV
    pp_size: int
    pp_rank: int
    cp_size: int
    cp_rank: int
    dcp_size: int
    dcp_rank: int

    @classmethod
    def of(cls, config: Any, model_id: str = "") -> Shard:
        """The shard of a HiCacheStorageConfig (SGLang's), `model_id` overriding its
        model name."""
        mla = bool(config.is_mla_model)
        return cls(model=model_id or (config.model_name or ""), mla=mla,
                   tp_size=config.tp_size, tp_rank=-1 if mla else config.tp_rank,
                   pp_size=config.pp_size, pp_rank=config.pp_rank,
                   cp_size=config.attn_cp_size, cp_rank=config.attn_cp_rank,
                   dcp_size=getattr(config, "dcp_size", 1), dcp_rank=getattr(config, "dcp_rank", 0))


@dataclass(frozen=True)
class Geometry:
    """What one page looks like in the host pool."""

    pool: str  # the host pool class
    layout: str
    dtype: str
    page_size: int  # tokens
    layers: str  # layer count and range this rank's pool holds
    heads: str  # head count and dims
    objects: int  # buffers per page
    object_bytes: int


@dataclass(frozen=True)
class Namespace:
    shard: Shard
    geometry: Geometry
    format_version: int = FORMAT_VERSION

    @property
    def digest(self) -> bytes:
        return namespace_digest(asdict(self))

    @property
    def page_bytes(self) -> int:
        return self.geometry.objects * self.geometry.object_bytes

    def describe(self) -> str:
        parts = {**asdict(self.shard), **asdict(self.geometry)}
        fields = " ".join(f"{k}={v}" for k, v in parts.items())
        return f"{fields} format={self.format_version} digest={self.digest.hex()}"


class KeyMaker:
    """Object keys of pages under one namespace (the digest is computed once)."""

    def __init__(self, namespace: Namespace) -> None:
        self.namespace = namespace
        self.objects = namespace.geometry.objects
        self._digest = namespace.digest
        self._tails = [b"/" + str(i).encode() for i in range(self.objects)]

    def page_keys(self, page_key: str) -> list[bytes]:
        if not isinstance(page_key, str) or not page_key:
            raise BadKey(f"a page key must be a non-empty str, got {page_key!r}")
        raw = page_key.encode()
        if len(raw) > MAX_PAGE_KEY:
            raise BadKey(f"page key of {len(raw)} bytes is longer than {MAX_PAGE_KEY}")
        base = self._digest + raw
        return [base + t for t in self._tails]

    def keys(self, page_keys: Sequence[str]) -> list[bytes]:
        out: list[bytes] = []
        for k in page_keys:
            out.extend(self.page_keys(k))
        return out
