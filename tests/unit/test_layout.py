"""etcd records decode across versions (rolling upgrades)."""

from __future__ import annotations

import json

from kvstore.coord.layout import MasterRecord, NodeRecord


def test_records_from_a_newer_version_still_decode() -> None:
    raw = json.dumps({"master_id": "m", "address": "a:1", "pid": 1, "from_the_future": 7})
    assert MasterRecord.decode(raw.encode()).address == "a:1"
    node = NodeRecord("n", "seg", 4096, 1 << 20, "dram", 9, "h")
    data = json.loads(node.encode())
    data["new_field"] = [1, 2]
    assert NodeRecord.decode(json.dumps(data).encode()) == node
