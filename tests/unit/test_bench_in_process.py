"""The in-process CPU benchmarks run and count what they say they count: the master's put
path both ways (PutStart + PutEnd, and the one-call put's refill + PutCommit, records
included for small batches) and the store node's delta rows. They are what the
perf notes' before/after figures come from, so a change that broke them would go
unnoticed until the next measurement."""

from __future__ import annotations

import asyncio
import gc
import re
from collections.abc import Iterator

import pytest

from bench import master_put_cpu, node_apply_cpu
from kvstore.rpc import delta_columns as dc

FIGURE = re.compile(r"^(\d+\.\d+) µs of CPU per ")


@pytest.fixture
def collector() -> Iterator[None]:
    """master_put_cpu sets the collector as the daemon does (gc.freeze, a higher
    threshold): put it back for the rest of the test session."""
    threshold = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*threshold)


@pytest.mark.parametrize(("args", "calls"), [
    (["--batches", "16", "--batch", "8"], "PutStart + PutEnd, 8 per call"),
    (["--batches", "16", "--batch", "8", "--one-call"], "PutStart ahead + PutCommit, 8 per call"),
    # One object a call: the placeholders carry put records, as the client's do.
    (["--batches", "16", "--batch", "1", "--one-call"], "PutStart ahead + PutCommit, 1 per call"),
])
def test_the_masters_put_benchmark_runs_each_way(args: list[str], calls: str,
                                                capsys: pytest.CaptureFixture[str],
                                                collector: None) -> None:
    assert master_put_cpu.main([*args, "--repeat", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1 and calls in lines[0]
    m = FIGURE.match(lines[0])
    assert m is not None and float(m.group(1)) > 0


def test_the_node_benchmark_applies_every_row_it_sends() -> None:
    sent = node_apply_cpu.frames(3, 4)
    rows = [dc.decode(f) for f in sent]
    # Each put's intent, then its commit, at the same range.
    assert [list(r.flags) for r in rows] == [[dc.INTENT] * 4 + [0] * 4] * 3
    assert all(r.offsets[:4] == r.offsets[4:] for r in rows)
    per_row = asyncio.run(node_apply_cpu.run(sent, 2))
    assert len(per_row) == 2 and all(us > 0 for us in per_row)
