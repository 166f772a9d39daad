"""The CI version of the soak (`make soak` runs it for 10 minutes): a minute of mixed
traffic from three client processes against a store that evicts all the time."""

from __future__ import annotations

from bench.soak import run_soak
from tests.conftest import require_private_netns


def test_one_minute_soak_leaves_nothing_behind() -> None:
    require_private_netns()
    r = run_soak(60, clients=3)
    print(r)
    assert r.operations > 1000
    assert r.wrong_bytes == 0
    assert r.leases_left == 0 and r.pending_left == 0
    assert not r.errors, r.errors
    # The same-sized client's puts went into space started ahead, and closing it left
    # no placeholder behind (pending_left above).
    assert r.one_call_puts > 100, r.one_call_puts
    # Each store node's inventory holds what the master placed there, no more: an entry
    # never dropped grows the node's heap with traffic (it did, ~300 B per put+remove).
    assert r.inventory_excess and not any(r.inventory_excess.values()), r.inventory_excess
    # Flat heap after warm-up: a leak of one lease or object record per operation would
    # show as tens of MiB per minute at this rate.
    for name, slope in r.slope_mib_per_min.items():
        assert slope < 8.0, f"{name} anonymous RSS grows {slope} MiB/min: {r.rss_mib[name]}"
