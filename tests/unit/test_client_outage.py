"""The adapters' outage rule (kvstore_client.outage): misses for retry_interval after a
failure, one warning per outage, one line when the store answers again."""

from __future__ import annotations

import hashlib
import json

from kvstore.clock import ManualClock
from kvstore_client.namespace import namespace_digest
from kvstore_client.outage import Outage


def test_a_failure_makes_the_store_down_for_retry_interval() -> None:
    clock = ManualClock()
    o = Outage(5.0, clock)
    assert not o.down and o.reason == ""
    assert o.fail("etcd unreachable")           # opens the outage
    assert o.down and o.reason == "etcd unreachable"
    clock.advance(4.9)
    assert o.down
    clock.advance(0.2)
    assert not o.down                            # tried again now
    assert not o.fail("still unreachable")       # the same outage: no second warning
    assert o.down and o.reason == "still unreachable"
    clock.advance(5.1)
    assert o.answered()                          # over: the caller says so once
    assert not o.answered() and o.reason == ""
    assert o.fail("down again")                  # a new outage warns again


def test_retry_interval_zero_is_never_down() -> None:
    o = Outage(0.0, ManualClock())
    o.fail("x")
    assert not o.down


def test_namespace_digest_is_the_canonical_json_blake2b() -> None:
    """Changing the canonical form would change every stored key: pinned here."""
    fields = {"b": 1, "a": {"y": [1, 2], "x": "s"}}
    canon = b'{"a":{"x":"s","y":[1,2]},"b":1}'
    assert namespace_digest(fields) == hashlib.blake2b(canon, digest_size=16).digest()
    assert json.dumps(fields, sort_keys=True, separators=(",", ":")).encode() == canon
    assert len(namespace_digest(fields, size=8)) == 8
    assert namespace_digest({**fields, "b": 2}) != namespace_digest(fields)
