"""Where kvstore keeps its records in etcd.

Every key lives under `/kvstore/<cluster>/`, so several clusters can share one etcd.
etcd holds what must outlive any single process (who leads, which nodes are alive,
live configuration), never one record per object: a busy store makes far more puts per
second than etcd sustains.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any

DEFAULT_CLUSTER = "default"


def _known(cls: type, fields: dict[str, Any]) -> dict[str, Any]:
    """Drop fields this version does not know: records written by a newer master or
    node must still decode here (rolling upgrades)."""
    names = set(cls.__dataclass_fields__)  # type: ignore[attr-defined]
    return {k: v for k, v in fields.items() if k in names}


class Layout:
    """The keys of one cluster, as seen by one shard of its control plane.

    With one shard (the default) the leader and master keys are where they always were;
    with N shards each shard has its own under `shards/<i>/`. Nodes, configuration and
    drain marks are the cluster's, shared by every shard."""

    def __init__(self, cluster: str = DEFAULT_CLUSTER, shard: int = 0, shards: int = 1) -> None:
        self.cluster = cluster
        self.root = f"/kvstore/{cluster}/".encode()
        self.shard = shard
        self.shards = shards
        self._own = self.root if shards <= 1 else self.root + f"shards/{shard}/".encode()

    def for_shard(self, shard: int, shards: int) -> Layout:
        return Layout(self.cluster, shard, shards)

    @property
    def shard_count(self) -> bytes:
        """The cluster's shard count, written once by the first master (decimal text);
        absent: a cluster of one shard from before shards existed."""
        return self.root + b"shards/count"

    @property
    def leader(self) -> bytes:
        """Lease-bound; its create revision is the leader epoch (of this shard)."""
        return self._own + b"leader"

    @property
    def masters(self) -> bytes:
        return self._own + b"masters/"

    def master(self, master_id: str) -> bytes:
        return self.masters + master_id.encode()

    @property
    def nodes(self) -> bytes:
        return self.root + b"nodes/"

    def node(self, node_id: str) -> bytes:
        return self.nodes + node_id.encode()

    @property
    def config(self) -> bytes:
        """Live settings, one key per setting (`config/evict_high` = `0.85`)."""
        return self.root + b"config/"

    def setting(self, name: str) -> bytes:
        return self.config + name.encode()

    @property
    def draining(self) -> bytes:
        """Nodes an operator is draining (`draining/<node>`), for the next leader."""
        return self.root + b"draining/"

    def drain_mark(self, node_id: str) -> bytes:
        return self.draining + node_id.encode()


@dataclass(frozen=True, slots=True)
class MasterRecord:
    master_id: str
    address: str  # gRPC HOST:PORT
    pid: int
    metrics: str = ""
    fast: str = ""  # fast control channel HOST:PORT (kvstore.rpc); "": gRPC only
    tls: bool = False  # both endpoints serve TLS only

    def encode(self) -> bytes:
        return json.dumps(asdict(self)).encode()

    @classmethod
    def decode(cls, raw: bytes) -> MasterRecord:
        return cls(**_known(cls, json.loads(raw)))


@dataclass(frozen=True, slots=True)
class NodeRecord:
    """What a store node announces: enough for a new leader to mount its segment."""

    node_id: str
    segment: str  # Transfer Engine segment name
    base_addr: int
    size: int
    tier: str
    pid: int
    host: str
    service: str = ""  # the node's gRPC address (inventory, tier commands)
    ssd_capacity: int = 0  # bytes on disk of its SSD tier; 0: none
    shm_path: str = ""  # same-host clients may map the segment from here
    shm_inode: int = 0  # ...if the file there is this memfd
    boot_id: str = ""  # ...and they run under the same kernel boot
    tls: bool = False  # its gRPC service serves TLS only
    deltas: str = ""  # HOST:PORT of its delta channel (rpc/deltas.py); "": gRPC Apply only

    def encode(self) -> bytes:
        return json.dumps(asdict(self)).encode()

    @classmethod
    def decode(cls, raw: bytes) -> NodeRecord:
        return cls(**_known(cls, json.loads(raw)))
