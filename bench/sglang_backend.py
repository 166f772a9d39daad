"""The SGLang HiCache backend against the bare client (and Mooncake's backend), one run.

    python -m bench.sglang_backend [--pages 64] [--rounds 7] [--page-size 32] [--layers 8]
                                   [--heads 8] [--head-dim 128] [--no-mooncake] [--json out.json]

Re-executes itself in a private network namespace (loopback only; needs root). Starts
etcd + our master + one store node (`bench.clusters.ours`), builds a real SGLang host
pool (MHATokenToKVPoolHost, page_first, fp16) and moves --pages pages per call, the way
SGLang's cache controller does:

- set: `batch_set_v1(keys, host_indices)` (zero copy from the pool), fresh keys each round;
- get: `batch_exists(keys)` then `batch_get_v1(keys, host_indices)` (the pages pinned by
  the first are read under that lease by the second).

The bare client does the same work on the same objects (a page is its K and V buffers,
two objects): `put_from`, then `lookup` + `get_into(lease=)` + `release`. So the ratio
is what the backend adds on top of our own client (key building, page-to-buffer
mapping, lease bookkeeping, stats). Both in two configurations: "same-host" (the client
maps the store node's segment, memcpy) and "TE" (`same_host=False`: bytes cross the
Transfer Engine over TCP). Rounds alternate who goes first; each figure is the median
over --rounds. Written pages are removed after each round, so the node never nears its
eviction watermark.

Mooncake: SGLang's own MooncakeStore backend (`--hicache-storage-backend mooncake`)
against `mooncake_master` and a store-node process (`bench.clusters.mooncake`), through
the same factory and calls; its bytes always cross the Transfer Engine (its client here
contributes no segment), so compare it with our TE rows.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.netns import ensure_private_netns
from bench.stats import fmt_ratio, format_table

GB = 1e9


def _timed(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


class Case:
    """One way of moving pages: a set and a get of `pages` pages, then a cleanup."""

    name: str

    def set(self, keys: list[str]) -> None:
        raise NotImplementedError

    def get(self, keys: list[str]) -> None:
        raise NotImplementedError

    def cleanup(self, keys: list[str]) -> None:
        raise NotImplementedError

    def close(self) -> None:
        pass


class Backend(Case):
    def __init__(self, name: str, backend: Any, src: Any, dst: Any, remove: Callable[[list[str]], None]):
        self.name, self.backend, self.src, self.dst, self._remove = name, backend, src, dst, remove

    def set(self, keys: list[str]) -> None:
        ok = self.backend.batch_set_v1(keys, self.src)
        if not all(ok):
            raise RuntimeError(f"{self.name}: batch_set_v1 stored {sum(ok)} of {len(keys)} pages")

    def get(self, keys: list[str]) -> None:
        n = self.backend.batch_exists(keys)
        ok = self.backend.batch_get_v1(keys[:n], self.dst[:n * self.backend_page()])
        if n != len(keys) or not all(ok):
            raise RuntimeError(f"{self.name}: found {n}, read {sum(ok)} of {len(keys)} pages")

    def backend_page(self) -> int:
        return int(self.backend.mem_pool_host.page_size)

    def cleanup(self, keys: list[str]) -> None:
        self._remove(keys)

    def close(self) -> None:
        self.backend.close()


class Bare(Case):
    """Our client alone, on the same objects as the backend's (same keys, same buffers)."""

    def __init__(self, name: str, client: Any, keymaker: Any, src_bufs: list[Any],
                 dst_bufs: list[Any]) -> None:
        self.name, self.client, self.keys = name, client, keymaker
        self.src_bufs, self.dst_bufs = src_bufs, dst_bufs

    def set(self, keys: list[str]) -> None:
        errs = self.client.put_from(self.keys.keys(keys), self.src_bufs)
        if any(e is not None for e in errs):
            raise RuntimeError(f"{self.name}: put_from failed: {next(e for e in errs if e)}")

    def get(self, keys: list[str]) -> None:
        objs = self.keys.keys(keys)
        lease = self.client.lookup(objs)
        count = lease.count  # a released lease has none
        try:
            errs = self.client.get_into(lease.keys, self.dst_bufs[:count], lease=lease)
        finally:
            self.client.release(lease)
        if count != len(objs) or any(e is not None for e in errs):
            raise RuntimeError(f"{self.name}: read {count} of {len(objs)} objects")

    def cleanup(self, keys: list[str]) -> None:
        self.client.remove_many(self.keys.keys(keys), force=True)

    def close(self) -> None:
        self.client.close()


def _buffers(pool: Any, indices: Any) -> list[Any]:
    """The pool's page buffers at `indices` as numpy views (what the backend passes)."""
    flat = pool.kv_buffer.view(-1).view(__import__("torch").uint8).numpy()
    base = pool.kv_buffer.data_ptr()
    ptrs, sizes = pool.get_page_buffer_meta(indices)
    return [flat[p - base:p - base + n] for p, n in zip(ptrs, sizes, strict=True)]


def measure(cases: list[Case], pages: int, rounds: int,
            check: Callable[[], None]) -> dict[str, dict[str, list[float]]]:
    times: dict[str, dict[str, list[float]]] = {c.name: {"set": [], "get": []} for c in cases}
    seq = 0
    for r in range(rounds + 1):  # round 0 warms up (first writes, connections)
        order = cases if r % 2 == 0 else list(reversed(cases))
        for case in order:
            seq += 1
            keys = [f"{seq:08x}{i:056x}" for i in range(pages)]
            ts = _timed(lambda: case.set(keys))  # noqa: B023 - called right here
            tg = _timed(lambda: case.get(keys))  # noqa: B023
            check()
            case.cleanup(keys)
            if r:
                times[case.name]["set"].append(ts)
                times[case.name]["get"].append(tg)
    return times


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pages", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--page-size", type=int, default=32, help="tokens per page")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--dram", default="1GiB")
    ap.add_argument("--no-mooncake", action="store_true")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    ensure_private_netns("bench.sglang_backend")
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from tests.sglang.cpu_sglang import prepare

    prepare()
    import torch

    from bench.clusters import mooncake, ours
    from kvstore_client import KVStoreClient
    from kvstore_sglang.namespace import KeyMaker
    from tests.sglang.helpers import create, fill, mha_host_pool, pages_of, storage_config

    pages, ps = args.pages, args.page_size

    def new_pool() -> tuple[Any, Any, Any]:
        pool = mha_host_pool(tokens=2 * pages * ps + ps, page_size=ps, layers=args.layers,
                             heads=args.heads, head_dim=args.head_dim)
        src, dst = pool.alloc(pages * ps), pool.alloc(pages * ps)
        fill(pool, src, seed=1)
        return pool, src, dst

    def checker(pool: Any, src: Any, dst: Any) -> Callable[[], None]:
        def check() -> None:
            want = pages_of(pool, src)
            if not all(torch.equal(a, b) for a, b in zip(want, pages_of(pool, dst), strict=True)):
                raise RuntimeError("the pages read differ from the pages written")
            for s in dst[::ps].tolist():  # the next round must write them again
                pool.set_from_flat_data_page(s, torch.zeros_like(pool.get_data_page(s)))
        return check

    results: dict[str, Any] = {"pages": pages}
    rows: list[list[str]] = []
    with tempfile.TemporaryDirectory() as tmp, ours(Path(tmp), dram=args.dram) as oc:
        for label, same_host in (("same-host", True), ("TE", False)):
            pool, src, dst = new_pool()
            backend = create(storage_config(oc.etcd, model="bench", same_host=same_host,
                                            timeout=10.0), pool)
            km = KeyMaker(backend.namespace)
            client = KVStoreClient(etcd=oc.etcd, same_host=same_host, timeout=10.0)
            client.register(pool.kv_buffer)
            page_bytes = backend.namespace.page_bytes
            def remove(keys: list[str], c: Any = client, km: Any = km) -> None:
                c.remove_many(km.keys(keys), force=True)

            cases: list[Case] = [
                Backend(f"kvstore_sglang {label}", backend, src, dst, remove),
                Bare(f"bare client {label}", client, km, _buffers(pool, src), _buffers(pool, dst)),
            ]

            check = checker(pool, src, dst)
            t = measure(cases, pages, args.rounds, check)
            results[label] = t
            _rows(rows, t, cases[0].name, cases[1].name, pages, page_bytes)
            for c in cases:
                c.close()
            results["page_bytes"] = page_bytes
        if not args.no_mooncake:
            try:
                mrows = _mooncake(mooncake, Path(tmp), new_pool, pages, args.rounds, results, checker)
                rows.extend(mrows)
            except Exception as exc:  # report it: the comparison is optional here
                print(f"Mooncake's SGLang backend did not run here: {type(exc).__name__}: {exc}",
                      file=sys.stderr)
                results["mooncake_error"] = f"{type(exc).__name__}: {exc}"
    print(f"\n{pages} pages per call, {results['page_bytes'] / (1 << 20):.2f} MiB per page "
          f"(K+V, {args.layers} layers x {args.heads} heads x {args.head_dim} x {ps} tokens, fp16); "
          f"median of {args.rounds} rounds; get = batch_exists + batch_get_v1\n")
    print(format_table(["path", "op", "pages/s", "GB/s", "median", "vs bare client"], rows))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


def _rows(rows: list[list[str]], t: dict[str, dict[str, list[float]]], backend: str, bare: str,
          pages: int, page_bytes: int, ratio_to: str | None = None) -> None:
    for op in ("set", "get"):
        mb, mc = statistics.median(t[backend][op]), statistics.median(t[bare][op])
        for name, m in ((backend, mb), (bare, mc)):
            ratio = "" if name == bare else fmt_ratio(mb / mc) + " time"
            rows.append([name, op, f"{pages / m:,.0f}", f"{pages * page_bytes / m / GB:.2f}",
                         f"{m * 1e3:.2f} ms", ratio])


def _mooncake(mooncake: Any, tmp: Path, new_pool: Callable[[], tuple[Any, Any, Any]], pages: int,
              rounds: int, results: dict[str, Any],
              checker: Callable[[Any, Any, Any], Callable[[], None]]) -> list[list[str]]:
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig
    from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory

    from bench.clusters import MOONCAKE_ENV

    os.environ.update(MOONCAKE_ENV)
    rows: list[list[str]] = []
    with mooncake(tmp, 1 << 30) as mc:
        pool, src, dst = new_pool()
        check = checker(pool, src, dst)
        cfg = HiCacheStorageConfig(
            tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1,
            is_mla_model=False, enable_storage_metrics=False, is_page_first_layout=True,
            model_name="bench", extra_config={
                "master_server_address": mc.master, "metadata_server": mc.metadata,
                "protocol": "tcp", "global_segment_size": 0, "check_server": False})
        backend = StorageBackendFactory.create_backend("mooncake", cfg, pool)
        backend.register_mem_pool_host(pool)
        case = Backend("Mooncake MooncakeStore TE", backend, src, dst, lambda keys: backend.clear())
        t = measure([case], pages, rounds, check)
        results["mooncake"] = t
        page_bytes = results["page_bytes"]
        ours_te = results["TE"]["kvstore_sglang TE"]
        for op in ("set", "get"):
            m = statistics.median(t[case.name][op])
            ratio = statistics.median(ours_te[op]) / m
            rows.append([case.name, op, f"{pages / m:,.0f}", f"{pages * page_bytes / m / GB:.2f}",
                         f"{m * 1e3:.2f} ms", f"ours TE {fmt_ratio(ratio)} time"])
    return rows


if __name__ == "__main__":
    sys.exit(main())
