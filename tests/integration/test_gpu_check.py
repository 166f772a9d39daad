"""bench/gpu_check.py, the one-command check of the GPU data path, run here on host
memory (`--device cpu`): every step it takes on a GPU machine (cluster, registration,
byte-identical round trips, both timing paths, the connector's worker side in both
layouts) runs for real, so the command handed to a GPU machine is known to work."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_gpu_check_passes_on_host_memory() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "bench.gpu_check", "--device", "cpu", "--sizes", "64KiB",
         "--pages", "4", "--iters", "1", "--dram", "256MiB"],
        cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    table = out.stdout
    assert "| put/get byte-identical" in table and "| yes |" in table
    assert "connector worker side, blocks-outermost KV caches (zero-copy)" in table
    assert "connector worker side, split-kv KV caches (staged through host memory)" in table
    assert "put GPU-direct" in table and "torch device-to-host copy" in table
    assert "\n0 failed" in table.replace(" passed, 0 failed", "\n0 failed")


def test_the_gpu_check_refuses_cuda_without_a_gpu_with_a_sentence() -> None:
    out = subprocess.run([sys.executable, "-m", "bench.gpu_check", "--device", "cuda"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert "no CUDA device" in out.stderr or "CUDA build" in out.stderr
