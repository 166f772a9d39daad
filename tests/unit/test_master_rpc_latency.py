"""The master's RPC latency histogram exposes what prometheus_client's Histogram would:
the same buckets, counts and sums, by method, with and without the shard label."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Histogram, generate_latest

from kvstore.master.metrics import _LATENCY_BUCKETS, MasterMetrics

# On a bound (le is inclusive), between bounds, below the first and above the last.
SECONDS = [0.0, 0.00005, 0.00007, 0.001, 0.0010001, 0.3, 1.0, 7.5, 0.00002]


def _lines(registry: CollectorRegistry) -> list[str]:
    text = generate_latest(registry).decode()
    return sorted(line for line in text.splitlines()
                  if line.startswith("kvstore_master_rpc_seconds")
                  and "_created" not in line)  # prometheus_client's own timestamp series


def test_the_light_histogram_exports_what_prometheus_client_would() -> None:
    ours = MasterMetrics()
    reference = CollectorRegistry()
    theirs = Histogram("kvstore_master_rpc_seconds", "Master RPC handling time by method",
                       ["method"], buckets=_LATENCY_BUCKETS, registry=reference)
    for method, values in (("Lookup", SECONDS), ("Exists", SECONDS[::2])):
        for v in values:
            ours.rpc_latency.labels(method).observe(v)
            theirs.labels(method).observe(v)
    assert _lines(ours.registry) == _lines(reference)
    assert ours.registry.get_sample_value(
        "kvstore_master_rpc_seconds_count", {"method": "Lookup"}) == len(SECONDS)
    assert ours.registry.get_sample_value(
        "kvstore_master_rpc_seconds_bucket", {"method": "Lookup", "le": "0.001"}) == 5


def test_a_sharded_master_labels_its_latency_with_its_shard() -> None:
    m = MasterMetrics(shard=1, shards=2)
    m.rpc_latency.labels("PutStart").observe(0.002)
    exposed = m.exposed()
    assert exposed.get_sample_value("kvstore_master_rpc_seconds_count",
                                    {"method": "PutStart", "shard": "1"}) == 1
    assert exposed.get_sample_value("kvstore_master_rpc_seconds_bucket",
                                    {"method": "PutStart", "shard": "1", "le": "+Inf"}) == 1
