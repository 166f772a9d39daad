"""Faults under checked traffic, real processes (see tests/faults/scenarios.py).

Each test runs one scenario and asserts its row: no wrong bytes, no call past its
deadline, no untyped error, every lost object explained by the fault, the cluster
serving again without operator action. With KVSTORE_FAULTS_REPORT=FILE each row is also
appended to FILE (JSON lines) for `python -m bench.faults --render FILE`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.conftest import require_private_netns
from tests.faults.scenarios import SCENARIOS, FaultRow, row_dict


def record(row: FaultRow) -> None:
    path = os.environ.get("KVSTORE_FAULTS_REPORT")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps(row_dict(row)) + "\n")


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_fault(name: str, tmp_path: Path) -> None:
    require_private_netns()
    row = SCENARIOS[name](tmp_path)
    record(row)
    print(json.dumps(row_dict(row), indent=1))
    assert not row.problems(), row.problems()
