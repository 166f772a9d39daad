"""Object life in the master core: PENDING -> COMPLETE -> gone, and bad input."""

from __future__ import annotations

import math

import pytest

from kvstore.errors import Code, InvalidArgument
from kvstore.master.core import (
    CoreConfig,
    EventKind,
    ManualClock,
    MasterCore,
    PutStartResult,
)

MiB = 1 << 20


def make(nodes: int = 1, seg_size: int = MiB, **cfg: object) -> tuple[MasterCore, ManualClock]:
    clock = ManualClock()
    core = MasterCore(CoreConfig(**cfg), clock)  # type: ignore[arg-type]
    for i in range(nodes):
        core.mount_segment(f"n{i}", f"127.0.0.1:{15000 + i}", (i + 1) << 32, seg_size)
    return core, clock


def ks(n: int, prefix: bytes = b"k") -> list[bytes]:
    return [prefix + b"%05d" % i for i in range(n)]


def start(
    core: MasterCore, keys: list[bytes], size: int = 1024, writer: str = "", replicas: int | None = None
) -> list[PutStartResult]:
    return core.put_start(keys, [size] * len(keys), [0xABCD] * len(keys), replicas, writer)


def put(core: MasterCore, keys: list[bytes], size: int = 1024) -> None:
    assert all(r.code == Code.OK for r in start(core, keys, size))
    assert core.put_end(keys) == [Code.OK] * len(keys)


def test_pending_is_invisible_until_put_end() -> None:
    core, _ = make()
    [r] = start(core, [b"a"], writer="w1")
    assert r.code == Code.OK and len(r.locations) == 1
    loc = r.locations[0]
    assert (loc.node_id, loc.segment, loc.addr, loc.size, loc.tier) == (
        "n0",
        "127.0.0.1:15000",
        1 << 32,
        1024,
        "dram",
    )
    assert core.exists([b"a"]) == [False]
    assert core.lookup([b"a"]).count == 0
    g = core.get_replicas([b"a"])
    assert g.lease_id == 0 and g.results[0].code == Code.NOT_FOUND
    info = core.inspect(b"a")
    assert info is not None and info.state == "pending" and info.writer == "w1"
    assert core.stats().objects_pending == 1

    assert core.put_end([b"a"], writer="w1") == [Code.OK]
    assert core.exists([b"a"]) == [True]
    info = core.inspect(b"a")
    assert info is not None and info.state == "complete" and info.locations == [loc]
    st = core.stats()
    assert (st.objects_pending, st.objects_complete, st.bytes_complete) == (0, 1, 1024)


def test_put_of_a_complete_key_is_already_exists_and_allocates_nothing() -> None:
    core, _ = make()
    put(core, [b"a"])
    used = core.stats().pool_used
    [r] = start(core, [b"a"])
    assert r.code == Code.ALREADY_EXISTS and r.locations == []
    assert core.stats().pool_used == used


def test_put_of_a_pending_key_is_in_progress_except_for_its_own_retry() -> None:
    core, _ = make()
    [first] = start(core, [b"a"], writer="w1")
    [other] = start(core, [b"a"], writer="w2")
    assert other.code == Code.IN_PROGRESS and "w1" in other.message
    [retry] = start(core, [b"a"], writer="w1")  # reply lost, same writer asks again
    assert retry.code == Code.OK and retry.locations == first.locations
    assert core.stats().objects_pending == 1
    assert core.stats().put_failures == {"in_progress": 1}
    # A named writer cannot commit or revoke another's object; anonymous callers may.
    assert core.put_end([b"a"], writer="w2") == [Code.IN_PROGRESS]
    assert core.put_revoke([b"a"], writer="w2") == [Code.IN_PROGRESS]
    assert core.put_end([b"a"]) == [Code.OK]


def test_duplicate_keys_in_one_batch_allocate_once() -> None:
    core, _ = make()
    rs = start(core, [b"a", b"a", b"b", b"a"])
    assert [r.code for r in rs] == [Code.OK] * 4
    assert rs[0] is rs[1] is rs[3]
    assert rs[0].locations != rs[2].locations
    assert core.stats().pool_used == 2 * 1024
    assert core.put_end([b"a", b"b", b"a"]) == [Code.OK] * 3
    assert core.put_end([b"a"]) == [Code.ALREADY_EXISTS]  # an idempotent retry
    assert core.remove([b"a", b"a"]) == [Code.OK, Code.OK]


def test_put_end_codes() -> None:
    core, _ = make()
    assert core.put_end([b"never"]) == [Code.NOT_FOUND]
    assert core.put_end([b""]) == [Code.INVALID_ARGUMENT]
    put(core, [b"a"])
    assert core.put_end([b"a"]) == [Code.ALREADY_EXISTS]


def test_put_revoke_frees_space_and_the_key() -> None:
    core, _ = make()
    [r] = start(core, [b"a"])
    assert core.put_revoke([b"a"]) == [Code.OK]
    assert core.stats().pool_used == 0 and core.inspect(b"a") is None
    assert core.put_end([b"a"]) == [Code.NOT_FOUND]
    assert core.put_revoke([b"a"]) == [Code.NOT_FOUND]
    [again] = start(core, [b"a"])
    assert again.code == Code.OK and again.locations == r.locations
    core.put_end([b"a"])
    assert core.put_revoke([b"a"]) == [Code.ALREADY_EXISTS]
    assert core.exists([b"a"]) == [True]


def test_zombie_pending_is_reclaimed_after_put_timeout() -> None:
    core, clock = make(put_timeout=30.0)
    [r] = start(core, [b"z"], writer="crashed")
    start(core, [b"y"])
    clock.advance(29.9)
    assert core.tick().reclaimed == 0
    assert core.inspect(b"z") is not None
    clock.advance(0.1)
    report = core.tick()
    assert report.reclaimed == 2
    st = core.stats()
    assert (st.objects_pending, st.pool_used, st.pool_pending, st.reclaimed_pending) == (0, 0, 0, 2)
    [ev] = core.take_events()
    assert ev.kind == EventKind.RECLAIMED and ev.keys == [b"z", b"y"] and ev.bytes == 2048
    assert core.put_end([b"z"], writer="crashed") == [Code.NOT_FOUND]
    [again] = start(core, [b"z"], writer="new")
    assert again.code == Code.OK and again.locations == r.locations


def test_reclaim_is_in_start_order_and_spares_committed_objects() -> None:
    core, clock = make(put_timeout=10.0)
    start(core, [b"a"])
    clock.advance(5)
    start(core, [b"b"])
    core.put_end([b"a"])
    clock.advance(5)
    assert core.tick().reclaimed == 0  # a committed; b has 5 s left
    clock.advance(5)
    assert core.tick().reclaimed == 1
    assert core.exists([b"a", b"b"]) == [True, False]


def test_bad_sizes_and_checksums_are_per_key_errors() -> None:
    core, _ = make(seg_size=MiB)
    rs = core.put_start(
        [b"zero", b"neg", b"huge", b"ok", b"sum"],
        [0, -5, 2 * MiB, 10, 10],
        [1, 1, 1, 1, -1],
    )
    assert [r.code for r in rs] == [
        Code.INVALID_ARGUMENT,
        Code.INVALID_ARGUMENT,
        Code.STORE_FULL,
        Code.OK,
        Code.INVALID_ARGUMENT,
    ]
    assert rs[2].message == (f"object of {2 * MiB} bytes is larger than the largest segment ({MiB} bytes)")
    assert "size must be > 0" in rs[0].message
    assert core.stats().put_failures == {"invalid_argument": 3, "too_large": 1}
    assert core.stats().objects_pending == 1


def test_a_bool_is_neither_a_size_nor_a_checksum_on_any_path() -> None:
    # One object check (checks.py) for put_start's both paths, put_commit and adoption:
    # True is an int to Python, never a size or a checksum anyone computed.
    core, _ = make(seg_size=MiB)
    for keys in ([b"one"], [b"a", b"b", b"c"]):  # a lone key, and a batch
        sizes: list[object] = [True] + [10] * (len(keys) - 1)
        rs = core.put_start(keys, sizes, [1] * len(keys))  # type: ignore[arg-type]
        assert rs[0].code == Code.INVALID_ARGUMENT and "size must be > 0" in rs[0].message
        rs = core.put_start([k + b"!" for k in keys], [10] * len(keys),
                            [True] + [1] * (len(keys) - 1))
        assert rs[0].code == Code.INVALID_ARGUMENT and "checksum" in rs[0].message
    ph = core.put_start([b"ph/1"], [10], [0], writer="w", ahead=True)
    assert ph[0].code == Code.OK
    assert core.put_commit([b"ph/1"], [b"x"], [10], [True], "w") == [Code.INVALID_ARGUMENT]
    assert core.put_commit([b"ph/1"], [b"x"], [10], [5], "w") == [Code.OK]
    node = core.node_ids()[0]
    assert core.adopt_replica(b"y", 64, True, node, 4096) == Code.INVALID_ARGUMENT
    assert core.adopt_replica(b"y", True, 5, node, 4096) == Code.INVALID_ARGUMENT
    assert core.adopt_replica(b"y", 64, 5, node, 4096) == Code.OK


def test_bad_keys_are_per_key_errors() -> None:
    core, _ = make()
    rs = core.put_start(
        [b"", b"x" * 2000, "text", bytearray(b"ba"), b"ok"],  # type: ignore[list-item]
        [8] * 5,
        [0] * 5,
    )
    assert [r.code for r in rs] == [Code.INVALID_ARGUMENT] * 3 + [Code.OK, Code.OK]
    assert "empty key" in rs[0].message and "1024-byte limit" in rs[1].message
    assert core.put_end([b"ba", b"ok"]) == [Code.OK, Code.OK]
    assert core.exists([b"ba", b"", "text"]) == [True, False, False]  # type: ignore[list-item]


def test_no_dram_segment_yet_is_unavailable_not_store_full() -> None:
    core = MasterCore(CoreConfig(), ManualClock())
    [r] = start(core, [b"a"])
    assert r.code == Code.UNAVAILABLE and "no store node has mounted" in r.message
    assert "yet" in r.message  # retryable: nothing is full


def test_malformed_batches_raise_and_change_nothing() -> None:
    core, _ = make(max_batch=4)
    put(core, [b"a"])
    before = core.stats()
    with pytest.raises(InvalidArgument):
        core.put_start([b"x", b"y"], [1], [1, 1])
    with pytest.raises(InvalidArgument):
        core.put_start([b"x", b"y"], [1, 1], [1])
    with pytest.raises(InvalidArgument):
        start(core, ks(5))
    with pytest.raises(InvalidArgument):
        start(core, [b"x"], replicas=9)
    with pytest.raises(InvalidArgument):
        start(core, [b"x"], replicas=-1)
    for verb in (core.put_end, core.put_revoke, core.exists, core.lookup, core.remove, core.get_replicas):
        with pytest.raises(InvalidArgument):
            verb(ks(5))  # type: ignore[operator]
    assert core.stats() == before


def test_remove() -> None:
    core, _ = make()
    put(core, [b"a", b"b", b"c"])
    start(core, [b"p"])
    core.lookup([b"b"])
    assert core.remove([b"a", b"missing", b"p", b"b"]) == [
        Code.OK,
        Code.NOT_FOUND,
        Code.IN_PROGRESS,
        Code.IN_PROGRESS,
    ]
    assert core.exists([b"a", b"b"]) == [False, True]
    [ev] = core.take_events()
    assert ev.kind == EventKind.REMOVED and ev.keys == [b"a"] and ev.bytes == 1024
    assert core.remove([b"p"], force=True) == [Code.OK]
    assert core.put_end([b"p"]) == [Code.NOT_FOUND]
    assert core.stats().pool_used == 2 * 1024


def test_force_removed_pinned_object_fails_its_lease_never_aliases() -> None:
    core, _ = make()
    put(core, [b"a", b"b"])
    old = core.lookup([b"a", b"b"])
    assert core.remove([b"a"], force=True) == [Code.OK]
    assert core.stats().pool_pinned == 1024  # only b
    # Same key written again, most likely into the same slot and bytes.
    put(core, [b"a"])
    other = core.lookup([b"a"])
    g = core.get_replicas([b"a", b"b"], lease_id=old.lease_id)
    assert [r.code for r in g.results] == [Code.NOT_FOUND, Code.OK]
    # Releasing the old lease must not unpin the new object held by the other lease.
    core.release_lease(old.lease_id)
    info = core.inspect(b"a")
    assert info is not None and info.pins == 1
    core.release_lease(other.lease_id)
    assert core.stats().pool_pinned == 0


def test_keys_and_inspect() -> None:
    core, clock = make()
    put(core, [b"b2", b"a1", b"b1", b"c"])
    start(core, [b"b0"])
    assert core.keys(b"b") == [b"b0", b"b1", b"b2"]
    assert core.keys(limit=2) == [b"a1", b"b0"]
    assert core.keys(b"zz") == []
    with pytest.raises(InvalidArgument):
        core.keys(limit=-1)
    clock.advance(3)
    core.lookup([b"c"])
    info = core.inspect(b"c")
    assert info is not None
    assert (info.pins, info.created, info.last_access, info.checksum) == (1, 1000.0, 1003.0, 0xABCD)
    assert core.inspect(b"nope") is None


def test_config_is_validated() -> None:
    for bad in (
        {"evict_low": 0.9, "evict_high": 0.9},
        {"evict_low": 0.0},
        {"evict_high": 1.5},
        {"default_lease_ttl": 0},
        {"default_lease_ttl": 400},
        {"put_timeout": -1},
        {"alignment": 48},
        {"alignment": 4},
        {"default_replicas": 0},
        {"default_replicas": 9},
        {"max_batch": 0},
        {"max_lease_ttl": math.nan},
    ):
        with pytest.raises(InvalidArgument):
            CoreConfig(**bad)  # type: ignore[arg-type]
    CoreConfig(evict_high=1.0, evict_low=0.5, alignment=8)


def test_events_are_bounded() -> None:
    core, _ = make(max_events=2)
    for k in (b"a", b"b", b"c"):
        put(core, [k])
        core.remove([k])
    assert [e.keys for e in core.take_events()] == [[b"b"], [b"c"]]
    assert core.stats().events_dropped == 1
    assert core.take_events() == []
