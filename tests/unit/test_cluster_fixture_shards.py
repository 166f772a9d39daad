"""The test `Cluster` can start a sharded control plane: one master per shard with
--shard k/N, and with one shard exactly the command it always ran. No process is
started: spawns are recorded."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import tests.conftest as fixtures
from tests.conftest import Cluster


class _Spawned:
    def __init__(self, cmd: list[str]) -> None:
        self.cmd = cmd
        self.popen = None


def _recording(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Cluster:
    monkeypatch.setattr(fixtures, "wait_for_port", lambda *a, **k: None)
    c = Cluster(tmp_path, etcd_port=2379)

    def spawn(name: str, cmd: list[str]) -> Any:
        return _Spawned(cmd)

    monkeypatch.setattr(c, "spawn", spawn)
    return c


def test_one_shard_runs_the_master_command_of_before(monkeypatch: pytest.MonkeyPatch,
                                                     tmp_path: Path) -> None:
    c = _recording(monkeypatch, tmp_path)
    (address,) = c.start_masters("--replicas", "2")
    proc, addr = c.masters[0]
    assert addr == address == c.master_of(0)
    assert "--shard" not in proc.cmd and proc.cmd[-2:] == ["--replicas", "2"]
    assert c.shards == 1


def test_sharded_control_plane_starts_each_shards_masters(monkeypatch: pytest.MonkeyPatch,
                                                          tmp_path: Path) -> None:
    c = _recording(monkeypatch, tmp_path)
    addresses = c.start_masters(shards=2, per_shard=2)
    assert len(addresses) == 4 and len(set(addresses)) == 4
    flags = [p.cmd[p.cmd.index("--shard") + 1] for p, _ in c.masters]
    assert flags == ["0/2", "0/2", "1/2", "1/2"]
    assert [a for _, a in c.by_shard[1]] == addresses[2:]
    assert c.master_of(1) == addresses[2]


def test_wait_nodes_waits_at_every_shard(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    c = _recording(monkeypatch, tmp_path)
    c.start_masters(shards=2)
    asked: list[str] = []

    def status(address: str | None = None, shard: int | None = None) -> Any:
        asked.append(address or "")
        return fixtures.pb.ClusterStatusResponse(nodes=[fixtures.pb.NodeStatus(node_id="n")])

    monkeypatch.setattr(c, "status", status)
    c.wait_nodes(1)
    assert asked == [c.master_of(0), c.master_of(1)]
