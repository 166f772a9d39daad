"""The code stays ruff- and mypy-clean (CONTRIBUTING.md): CI fails on a new finding."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_ruff_clean() -> None:
    run = subprocess.run([sys.executable, "-m", "ruff", "check", "."], cwd=ROOT,
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr


def test_mypy_clean() -> None:
    run = subprocess.run(
        [sys.executable, "-m", "mypy", "kvstore", "client/kvstore_client",
         "vllm_adapter/kvstore_vllm", "sglang_adapter/kvstore_sglang",
         "lmcache_adapter/kvstore_lmcache"],
        cwd=ROOT, capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr


def test_import_contracts_kept() -> None:
    """The one-way doors of pyproject.toml's [tool.importlinter]: adapters -> client ->
    shared layer <- servers."""
    lint = Path(sys.executable).parent / "lint-imports"
    run = subprocess.run([str(lint), "--no-cache"], cwd=ROOT, capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr
