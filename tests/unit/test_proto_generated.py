"""The committed gRPC modules must be exactly what `make proto` generates."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_generated_modules_match_proto(tmp_path: Path) -> None:
    protos = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "proto/kvstore/v1").glob("*.proto"))
    subprocess.run(
        [sys.executable, "-m", "grpc_tools.protoc", "-Iproto", f"--python_out={tmp_path}",
         f"--pyi_out={tmp_path}", f"--grpc_python_out={tmp_path}", *protos],
        cwd=ROOT, check=True,
    )
    generated = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*.py*"))
    assert generated, "protoc produced nothing"
    committed = sorted(p.relative_to(ROOT) for p in (ROOT / "kvstore/v1").glob("*_pb2*"))
    assert committed == generated, "run `make proto` and commit the result"
    for rel in generated:
        assert (ROOT / rel).read_bytes() == (tmp_path / rel).read_bytes(), (
            f"{rel} differs from the proto; run `make proto` and commit the result")
