"""bench.vs_mooncake --runs N: the rows of several runs folded into min-max ranges."""

from __future__ import annotations

import pytest

from bench import vs_mooncake
from bench.vs_mooncake import MC, SHM, TE, Row, range_rows


def _row(te: float, mc: float, shm: float, api_te: str = "r", unit: str = "GB/s") -> Row:
    hib = unit == "GB/s"
    ratio = (lambda a, b: a / b) if hib else (lambda a, b: b / a)
    return Row(1 << 20, "batch get x32" if hib else "get p50", unit,
               {TE: te, MC: mc, SHM: shm}, {TE: api_te, MC: "r", SHM: "r"},
               {TE: ratio(te, mc), SHM: ratio(shm, mc)})


def test_runs_fold_into_min_max_of_figures_and_ratios() -> None:
    runs = [[_row(1.0, 2.0, 4.0)], [_row(1.5, 1.0, 5.0, api_te="b")], [_row(1.2, 1.2, 4.0)]]
    (row,) = range_rows(runs)
    assert row.values == {TE: (1.0, 1.5), MC: (1.0, 2.0), SHM: (4.0, 5.0)}
    assert row.ratios[TE] == (0.5, 1.5) and row.medians[TE] == 1.0
    assert row.ratios[SHM] == (2.0, 5.0)
    assert row.apis[TE] == "b/r" and row.apis[MC] == "r"
    cells = row.cells()
    assert cells[:2] == ["1 MiB", "batch get x32"]
    assert cells[2] == "1.00-1.50 GB/s b/r" and cells[4] == "0.50-1.50x (1.00)"


def test_latency_ranges_keep_one_unit_when_they_share_it() -> None:
    runs = [[_row(300e-6, 150e-6, 140e-6, unit="s")], [_row(350e-6, 150e-6, 140e-6, unit="s")]]
    (row,) = range_rows(runs)
    cells = row.cells()
    assert cells[2] == "300-350 µs r"
    assert cells[3] == "150 µs r"      # the same in every run: one figure
    assert cells[4] == "0.43-0.50x (0.46)"


def test_runs_with_different_rows_are_refused() -> None:
    other = _row(1.0, 1.0, 1.0)
    other.size = 4 << 20
    with pytest.raises(ValueError):
        range_rows([[_row(1.0, 1.0, 1.0)], [other]])


def test_render_ranges_has_a_line_per_row() -> None:
    rows = range_rows([[_row(1.0, 2.0, 4.0), _row(1e-3, 2e-3, 5e-4, unit="s")]] * 2)
    text = vs_mooncake.render_ranges(rows, 2)
    assert "over 2 runs" in text and text.count("1 MiB") == 2


# -- --turns: each system measured in alternating turns, samples pooled ----------------------


def test_turns_share_the_operations_and_each_does_some() -> None:
    from bench.vs_mooncake import share

    assert [share(200, 4, t) for t in range(4)] == [50] * 4
    assert [share(10, 4, t) for t in range(4)] == [3, 3, 2, 2]
    assert sum(share(128, 3, t) for t in range(3)) == 128
    assert [share(2, 4, t) for t in range(4)] == [1, 1, 1, 1]  # never none


def _turn(put: list[float], batch_get: list[float], rounds: int, early: tuple[int, int],
          phase: float) -> dict[str, object]:
    return {"system": TE, "api": "r", "size": 1000, "batch": 2, "iters": len(put),
            "rounds": rounds, "early_reads": early,
            "samples": {"put": put, "get": put, "batch_put": batch_get, "batch_get": batch_get},
            "phases": {"batch get": {"transfer wait": phase}}}


def test_turns_pool_their_samples_into_one_result() -> None:
    from bench.vs_mooncake import merge_turns

    first = _turn([1.0, 2.0], [0.001], 1, (2, 0), 0.5)
    second = _turn([3.0, 4.0, 5.0], [0.002, 0.003], 2, (5, 1), 2.0)
    other = {**_turn([9.0], [0.001], 1, (0, 0), 1.0), "api": "b"}
    merged = merge_turns([first, other, second])
    assert len(merged) == 2
    (te,) = [m for m in merged if m["api"] == "r"]
    assert te["iters"] == 5 and te["rounds"] == 3 and te["turns"] == 2
    assert te["put"]["n"] == 5 and te["put"]["p50"] == 3.0
    # 3 rounds x 2 objects x 1000 bytes over the summed call times
    assert te["batch_get_gbps"] == pytest.approx(6000 / 0.006 / 1e9)
    assert te["early_reads"] == (5, 1)  # cumulative in the client: the last turn's
    # 1 round at 0.5, 2 at 2.0: weighted by calls
    assert te["phases"]["batch get"]["transfer wait"] == pytest.approx((0.5 + 4.0) / 3)
    (b,) = [m for m in merged if m["api"] == "b"]
    assert b is other  # a single turn stays as it was


# -- the warm-up: each store's memory written once, then emptied --------------------------------


def test_warm_writes_the_share_all_alive_at_once_then_removes_it() -> None:
    class Recorder(vs_mooncake.Api):
        def __init__(self) -> None:
            self.alive: set[str] = set()
            self.peak = 0
            self.sizes: list[int] = []

        def put_many(self, keys: list[str]) -> None:
            self.sizes.append(len(self.value) * len(keys))
            self.alive.update(keys)
            self.peak = max(self.peak, len(self.alive))

        def remove(self, keys: list[str]) -> None:
            assert set(keys) <= self.alive
            self.alive.difference_update(keys)

    api = Recorder()
    vs_mooncake.warm(api, total=10 * 4 * 1024 + 1000, size=1024, batch=4)
    assert api.sizes == [4 * 1024] * 10  # whole batches of the given size, up to the total
    assert api.peak == 40  # everything written was alive at once: 40 distinct ranges
    assert api.alive == set()  # and all of it removed again
