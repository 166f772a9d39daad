"""The per-second ring behind "hit ratio over the last minute" (core/window.py)."""

from __future__ import annotations

import pytest

from kvstore.master.core.window import RecentCounts, ratio


def test_counts_within_the_span_are_summed() -> None:
    w = RecentCounts(("lookups", "hits"), span=60, start=100.0)
    w.observe(100.2, [10, 4])
    w.observe(100.9, [20, 8])  # same second: added to the same bucket
    w.observe(130.0, [50, 38])
    assert w.recent(130.5) == {"lookups": 50, "hits": 38}
    assert w.recent(130.5, [60, 38]) == {"lookups": 60, "hits": 38}  # not yet observed
    assert w.covered(130.5) == pytest.approx(30.5)


def test_buckets_older_than_the_span_drop_out() -> None:
    w = RecentCounts(("n",), span=60, start=0.0)
    w.observe(10.0, [5])  # second 10
    w.observe(50.0, [7])  # second 50: +2
    assert w.recent(60.0) == {"n": 7}
    assert w.recent(70.5) == {"n": 2}  # second 10 is 60 s back: out
    assert w.recent(110.0) == {"n": 0}
    assert w.covered(500.0) == 60.0


def test_a_bucket_from_a_previous_lap_is_not_counted_again() -> None:
    w = RecentCounts(("n",), span=10, start=0.0)
    w.observe(3.0, [4])  # bucket 3, second 3
    w.observe(13.5, [5])  # bucket 3 again, second 13: reset, then +1
    assert w.recent(13.9) == {"n": 1}
    w.observe(40.0, [5])  # idle for laps: nothing new, nothing stale
    assert w.recent(40.0) == {"n": 0}


def test_idle_observations_cost_nothing_and_a_reset_counter_counts_from_zero() -> None:
    w = RecentCounts(("n",), span=60)
    for i in range(100):
        w.observe(1.0 + i * 0.1, [0])
    assert w.recent(11.0) == {"n": 0}
    w.observe(12.0, [30])
    w.observe(13.0, [3])  # went down: a new core; its 3 are new
    assert w.recent(13.0) == {"n": 33}


def test_bad_input_is_refused() -> None:
    with pytest.raises(ValueError, match="span"):
        RecentCounts(("n",), span=0)
    w = RecentCounts(("a", "b"))
    with pytest.raises(ValueError, match="expected 2 totals"):
        w.observe(1.0, [1])


def test_ratio_is_none_without_lookups() -> None:
    assert ratio(0, 0) is None
    assert ratio(3, 4) == 0.75
