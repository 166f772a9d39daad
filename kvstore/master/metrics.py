"""Prometheus metrics of the master.

RPC latency and errors are recorded as they happen; everything the core counts (objects,
bytes, leases, evictions, put failures) is read from `MasterCore.stats()` at scrape time
by a collector, so the core stays free of any metrics library.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

_LATENCY_BUCKETS = (
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 1.0
)


# Monotonic counters of CoreStats, exported as kvstore_master_<name>_total.
_COUNTERS = ("lookups", "lookup_keys", "hit_keys", "leases_granted", "leases_expired",
             "leases_released", "evictions", "evicted_bytes", "reclaimed_pending",
             "put_failures", "eviction_blocked", "eviction_blocked_bytes", "quota_evictions",
             "pin_capped", "pin_capped_keys")


def counters(stats: Any) -> dict[str, Any]:
    return {name: getattr(stats, name) for name in _COUNTERS}


class MasterMetrics:
    def __init__(self, registry: CollectorRegistry | None = None, shard: int = 0,
                 shards: int = 1) -> None:
        """`shard` of `shards`: with more than one, every series served carries a
        `shard` label (one shard's master exports exactly today's series)."""
        self.registry = registry or CollectorRegistry()
        self.shard = shard
        self.shards = shards
        self.rpc_latency = RpcLatency(_LATENCY_BUCKETS)
        self.registry.register(self.rpc_latency)
        self.rpc_errors = Counter(
            "kvstore_master_rpc_errors_total", "Master RPCs that failed as a whole, by code",
            ["method", "code"], registry=self.registry,
        )

    def watch_core(self, stats: Callable[[], Any], is_leader: Callable[[], bool],
                   epoch: Callable[[], int]) -> None:
        self.registry.register(_CoreCollector(stats, is_leader, epoch))

    def exposed(self) -> CollectorRegistry:
        """The registry /metrics serves: the master's, each sample labelled with its
        shard when the cluster has more than one."""
        if self.shards <= 1:
            return self.registry
        out = CollectorRegistry(auto_describe=False)
        out.register(_ShardLabelled(self.registry, str(self.shard)))
        return out

    def serve(self, port: int, host: str = "127.0.0.1") -> None:
        start_http_server(port, addr=host, registry=self.exposed())


class _ShardLabelled(Collector):
    """Every metric of `registry`, each sample with a `shard` label added."""

    def __init__(self, registry: CollectorRegistry, shard: str) -> None:
        self._registry = registry
        self._shard = shard

    def collect(self) -> Iterator[Any]:
        for family in self._registry.collect():
            family.samples = [s._replace(labels={**s.labels, "shard": self._shard})
                              for s in family.samples]
            yield family


class LatencySeries:
    """One method's histogram: a count per bucket (the last one +Inf) and the sum."""

    __slots__ = ("_bounds", "counts", "total")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self._bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.total = 0.0

    def observe(self, seconds: float) -> None:
        # The first bucket whose bound is >= seconds: prometheus's `le`.
        self.counts[bisect_left(self._bounds, seconds)] += 1
        self.total += seconds


class RpcLatency(Collector):
    """kvstore_master_rpc_seconds, by method. prometheus_client's Histogram takes two
    locks and loops over the buckets in Python on every call the master answers; this
    one takes a bisect and two additions (docs/perf-notes.md). Only the event loop's
    thread observes; a scrape, from the HTTP server's thread, may see a call's count a
    moment before its sum, which prometheus_client's own histogram allows too."""

    name = "kvstore_master_rpc_seconds"

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self._bounds = bounds
        self._les = [floatToGoString(b) for b in bounds] + ["+Inf"]
        self._series: dict[str, LatencySeries] = {}

    def labels(self, method: str) -> LatencySeries:
        series = self._series.get(method)
        if series is None:
            series = self._series[method] = LatencySeries(self._bounds)
        return series

    def _family(self) -> HistogramMetricFamily:
        return HistogramMetricFamily(self.name, "Master RPC handling time by method",
                                     labels=["method"])

    def describe(self) -> Iterator[Any]:
        yield self._family()

    def collect(self) -> Iterator[Any]:
        family = self._family()
        for method, series in list(self._series.items()):
            counts, total = list(series.counts), series.total
            cumulative, buckets = 0, []
            for le, n in zip(self._les, counts, strict=True):
                cumulative += n
                buckets.append((le, cumulative))
            family.add_metric([method], buckets, total)
        yield family


class _CoreCollector(Collector):
    def __init__(self, stats: Callable[[], Any], is_leader: Callable[[], bool],
                 epoch: Callable[[], int]) -> None:
        self._stats = stats
        self._is_leader = is_leader
        self._epoch = epoch

    def collect(self) -> Iterator[Any]:
        yield GaugeMetricFamily("kvstore_master_is_leader", "1 if this master leads",
                                value=1.0 if self._is_leader() else 0.0)
        yield GaugeMetricFamily("kvstore_master_epoch", "Leader epoch (etcd create revision)",
                                value=float(self._epoch()))
        s = self._stats()
        objects = GaugeMetricFamily("kvstore_master_objects", "Objects by state", labels=["state"])
        objects.add_metric(["complete"], s.objects_complete)
        objects.add_metric(["pending"], s.objects_pending)
        yield objects
        nbytes = GaugeMetricFamily("kvstore_master_object_bytes", "Object bytes by state",
                                   labels=["state"])
        nbytes.add_metric(["complete"], s.bytes_complete)
        nbytes.add_metric(["pending"], s.bytes_pending)
        yield nbytes
        yield GaugeMetricFamily("kvstore_master_leases_active", "Leases currently held",
                                value=s.active_leases)
        cap = GaugeMetricFamily("kvstore_node_capacity_bytes", "Segment capacity per node",
                                labels=["node", "tier"])
        used = GaugeMetricFamily("kvstore_node_used_bytes", "Allocated bytes per node",
                                 labels=["node", "tier"])
        pinned = GaugeMetricFamily("kvstore_node_pinned_bytes", "Bytes pinned by leases per node",
                                   labels=["node", "tier"])
        for node in s.nodes.values():
            for seg in node.segments:
                cap.add_metric([seg.node_id, seg.tier], seg.capacity)
                used.add_metric([seg.node_id, seg.tier], seg.used)
                pinned.add_metric([seg.node_id, seg.tier], seg.pinned_bytes)
        yield cap
        yield used
        yield pinned
        held = GaugeMetricFamily("kvstore_tenant_bytes", "Bytes a tenant with a quota holds",
                                 labels=["tenant"])
        quota = GaugeMetricFamily("kvstore_tenant_quota_bytes", "A tenant's quota", labels=["tenant"])
        for tenant, (n, q) in s.tenants.items():
            held.add_metric([tenant], n)
            quota.add_metric([tenant], q)
        yield held
        yield quota
        for name, value in counters(s).items():
            if isinstance(value, dict):
                fam = CounterMetricFamily(f"kvstore_master_{name}", name.replace("_", " "),
                                          labels=["reason"])
                for reason, count in value.items():
                    fam.add_metric([reason], count)
                yield fam
            else:
                yield CounterMetricFamily(f"kvstore_master_{name}", name.replace("_", " "),
                                          value=value)
