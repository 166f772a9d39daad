"""docs/metrics.md lists exactly the metrics the master and store node export."""

from __future__ import annotations

import re
from pathlib import Path

from prometheus_client import CollectorRegistry

from kvstore.master.core import CoreConfig, ManualClock, MasterCore
from kvstore.master.metrics import MasterMetrics
from kvstore.store.inventory import Inventory
from kvstore.store.ssd import SsdTier
from kvstore.store.tier_metrics import NodeCollector, TierCounters

DOC = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"


def documented() -> set[str]:
    return set(re.findall(r"^\| `(kvstore_[a-z_]+)` \|", DOC.read_text(), flags=re.M))


def exported(registry: CollectorRegistry) -> set[str]:
    names = set()
    for family in registry.collect():
        name = family.name
        if family.type == "counter" and not name.endswith("_total"):
            name += "_total"
        names.add(name)
    return names


def test_every_exported_metric_is_documented_and_nothing_else(tmp_path: Path) -> None:
    core = MasterCore(CoreConfig(), ManualClock())
    core.mount_segment("n0", "seg", 0, 1 << 20)
    master = MasterMetrics()
    master.watch_core(core.stats, lambda: True, lambda: 3)
    master.rpc_latency.labels("Lookup").observe(0.001)
    master.rpc_errors.labels("Lookup", "NOT_FOUND").inc()
    node = CollectorRegistry()
    with SsdTier(tmp_path, 1 << 20) as ssd:
        ssd.open()
        node.register(NodeCollector("n0", 1 << 20, Inventory(), lambda: ssd, TierCounters()))
        names = exported(master.registry) | exported(node)
    assert names == documented()
