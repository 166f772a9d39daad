"""The benchmarks' pure helpers: percentiles, ratios, formats, tables, row building."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest

from bench import master_ops, vs_mooncake
from bench.netns import reexec_command
from bench.stats import (
    Latency,
    better_ratio,
    fmt_gbps,
    fmt_rate,
    fmt_ratio,
    fmt_seconds,
    format_table,
    gbps,
    percentile,
)


def test_percentile_matches_numpy_linear() -> None:
    rng = random.Random(7)
    for n in (1, 2, 3, 10, 101, 1000):
        xs = [rng.expovariate(1.0) for _ in range(n)]
        for q in (0, 1, 25, 50, 90, 99, 99.9, 100):
            assert percentile(xs, q) == pytest.approx(float(np.percentile(xs, q)), rel=1e-12)


def test_percentile_edges() -> None:
    assert percentile([3.0], 99) == 3.0
    assert percentile([1.0, 2.0], 50) == 1.5
    assert percentile([5.0, 1.0, 3.0], 0) == 1.0  # unsorted input
    with pytest.raises(ValueError):
        percentile([], 50)
    with pytest.raises(ValueError):
        percentile([1.0], 101)


def test_latency_summary() -> None:
    lat = Latency.of([0.001 * i for i in range(1, 101)])
    assert lat.n == 100
    assert lat.p50 == pytest.approx(0.0505)
    assert lat.p99 == pytest.approx(0.09901)
    assert lat.min == 0.001 and lat.max == pytest.approx(0.1)
    assert lat.as_dict()["mean"] == pytest.approx(0.0505)


def test_ratio_is_oriented_so_that_above_one_means_ours_is_better() -> None:
    assert better_ratio(1.0, 2.0, higher_is_better=False) == 2.0   # our latency is half
    assert better_ratio(2.0, 1.0, higher_is_better=True) == 2.0    # our rate is double
    assert better_ratio(None, 1.0, higher_is_better=True) is None
    assert better_ratio(1.0, 0.0, higher_is_better=False) is None


def test_formats() -> None:
    assert fmt_seconds(5e-7) == "500 ns"
    assert fmt_seconds(1.234e-4) == "123 µs"
    assert fmt_seconds(4.567e-3) == "4.57 ms"
    assert fmt_seconds(2.0) == "2.00 s"
    assert fmt_seconds(None) == "-"
    assert fmt_rate(950) == "950/s"
    assert fmt_rate(12_345) == "12.3k/s"
    assert fmt_rate(1_450_000, " keys/s") == "1.45M keys/s"
    assert fmt_gbps(gbps(2e9, 1.0)) == "2.00 GB/s"
    assert fmt_ratio(0.5) == "0.50x" and fmt_ratio(None) == "-"
    with pytest.raises(ValueError):
        gbps(1, 0)


def test_format_table_aligns_columns() -> None:
    out = format_table(["name", "value"], [["a", "1"], ["long name", "12345"]])
    lines = out.splitlines()
    assert lines[0] == "name       value"
    assert lines[1] == "---------  -----"
    assert lines[2] == "a              1"
    assert lines[3] == "long name  12345"
    assert format_table(["x", "y"], [["1", "2"]], align="rl").splitlines()[2] == "1  2"
    with pytest.raises(ValueError):
        format_table(["x", "y"], [["only one"]])
    with pytest.raises(ValueError):
        format_table(["x", "y"], [], align="l")


def test_reexec_command_quotes_arguments() -> None:
    cmd = reexec_command("bench.vs_mooncake", ["--json", "a b.json"], "/v/bin/python")
    assert cmd[:4] == ["unshare", "-n", "sh", "-c"]
    assert cmd[4] == "ip link set lo up && exec /v/bin/python -m bench.vs_mooncake --json 'a b.json'"


def _res(system: str, api: str, put: tuple[float, float], get: tuple[float, float],
         bput: float, bget: float, size: int = 1 << 20, local: int | None = None) -> dict:
    return {"system": system, "api": api, "size": size, "batch": 32, "local_transfers": local,
            "put": {"p50": put[0], "p99": put[1]}, "get": {"p50": get[0], "p99": get[1]},
            "batch_put_gbps": bput, "batch_get_gbps": bget}


def test_vs_mooncake_rows_take_each_systems_faster_api() -> None:
    te, shm, mc = vs_mooncake.TE, vs_mooncake.SHM, vs_mooncake.MC
    results = [
        _res(te, "b", (2e-3, 4e-3), (1e-3, 2e-3), 1.0, 2.0),
        _res(te, "r", (3e-3, 3e-3), (1e-3, 1e-3), 1.5, 1.0),
        _res(shm, "b", (1e-3, 1e-3), (1e-3, 1e-3), 4.0, 4.0),
        _res(mc, "b", (1e-3, 9e-3), (3e-3, 3e-3), 0.5, 1.0),
        _res(mc, "r", (2e-3, 2e-3), (2e-3, 2e-3), 2.0, 0.8),
    ]
    rows = {r.measure: r for r in vs_mooncake.build_rows(results)}
    assert list(rows) == ["put p50", "put p99", "get p50", "get p99", "batch put x32",
                          "batch get x32"]
    put50, put99 = rows["put p50"], rows["put p99"]
    assert put50.apis == {te: "b", shm: "b", mc: "b"}
    assert put50.ratios == {te: 0.5, shm: 1.0}
    # p99 follows the API chosen by p50, whatever its tail.
    assert put99.values[mc] == 9e-3 and put99.values[te] == 4e-3
    assert rows["get p50"].apis[mc] == "r" and rows["get p50"].ratios[te] == 2.0
    bput = rows["batch put x32"]
    assert bput.apis == {te: "r", shm: "b", mc: "r"}
    assert bput.ratios == {te: 0.75, shm: 2.0}
    assert rows["batch get x32"].values[mc] == 1.0
    cells = put50.cells()
    assert cells[:2] == ["1 MiB", "put p50"] and cells[2] == "2.00 ms b" and cells[4] == "0.50x"
    # Without same-host results the columns stay empty.
    bare = vs_mooncake.build_rows([r for r in results if r["system"] != shm])
    assert all(r.ratios.get(shm) is None and r.cells()[7] == "-" for r in bare)


def test_vs_mooncake_another_reader_has_get_rows_only() -> None:
    te, te2, mc = vs_mooncake.TE, vs_mooncake.TE2, vs_mooncake.MC
    results = [
        _res(te, "r", (2e-3, 4e-3), (1e-3, 2e-3), 1.0, 2.0),
        _res(te2, "r", (2e-3, 4e-3), (4e-3, 8e-3), 1.0, 0.5),
        _res(mc, "r", (2e-3, 4e-3), (2e-3, 4e-3), 1.0, 1.0),
    ]
    rows = {r.measure: r for r in vs_mooncake.build_rows(results)}
    # its puts are the writer's: shown once, in the TE column
    assert te2 not in rows["put p50"].values and rows["put p50"].cells()[5:7] == ["-", "-"]
    assert rows["get p50"].ratios[te2] == 0.5 and rows["get p50"].ratios[te] == 2.0
    assert rows["get p50"].cells()[5:7] == ["4.00 ms r", "0.50x"]
    assert rows["batch get x32"].ratios[te2] == 0.5


def test_vs_mooncake_path_warnings() -> None:
    te, shm = vs_mooncake.TE, vs_mooncake.SHM
    ok = [_res(te, "b", (1, 1), (1, 1), 1, 1, local=0), _res(shm, "b", (1, 1), (1, 1), 1, 1, local=5)]
    assert vs_mooncake.path_warnings(ok) == []
    bad = [_res(te, "b", (1, 1), (1, 1), 1, 1, local=3), _res(shm, "r", (1, 1), (1, 1), 1, 1, local=0)]
    assert len(vs_mooncake.path_warnings(bad)) == 2


def test_vs_mooncake_chunks_and_rounds() -> None:
    items = list(range(10))
    live = vs_mooncake.live_bytes(2 << 30)
    assert live == 512 << 20
    size = live // 4
    assert [list(c) for c in vs_mooncake.chunks(items, size, live)] == [
        [0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert next(iter(vs_mooncake.chunks(items, live * 2, live))) == [0]
    assert vs_mooncake.auto_rounds(3, 1 << 20, 32) == 3
    # ~1 GiB of calls per size and direction, at least 5, at most 200
    assert vs_mooncake.auto_rounds(0, 1 << 20, 32) == 32
    assert vs_mooncake.auto_rounds(0, 4 << 20, 32) == 8
    assert vs_mooncake.auto_rounds(0, 16 << 20, 32) == 5
    assert vs_mooncake.auto_rounds(0, 64 << 10, 32) == 200


def test_master_ops_merge_spans_all_clients() -> None:
    parts = [
        {"calls": 10, "start": 100.0, "end": 101.0, "lat": [0.001] * 10},
        {"calls": 30, "start": 100.5, "end": 102.0, "lat": [0.003] * 30},
    ]
    r = master_ops.merge("ours", "lookup128", parts)
    assert r.clients == 2 and r.calls == 40
    assert r.rate == pytest.approx(40 * 128 / 2.0)
    assert r.lat.p50 == pytest.approx(0.003)
    rows = master_ops.rows_for([r, master_ops.merge("mooncake", "lookup128", parts)])
    assert [row[2] for row in rows] == ["p50", "p99", "keys/s"]
    assert all(row[-1] == "1.00x" for row in rows)


def test_vs_mooncake_live_set_follows_dram() -> None:
    """The objects alive at once are a share of --dram, not a fixed 512 MiB (which at
    --dram 512MiB was the whole pool: eviction took a round's own objects); a --dram
    that cannot hold one batch below that share is refused with a sentence."""
    parser = vs_mooncake.build_parser()
    args = parser.parse_args(["--sizes", "4MiB", "--dram", "512MiB"])
    vs_mooncake.check(parser, args)  # accepted
    live = vs_mooncake.live_bytes(512 << 20)
    assert live == 128 << 20
    rounds = [list(range(32))] * 8
    assert all(len(c) == 1 for c in vs_mooncake.chunks(rounds, (4 << 20) * 32, live))
    bad = parser.parse_args(["--sizes", "4MiB", "--dram", "256MiB"])
    errors: list[str] = []

    def error(message: str) -> None:
        errors.append(message)
        raise SystemExit(2)

    parser.error = error  # type: ignore[method-assign]
    with pytest.raises(SystemExit):
        vs_mooncake.check(parser, bad)
    assert errors and "--dram 512.0 MiB or more" in errors[0], errors


def test_master_ops_spy_top_ranks_functions_by_own_samples(tmp_path: Path) -> None:
    raw = tmp_path / "p.txt"
    raw.write_text(
        "process 1:\"python\";run (asyncio/base_events.py:10);handle (kvstore/master/service.py:170) 6\n"
        "process 1:\"python\";run (asyncio/base_events.py:11);handle (kvstore/master/service.py:171);"
        "exists (kvstore/master/core/api.py:5) 3\n"
        "process 1:\"python\";run (asyncio/base_events.py:12) 1\n")
    text = master_ops.spy_top(raw)
    lines = text.splitlines()
    assert "10 samples" in lines[0]
    assert lines[1].split() == ["60.0", "90.0", "handle", "(service.py)"]
    assert lines[2].split() == ["30.0", "30.0", "exists", "(api.py)"]


def test_master_ops_turns_pool_samples_and_spans() -> None:
    one = master_ops.merge("ours", "exists1", [
        {"lat": [1e-3, 3e-3], "calls": 2, "start": 10.0, "end": 11.0}])
    two = master_ops.merge("ours", "exists1", [
        {"lat": [2e-3], "calls": 1, "start": 20.0, "end": 23.0}])
    other = master_ops.merge("mooncake", "exists1", [
        {"lat": [5e-3], "calls": 1, "start": 0.0, "end": 1.0}])
    pooled = {r.system: r for r in master_ops.pool_turns([one, other, two])}
    ours = pooled["ours"]
    assert ours.calls == 3 and ours.span == 4.0 and ours.rate == 3 / 4.0
    assert ours.lat.p50 == 2e-3 and sorted(ours.samples) == [1e-3, 2e-3, 3e-3]
    assert pooled["mooncake"].calls == 1
