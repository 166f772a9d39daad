"""`kvstore up --shards N`: one master per shard, each with --shard k/N on its own port;
one shard starts today's single master (no --shard). No process is started: the
spawns are recorded."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kvstore import devcluster
from kvstore.cli import build_parser
from kvstore.devcluster import DevCluster, UpOptions
from kvstore.errors import InvalidArgument


def _started(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, shards: int) -> tuple[
        list[tuple[str, list[str]]], list[int]]:
    spawned: list[tuple[str, list[str]]] = []
    waited: list[int] = []

    def spawn(self: DevCluster, name: str, cmd: list[str], logs: Path) -> Any:
        spawned.append((name, cmd))
        return None

    monkeypatch.setattr(DevCluster, "_spawn", spawn)
    monkeypatch.setattr(devcluster, "wait_for_port", lambda port, *a, **k: None)
    monkeypatch.setattr(devcluster, "etcd_command", lambda *a, **k: ["etcd"])
    monkeypatch.setattr(devcluster, "port_is_free", lambda *a: True)
    monkeypatch.setattr(DevCluster, "_wait_mounted",
                        lambda self, creds, address, *a: waited.append(int(address.rpartition(":")[2])))
    opts = UpOptions(data_dir=tmp_path, nodes=2, master_port=41000, metrics_port=42000,
                     shards=shards, secure=False)
    monkeypatch.setattr(devcluster, "remove_credentials", lambda *a: False)
    DevCluster(opts).start()
    return spawned, waited


def _flag(cmd: list[str], name: str) -> str | None:
    return cmd[cmd.index(name) + 1] if name in cmd else None


def test_one_shard_starts_one_master_without_a_shard_flag(monkeypatch: pytest.MonkeyPatch,
                                                          tmp_path: Path) -> None:
    spawned, waited = _started(monkeypatch, tmp_path, 1)
    masters = [(n, c) for n, c in spawned if "master" in c]
    assert [n for n, _ in masters] == ["master"]
    assert "--shard" not in masters[0][1]
    assert _flag(masters[0][1], "--listen") == "127.0.0.1:41000"
    assert waited == [41000]


def test_shards_start_one_master_per_shard(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    spawned, waited = _started(monkeypatch, tmp_path, 3)
    masters = [(n, c) for n, c in spawned if "master" in c]
    assert [n for n, _ in masters] == ["master-0", "master-1", "master-2"]
    assert [_flag(c, "--shard") for _, c in masters] == ["0/3", "1/3", "2/3"]
    assert [_flag(c, "--listen") for _, c in masters] == [
        "127.0.0.1:41000", "127.0.0.1:41001", "127.0.0.1:41002"]
    assert [_flag(c, "--metrics-port") for _, c in masters] == ["42000", "42001", "42002"]
    stores = [c for _, c in spawned if "store" in c]
    assert len(stores) == 2 and all("--shard" not in c for c in stores)
    assert waited == [41000, 41001, 41002]  # up once every shard's leader mounted the nodes


def test_up_parses_shards_with_one_by_default() -> None:
    assert build_parser().parse_args(["up"]).shards == 1
    assert build_parser().parse_args(["up", "--shards", "2"]).shards == 2


def test_zero_shards_is_refused_with_a_sentence(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgument, match="--shards"):
        DevCluster(UpOptions(data_dir=tmp_path, shards=0)).start()


