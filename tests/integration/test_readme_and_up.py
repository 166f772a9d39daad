"""`kvstore up` brings up a cluster on the default ports, secure by default (TLS and
tokens), and the README example runs against it as pasted, finding its credentials the
way a user's would; SIGTERM stops everything."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc

from kvstore.devcluster import port_is_free
from kvstore.v1 import master_pb2 as pb
from kvstore.v1 import master_pb2_grpc as pbg
from tests.conftest import require_private_netns

ROOT = Path(__file__).resolve().parents[2]


def readme_example() -> str:
    text = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    assert blocks, "the README has no python example"
    return str(blocks[0])


def wait_for_node(creds_file: Path, timeout: float = 40.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            creds = json.loads(creds_file.read_text())["127.0.0.1:2379/default"]
            ca = Path(creds["tls_ca"]).read_bytes()
            with grpc.secure_channel("127.0.0.1:50051", grpc.ssl_channel_credentials(ca)) as ch:
                st = pbg.MasterStub(ch).ClusterStatus(
                    pb.ClusterStatusRequest(), timeout=2,
                    metadata=[("authorization", f"Bearer {creds['admin_token']}")])
            if len(st.nodes) == 1:
                return
        except (grpc.RpcError, OSError, ValueError, KeyError):
            pass
        time.sleep(0.2)
    raise AssertionError("kvstore up did not mount its store node in time")


def plaintext_refused() -> bool:
    """A client speaking plaintext gRPC to the dev master gets nowhere."""
    with grpc.insecure_channel("127.0.0.1:50051") as ch:
        try:
            pbg.MasterStub(ch).ClusterStatus(pb.ClusterStatusRequest(), timeout=2)
        except grpc.RpcError:
            return True
    return False


def test_up_then_readme_example(tmp_path: Path) -> None:
    require_private_netns()  # the default ports are then ours alone
    assert port_is_free(2379) and port_is_free(50051)
    creds_file = tmp_path / "credentials.json"  # not the user's ~/.config
    env = {**os.environ, "KVSTORE_CREDENTIALS": str(creds_file)}
    for name in ("KVSTORE_TOKEN", "KVSTORE_TLS_CA", "KVSTORE_ADMIN_TOKEN"):
        env.pop(name, None)
    up = subprocess.Popen(
        [sys.executable, "-m", "kvstore", "up", "--data-dir", str(tmp_path / "data"),
         "--dram", "64MiB"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
    )
    try:
        wait_for_node(creds_file)
        assert plaintext_refused()
        example = tmp_path / "example.py"
        example.write_text(readme_example())
        run = subprocess.run([sys.executable, str(example)], capture_output=True, text=True,
                             timeout=60, env=env)
        assert run.returncode == 0, run.stderr
        lines = run.stdout.splitlines()
        assert lines == ["[True, False]", "[b'1', b'2', None]", "None"], run.stdout
        # the admin CLI finds the admin token and the CA the same way
        status = subprocess.run([sys.executable, "-m", "kvstore", "status", "--json"],
                                capture_output=True, text=True, timeout=60, env=env)
        assert status.returncode == 0, status.stderr
        assert len(json.loads(status.stdout)["nodes"]) == 1
    finally:
        up.send_signal(signal.SIGTERM)
        out, _ = up.communicate(timeout=30)
    assert up.returncode == 0, out
    assert "etcd        127.0.0.1:2379" in out
    assert "TLS + tokens" in out
    # everything it started is gone: the default ports are free again
    assert port_is_free(2379) and port_is_free(50051)
