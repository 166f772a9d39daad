"""bench.shard_sim, the projection of a sharded control plane: its queues, fan-out and
closed loop behave as the model says (seeded, so every figure here is reproducible)."""

from __future__ import annotations

import random

import pytest

from bench import shard_sim
from bench.shard_sim import Model, simulate, split


def model(**kw: object) -> Model:
    base: dict[str, object] = {"shards": 1, "batch": 128, "kinds": [("lookup", 1.0, 0)],
                               "calls": 2000, "seed": 7}
    base.update(kw)
    return Model(**base)  # type: ignore[arg-type]


def test_one_shard_at_low_load_is_the_service_time_plus_the_round_trip() -> None:
    # One client, long pauses between calls: no queue ever forms, fixed service times.
    m = model(clients=1, think_us=10_000.0, service_cv=0.0, call_us=30.0,
              key_us={"lookup": 0.5}, rtt_us=20.0, send_us=10.0, read_us=10.0)
    r = simulate(m)
    expected = (20.0 + 30.0 + 128 * 0.5) * 1e-6
    assert r.touched == 1.0
    assert r.lat.p50 == pytest.approx(expected)
    assert r.lat.p99 == pytest.approx(expected)
    assert r.busy < 0.05 and r.bound == "clients"


def test_a_put_is_two_fan_outs_in_a_row() -> None:
    m = model(kinds=[("put", 1.0, 64)], clients=1, think_us=10_000.0, service_cv=0.0,
              call_us=30.0, key_us={"put": 10.0}, rtt_us=20.0)
    r = simulate(m)
    # PutStart, then PutEnd: two round trips, two messages, the per-key cost split over them
    assert r.lat.p50 == pytest.approx((2 * (20.0 + 30.0) + 64 * 10.0) * 1e-6)


def test_a_batch_of_one_key_touches_one_shard() -> None:
    for n in (1, 4, 64):
        r = simulate(model(shards=n, batch=1, clients=4, service_cv=0.0))
        assert r.touched == 1.0
    rng = random.Random(1)
    assert len(split(rng, 64, 1, "hash")) == 1
    assert len(split(rng, 64, 1, "even")) == 1


def test_a_batch_touches_at_most_min_of_shards_and_keys() -> None:
    rng = random.Random(3)
    for n, b in ((4, 128), (64, 16), (64, 128), (8, 8)):
        for spread in ("hash", "even"):
            parts = split(rng, n, b, spread)
            assert len(parts) <= min(n, b)
            assert sum(k for _, k in parts) == b
            assert len({s for s, _ in parts}) == len(parts)
            assert all(0 <= s < n for s, _ in parts)
        assert len(split(rng, n, b, "even")) == min(n, b)
    # 128 hashed keys over 4 shards: every shard is hit
    assert len(split(rng, 4, 128, "hash")) == 4


def test_throughput_grows_with_shards_until_the_clients_bind() -> None:
    # Per-key work dominates, so splitting a batch relieves the shards; two clients can
    # keep only so many calls in flight.
    base = {"clients": 2, "batch": 64, "call_us": 1.0, "key_us": {"lookup": 10.0},
            "rtt_us": 50.0, "send_us": 0.25, "read_us": 0.25}
    rs = {n: simulate(model(shards=n, **base)) for n in (1, 2, 4, 64)}
    assert rs[1].bound == "shards"
    assert rs[1].calls_per_s < rs[2].calls_per_s < rs[4].calls_per_s < rs[64].calls_per_s
    assert rs[64].bound == "clients" and rs[64].busy < 0.5
    # Little's law in a closed loop without pauses: clients = rate x mean latency
    for r in rs.values():
        assert r.calls_per_s * r.mean_s == pytest.approx(2, rel=0.02)


def test_the_shards_bind_when_the_clients_are_many() -> None:
    r1 = simulate(model(shards=1, clients=64))
    r8 = simulate(model(shards=8, clients=64))
    assert r1.bound == "shards" and r8.bound == "shards"
    assert r8.calls_per_s > r1.calls_per_s
    # one shard saturated: a call every (per message + 128 per key) of service
    per_call = (shard_sim.DEFAULT_CALL_US + 128 * shard_sim.KINDS["lookup"].key_us) * 1e-6
    assert r1.calls_per_s == pytest.approx(1 / per_call, rel=0.1)


def test_open_loop_below_capacity_keeps_the_shards_partly_busy() -> None:
    r = simulate(model(shards=4, rate=5000.0))
    assert r.bound == "arrivals"
    assert r.calls_per_s == pytest.approx(5000.0, rel=0.1)
    assert 0.05 < r.busy < 0.9


def test_the_same_seed_gives_the_same_projection() -> None:
    a = simulate(model(shards=8, clients=16))
    b = simulate(model(shards=8, clients=16))
    c = simulate(model(shards=8, clients=16, seed=8))
    assert (a.calls_per_s, a.lat.p99, a.touched) == (b.calls_per_s, b.lat.p99, b.touched)
    assert a.lat.p99 != c.lat.p99


def test_mixes_and_bad_kinds() -> None:
    assert shard_sim.parse_kinds("lookup=0.5,put=0.2:64") == [("lookup", 0.5, 0), ("put", 0.2, 64)]
    with pytest.raises(ValueError, match="unknown kind 'gets'"):
        shard_sim.parse_kinds("gets")
    with pytest.raises(ValueError, match="KIND=SHARE"):
        shard_sim.parse_kinds("put=x")
    r = simulate(model(kinds=shard_sim.parse_kinds("lookup=1,put=1:64"), shards=4, clients=8))
    assert 64 < r.keys_per_s / r.calls_per_s < 128


def test_the_command_prints_a_row_per_shard_count(capsys: pytest.CaptureFixture[str]) -> None:
    assert shard_sim.main(["--shards", "1,4", "--calls", "500"]) == 0
    out = capsys.readouterr().out
    rows = [line.split()[0] for line in out.splitlines() if line[:1].isdigit()]
    assert rows == ["1", "4"]


def test_a_fan_out_pays_the_client_for_each_further_message() -> None:
    # 4 shards, 32 keys each (even), fixed costs, one client at low load: the replies
    # come back `send` apart, 66 µs after the call for the first (round trip 20 +
    # service 30 + 32 x 0.5); the second is read on arrival at 71, the two after it at
    # 10 µs each behind the one before: 101 µs.
    m = model(shards=4, spread="even", clients=1, think_us=10_000.0, service_cv=0.0,
              call_us=30.0, key_us={"lookup": 0.5}, rtt_us=20.0, send_us=5.0, read_us=10.0)
    r = simulate(m)
    assert r.touched == 4.0
    assert r.lat.p50 == pytest.approx(101e-6)
    # the same batch on one shard: no further message, all 128 keys in one service
    one = simulate(model(shards=1, clients=1, think_us=10_000.0, service_cv=0.0, call_us=30.0,
                         key_us={"lookup": 0.5}, rtt_us=20.0, send_us=5.0, read_us=10.0))
    assert one.lat.p50 == pytest.approx((20.0 + 30.0 + 64.0) * 1e-6)
