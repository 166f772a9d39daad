"""Which SGLang ranks share pages (pure: SGLang's storage config, no store)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from kvstore_sglang.errors import BadKey
from kvstore_sglang.namespace import Geometry, KeyMaker, Namespace, Shard
from tests.sglang.helpers import storage_config

GEOMETRY = Geometry(pool="MHATokenToKVPoolHost", layout="page_first", dtype="torch.float16",
                    page_size=16, layers="layer_num=2", heads="head_num=2,head_dim=64",
                    objects=2, object_bytes=8192)


def digest(**config: object) -> bytes:
    return Namespace(Shard.of(storage_config("x", **config)), GEOMETRY).digest  # type: ignore[arg-type]


def test_mha_tp_ranks_do_not_share_mla_tp_ranks_do() -> None:
    assert digest(tp_rank=0, tp_size=2) != digest(tp_rank=1, tp_size=2)
    assert digest(tp_rank=0, tp_size=2, mla=True) == digest(tp_rank=1, tp_size=2, mla=True)
    assert digest(tp_size=2, mla=True) != digest(tp_size=4, mla=True)  # another sharding


def test_dp_replicas_share_and_pp_cp_ranks_do_not() -> None:
    base = storage_config("x", tp_rank=1, tp_size=2)
    ns = Namespace(Shard.of(base), GEOMETRY).digest
    assert Namespace(Shard.of(replace(base, dp_rank=3)), GEOMETRY).digest == ns
    assert Namespace(Shard.of(replace(base, pp_size=2, pp_rank=1)), GEOMETRY).digest != ns
    assert Namespace(Shard.of(replace(base, attn_cp_size=2, attn_cp_rank=1)), GEOMETRY).digest != ns


@pytest.mark.parametrize("field,value", [("page_size", 32), ("layout", "page_first_direct"),
                                         ("dtype", "torch.bfloat16"), ("object_bytes", 4096),
                                         ("layers", "layer_num=4"), ("objects", 1)])
def test_any_difference_in_the_page_geometry_gives_other_keys(field: str, value: object) -> None:
    shard = Shard.of(storage_config("x"))
    a = KeyMaker(Namespace(shard, GEOMETRY)).page_keys("ab" * 32)
    b = KeyMaker(Namespace(shard, replace(GEOMETRY, **{field: value}))).page_keys("ab" * 32)
    assert not set(a) & set(b)


def test_keys_are_namespace_page_key_and_object_index() -> None:
    maker = KeyMaker(Namespace(Shard.of(storage_config("x")), GEOMETRY))
    k, v = maker.page_keys("ab" * 32)
    assert k == maker.namespace.digest + b"ab" * 32 + b"/0"
    assert v.endswith(b"/1")
    assert maker.keys(["a", "b"]) == maker.page_keys("a") + maker.page_keys("b")
    for bad in ("", None, 7, "x" * 600):
        with pytest.raises(BadKey):
            maker.page_keys(bad)  # type: ignore[arg-type]


def test_the_namespace_digest_is_unchanged() -> None:
    """Keys already in a store stay readable: the digest (kvstore_client.namespace) of a
    fixed namespace is pinned."""
    ns = Namespace(Shard("m", False, 2, 1, 1, 0, 1, 0, 1, 0), GEOMETRY)
    assert ns.digest.hex() == "2cf40ea50fce78c5e1e7f6512e7f4022"
