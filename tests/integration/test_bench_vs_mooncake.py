"""`python -m bench.vs_mooncake` runs end to end against our own cluster (real etcd,
master, store node and client processes), `--phases` included: the phase timing hangs
on the client's `phase_timer` hook and names the client's steps, so a change there breaks
it (the old monkeypatching did once, unnoticed, until someone asked for phases)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.conftest import require_private_netns

ROOT = Path(__file__).resolve().parents[2]


def test_a_short_run_with_phases(tmp_path: Path) -> None:
    require_private_netns()
    out = tmp_path / "run.json"
    proc = subprocess.run(
        [sys.executable, "-m", "bench.vs_mooncake", "--no-mooncake", "--phases",
         "--dram", "256MiB", "--sizes", "64KiB", "--iters", "20", "--rounds", "5",
         "--turns", "1", "--json", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "ms per call by phase" in proc.stdout
    results = json.loads(out.read_text())["runs"][0]["raw"]["kvstore"]
    assert results, "no results from our client"
    for result in results:
        phases = result["phases"]
        # Every operation was timed, and the control calls and transfers show by name.
        assert set(phases) == {"put", "get", "batch put", "batch get"}, phases.keys()
        for op in ("put", "batch put", "batch get"):
            assert any(k.startswith(("rpc ", "ask ", "answer ")) for k in phases[op]), phases[op]
        assert any(k.startswith("transfer") for k in phases["batch get"]), phases["batch get"]
