"""The LMCache plugin's overhead over our own client: put and get of 64 chunks, same run.

    python -m bench.lmcache_backend [--chunks 64] [--rounds 7] [--layers 4] [--hidden 256]
                                    [--no-same-host]

One local cluster (etcd, master, one store node). Two paths move the same chunks:

- plugin: the KVStoreConnector that LMCache's plug-in loader builds (inside LMCache's own
  RemoteBackend), called as LMCache's storage manager calls it: `batched_put` of MemoryObjs
  from LMCache's CPU buffer, `batched_get` into fresh MemoryObjs it allocates there, each
  a coroutine on LMCache's event loop (which hands the work to the connector's thread);
- client: a bare KVStoreClient with a registered tensor of the same size, `put_from` and
  `get_into` of the same batch.

Rounds alternate which path goes first; every put writes new keys (a put of a stored key
is a no-op). Reported: the median over rounds of chunks ("pages") per second and GB/s,
and plugin/client throughput as the median of the rounds' own ratios (1.00x = no
overhead; below 1, the plugin is slower). Runs inside a private network
namespace (re-executes itself under `unshare -n` as root; see bench/netns.py).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("LMCACHE_LOG_LEVEL", "WARNING")

from bench.clusters import ours
from bench.netns import ensure_private_netns
from bench.stats import fmt_gbps, fmt_rate, fmt_ratio, format_table, gbps

MODEL = "bench-model"
TOKENS = 256  # LMCache's default chunk size


def _engine(etcd: str, layers: int, hidden: int, chunks: int, same_host: bool) -> Any:
    """LMCache's remote tier for one engine: config, metadata, CPU backend, loop, backend."""
    import torch
    from lmcache.v1.config import LMCacheEngineConfig
    from lmcache.v1.metadata import LMCacheMetadata
    from lmcache.v1.storage_backend.local_cpu_backend import LocalCPUBackend
    from lmcache.v1.storage_backend.remote_backend import RemoteBackend

    chunk_bytes = 2 * layers * TOKENS * hidden * 2
    extra = {
        "remote_storage_plugin.kvstore.module_path": "kvstore_lmcache",
        "remote_storage_plugin.kvstore.class_name": "KVStoreConnectorAdapter",
        "remote_storage_plugin.kvstore.url": f"kvstore://{etcd}",
        "remote_storage_plugin.kvstore.same_host": same_host,
    }
    # Room for a batch being written and one being read, and LMCache's own slack.
    cpu_gb = 3 * chunks * chunk_bytes / 1024**3 + 0.05
    config = LMCacheEngineConfig.from_defaults(chunk_size=TOKENS, local_cpu=True,
                                               max_local_cpu_size=cpu_gb,
                                               remote_storage_plugins=["kvstore"],
                                               extra_config=extra)
    # kv_shape: (layers, 2, tokens, heads, head size); heads x head size = hidden.
    metadata = LMCacheMetadata(model_name=MODEL, world_size=1, local_world_size=1, worker_id=0,
                               local_worker_id=0, kv_dtype=torch.float16,
                               kv_shape=(layers, 2, TOKENS, hidden // 64, 64), chunk_size=TOKENS)
    cpu = LocalCPUBackend(config, metadata)
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True, name="lmcache-loop")
    thread.start()
    backend = RemoteBackend(config, metadata, loop, cpu, plugin_name="kvstore")
    if backend.connection is None:
        raise RuntimeError("LMCache did not create the kvstore connector (see its log)")
    return config, metadata, cpu, loop, thread, backend


def _key(i: int) -> Any:
    import torch
    from lmcache.utils import CacheEngineKey

    return CacheEngineKey(model_name=MODEL, world_size=1, worker_id=0, chunk_hash=i,
                          dtype=torch.float16)


def run(args: argparse.Namespace) -> int:
    import torch

    from kvstore_client import KVStoreClient
    from kvstore_lmcache import KVStoreConnector

    chunk_bytes = 2 * args.layers * TOKENS * args.hidden * 2
    n = args.chunks
    total = n * chunk_bytes
    dram = f"{max(1024, 4 * (args.rounds + 1) * total // (1 << 20))}MiB"
    with tempfile.TemporaryDirectory(prefix="kvstore-lmcache-bench-") as tmp, \
            ours(Path(tmp), dram=dram) as cluster:
        _config, metadata, cpu, loop, thread, backend = _engine(
            cluster.etcd, args.layers, args.hidden, n, not args.no_same_host)
        conn = backend.connection.getWrappedConnector()
        assert isinstance(conn, KVStoreConnector)
        assert conn.chunk_bytes == chunk_bytes, (conn.chunk_bytes, chunk_bytes)
        client = KVStoreClient(etcd=cluster.etcd, same_host=not args.no_same_host)
        arena = torch.empty(2 * total, dtype=torch.uint8)
        client.register(arena)
        src_views = [arena[i * chunk_bytes:(i + 1) * chunk_bytes] for i in range(n)]
        dst_views = [arena[total + i * chunk_bytes:total + (i + 1) * chunk_bytes] for i in range(n)]
        gen = torch.Generator().manual_seed(0)
        arena[:total].copy_(torch.randint(0, 256, (total,), dtype=torch.uint8, generator=gen))
        objs = []
        for i in range(n):
            obj = cpu.allocate(metadata.get_shapes(), metadata.get_dtypes())
            assert obj is not None, "LMCache's CPU buffer is too small"
            obj.raw_tensor.view(torch.uint8)[:chunk_bytes].copy_(src_views[i])
            objs.append(obj)

        def on_loop(coro: Any) -> Any:
            return asyncio.run_coroutine_threadsafe(coro, loop).result()

        times: dict[str, list[float]] = {p: [] for p in
                                         ("plugin put", "client put", "plugin get", "client get")}

        def plugin_round(r: int) -> None:
            keys = [_key(r * 1_000_000 + i) for i in range(n)]
            puts = conn.stats.puts
            t = time.perf_counter()
            on_loop(conn.batched_put(keys, objs))
            times["plugin put"].append(time.perf_counter() - t)
            assert conn.stats.puts - puts == n, "the plugin's put stored fewer chunks"
            t = time.perf_counter()
            got = on_loop(conn.batched_get(keys))
            times["plugin get"].append(time.perf_counter() - t)
            assert all(g is not None for g in got), "the plugin's get missed"
            if r == 0:
                assert all(torch.equal(g.raw_tensor[:chunk_bytes], s) for g, s in
                           zip(got, src_views, strict=True))
            for g in got:
                g.ref_count_down()

        def client_round(r: int) -> None:
            keys = [f"bench-client/{r}/{i}".encode() for i in range(n)]
            t = time.perf_counter()
            errs = client.put_from(keys, src_views)
            times["client put"].append(time.perf_counter() - t)
            assert all(e is None for e in errs), errs
            t = time.perf_counter()
            errs = client.get_into(keys, dst_views)
            times["client get"].append(time.perf_counter() - t)
            assert all(e is None for e in errs), errs

        # One warm-up round each (connections, placements, first registrations).
        plugin_round(0)
        client_round(0)
        for p in times:
            times[p].clear()
        for r in range(1, args.rounds + 1):
            first, second = (plugin_round, client_round) if r % 2 else (client_round, plugin_round)
            first(r)
            second(r)
        zero_copy = (conn.stats.zero_copy_writes, conn.stats.zero_copy_reads)
        local = client.stats.local_transfers if hasattr(client.stats, "local_transfers") else None

        for o in objs:
            o.ref_count_down()
        client.close()
        backend.close()
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        cpu.close()

    med = {p: statistics.median(ts) for p, ts in times.items()}
    rows = []
    for op in ("put", "get"):
        pl, cl = med[f"plugin {op}"], med[f"client {op}"]
        # The ratio is the median of each round's own ratio: a round's two runs are
        # adjacent in time, so load from other processes on the host cancels out better
        # than in a ratio of the two medians.
        paired = statistics.median(c / p for p, c in zip(times[f"plugin {op}"],
                                                         times[f"client {op}"], strict=True))
        rows.append([op, fmt_rate(n / pl, " pages/s"), fmt_gbps(gbps(total, pl)),
                     fmt_rate(n / cl, " pages/s"), fmt_gbps(gbps(total, cl)),
                     fmt_ratio(paired)])
    path = "same-host memcpy" if not args.no_same_host else "Transfer Engine (TCP)"
    print(f"LMCache plugin vs bare client: {n} chunks of {chunk_bytes / (1 << 20):.2f} MiB "
          f"({args.layers} layers x {TOKENS} tokens x {args.hidden} fp16 K and V), "
          f"median of {args.rounds} rounds, {path}")
    print(format_table(["op", "plugin", "plugin GB/s", "client", "client GB/s",
                        "plugin/client"], rows))
    print(f"plugin zero-copy chunk moves: {zero_copy[0]} writes, {zero_copy[1]} reads "
          f"(of {(args.rounds + 1) * n} each)"
          + (f"; client same-host copies: {local}" if local is not None else ""))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.lmcache_backend",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--chunks", type=int, default=64, help="chunks per batch (default 64)")
    parser.add_argument("--rounds", type=int, default=11, help="measured rounds (default 11)")
    parser.add_argument("--layers", type=int, default=4, help="layers per chunk (default 4)")
    parser.add_argument("--hidden", type=int, default=256,
                        help="KV heads x head size, a multiple of 64 (default 256: 1 MiB chunks)")
    parser.add_argument("--no-same-host", action="store_true",
                        help="move bytes over the Transfer Engine, not the mapped segment")
    args = parser.parse_args(argv)
    if args.hidden % 64 or args.hidden <= 0 or args.chunks <= 0 or args.rounds <= 0:
        parser.error("--hidden must be a positive multiple of 64; --chunks, --rounds > 0")
    ensure_private_netns("bench.lmcache_backend")
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
