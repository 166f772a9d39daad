"""Reads after the whole cluster (etcd, master, store node) is gone: each fails with a
typed error, and the client's process lives on.

The client runs in a subprocess of its own: a crash in the Transfer Engine (it once
came from the quick single-key read polling a transfer id it never started) would
otherwise take pytest with it. Its exit status says whether it survived."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from kvstore.errors import InvalidArgument
from kvstore_client.datapath import DataPath, Xfer
from kvstore_client.stats import ClientStats
from tests.conftest import Cluster, require_private_netns

# The client's side: put, read once (so that the next single reads take the quick path),
# say so, wait for the cluster to be stopped, then read again and again; one JSON line
# per call with what it gave.
CLIENT = r"""
import json, sys
import numpy as np
from kvstore.errors import KVStoreError
from kvstore_client import KVStoreClient

etcd, same_host = sys.argv[1], sys.argv[2] == "1"
size, n = 65536, 3
keys = [b"gone-%d" % i for i in range(n)]

def outcome(call):
    try:
        got = call()
    except KVStoreError as exc:
        return {"raised": type(exc).__name__, "message": str(exc)}
    except BaseException as exc:
        return {"untyped": repr(exc)}
    if isinstance(got, list):
        return {"per_key": [type(g).__name__ if isinstance(g, KVStoreError)
                            else None if g is None else "value" for g in got]}
    return {"value": type(got).__name__}

cl = KVStoreClient(etcd=etcd, timeout=1.0, same_host=same_host)
buf = np.zeros(2 * n * size, dtype=np.uint8)
buf[: n * size] = np.arange(n * size, dtype=np.uint64).astype(np.uint8)
cl.register(buf)
out = [buf[(n + i) * size:(n + i + 1) * size] for i in range(n)]
assert cl.put_from(keys, [buf[i * size:(i + 1) * size] for i in range(n)]) == [None] * n
assert cl.get_into(keys[:1], out[:1]) == [None]
assert bytes(out[0]) == bytes(buf[:size])
print(json.dumps({"ready": True, "early_reads": cl.stats.early_reads}), flush=True)
sys.stdin.readline()  # the cluster is stopped
calls = {
    "get_into one": lambda: cl.get_into(keys[:1], out[:1]),
    "get_into many": lambda: cl.get_into(keys, out),
    "get": lambda: cl.get(keys[0]),
    "get_many": lambda: cl.get_many(keys),
}
for _ in range(3):
    for name, call in calls.items():
        print(json.dumps({"call": name, **outcome(call)}), flush=True)
cl.close()
print(json.dumps({"done": True}), flush=True)
"""

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("same_host", [True, False], ids=["default", "engine"])
def test_reads_after_the_cluster_is_gone_fail_typed(cluster_factory: Cluster, tmp_path: Path,
                                                    same_host: bool) -> None:
    c = cluster_factory
    c.start_master()
    c.start_store("128MiB")
    c.wait_nodes(1)
    script = tmp_path / "client.py"
    script.write_text(CLIENT)
    with open(tmp_path / "client.stderr", "wb") as err:
        proc = subprocess.Popen([sys.executable, str(script), c.etcd, "1" if same_host else "0"],
                                cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=err)
        assert proc.stdout is not None and proc.stdin is not None
        first = proc.stdout.readline()
        assert first, f"the client exited before it was ready ({proc.wait()}):\n" \
                      f"{(tmp_path / 'client.stderr').read_text(errors='replace')[-3000:]}"
        ready = json.loads(first)
        if same_host:
            # The read before the stop went the quick way: the reads after it try it too.
            assert ready["early_reads"] >= 1
        c.stop()
        rest, _ = proc.communicate(b"stopped\n")
    why = (tmp_path / "client.stderr").read_text(errors="replace")[-3000:]
    assert proc.returncode == 0, f"the client died (exit status {proc.returncode}):\n{why}"
    lines = [json.loads(line) for line in rest.decode().splitlines()]
    assert lines[-1] == {"done": True}, why
    results = lines[:-1]
    assert len(results) == 12
    for r in results:
        assert "untyped" not in r and "value" not in r, r
        if "per_key" in r:
            # get_many reports a failed read as a miss (a cache reader recomputes), and
            # get_into each key's error.
            missing = None if r["call"] == "get_many" else "Unavailable"
            assert r["per_key"] == [missing] * len(r["per_key"]), r
        else:
            assert r["raised"] == "Unavailable" and r["message"], r


GUARD = r"""
from kvstore.errors import InvalidArgument
from kvstore.transfer import Transfer

t = Transfer(timeout=1.0)
for tid in (0, 12345):
    try:
        t.status(tid)
    except InvalidArgument as exc:
        assert "not in flight" in str(exc), exc
    else:
        raise AssertionError(f"status({tid}) answered")
print("ok", flush=True)
"""


def test_polling_a_transfer_never_started_is_refused() -> None:
    """The engine would take the id for the address of a batch record and crash."""
    require_private_netns()
    proc = subprocess.run([sys.executable, "-c", GUARD], cwd=REPO, capture_output=True)
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")[-3000:]
    assert proc.stdout.decode().split() == ["ok"]


class _Engine:
    """As Transfer (status refuses an id it already said was over), in memory: the odd
    transfers land at their first poll, the even ones once `land_all` is set."""

    timeout = None
    batch_timeout = 30.0

    def __init__(self) -> None:
        self.ids = itertools.count(1)
        self.moving: set[int] = set()
        self.land_all = False

    def ready(self, segment: str) -> bool:
        return True

    def start(self, segment: str, local: int, remote: int, length: int, write: bool) -> int:
        tid = next(self.ids)
        self.moving.add(tid)
        return tid

    def status(self, tid: int) -> int:
        if tid not in self.moving:
            raise InvalidArgument(f"transfer {tid} is not in flight")
        if tid % 2 or self.land_all:
            self.moving.discard(tid)
            return 1
        return 0


class _NoLocal:
    def get(self, segment: str, node_id: str) -> Any:
        return None


def test_a_finish_after_an_interrupted_poll_asks_only_what_still_moves() -> None:
    """Whatever ends a client call, its driver finishes every batch it started again: an
    interrupt in the poll's sleep must leave the batch holding only the transfers still in
    the engine, not those it reported over (the engine freed them)."""
    engine = _Engine()
    dp = DataPath(engine, _NoLocal(), ClientStats())
    plan = {("seg", "node"): [Xfer(local=i << 30, remote=i << 30, size=1 << 30)
                              for i in range(1, 3)]}
    ticket = dp.start_transfers(plan, write=True)
    assert len(ticket.pending) > 2

    def interrupted(seconds: float) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        dp.finish_transfers(ticket, interrupted)
    assert {p[0] for p in ticket.pending} == engine.moving
    engine.land_all = True
    assert dp.finish_transfers(ticket, interrupted) == {}
    assert not ticket.pending
