"""Per-node metrics: tier capacity and use, demotions, promotions, SSD I/O, corruption."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from kvstore.store.inventory import Inventory, ShardInventories
from kvstore.store.ssd import SsdTier


@dataclass
class TierCounters:
    demotions: int = 0
    demoted_bytes: int = 0
    promotions: int = 0
    promoted_bytes: int = 0
    corrupt: int = 0  # objects found corrupt on a move (SSD reads count their own too)


class NodeCollector(Collector):
    def __init__(self, node_id: str, dram_capacity: int,
                 inventory: Inventory | ShardInventories,
                 ssd: Callable[[], SsdTier | None], counters: TierCounters) -> None:
        self.node_id = node_id
        self.dram_capacity = dram_capacity
        self.inventory = inventory
        self.ssd = ssd
        self.counters = counters

    def collect(self) -> Iterator[Any]:
        labels = ["node", "tier"]
        cap = GaugeMetricFamily("kvstore_store_capacity_bytes", "Tier capacity", labels=labels)
        used = GaugeMetricFamily("kvstore_store_used_bytes", "Tier bytes in use", labels=labels)
        objs = GaugeMetricFamily("kvstore_store_objects", "Objects held", labels=labels)
        dram = self.inventory.dram()  # every shard's: the node's DRAM is one
        cap.add_metric([self.node_id, "dram"], self.dram_capacity)
        used.add_metric([self.node_id, "dram"], sum(h.size for _, h in dram))
        objs.add_metric([self.node_id, "dram"], len(dram))
        ssd = self.ssd()
        c = self.counters
        corrupt = c.corrupt
        if ssd is not None:
            st = ssd.stats()
            cap.add_metric([self.node_id, "ssd"], st.capacity_bytes)
            used.add_metric([self.node_id, "ssd"], st.used_bytes)
            objs.add_metric([self.node_id, "ssd"], st.objects)
            corrupt += st.corrupt_dropped
            for name, value, help_ in (
                ("ssd_write_bytes", st.write_bytes, "Bytes written to SSD"),
                ("ssd_read_bytes", st.read_bytes, "Bytes read from SSD"),
                ("ssd_write_seconds", st.write_seconds, "Time spent writing SSD files"),
                ("ssd_read_seconds", st.read_seconds, "Time spent reading SSD files"),
                ("ssd_writes", st.writes, "SSD files written"),
                ("ssd_reads", st.reads, "SSD files read"),
            ):
                yield CounterMetricFamily(f"kvstore_store_{name}", help_, value=value)
        yield cap
        yield used
        yield objs
        for name, value, help_ in (
            ("demotions", c.demotions, "Objects copied DRAM -> SSD"),
            ("demoted_bytes", c.demoted_bytes, "Bytes copied DRAM -> SSD"),
            ("promotions", c.promotions, "Objects copied SSD -> DRAM"),
            ("promoted_bytes", c.promoted_bytes, "Bytes copied SSD -> DRAM"),
            ("corrupt_dropped", corrupt, "Objects found corrupt and dropped, never served"),
        ):
            yield CounterMetricFamily(f"kvstore_store_{name}", help_, value=value)


def serve_metrics(collector: NodeCollector, port: int, host: str = "127.0.0.1") -> CollectorRegistry:
    registry = CollectorRegistry()
    registry.register(collector)
    start_http_server(port, addr=host, registry=registry)
    return registry
