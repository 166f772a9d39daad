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
