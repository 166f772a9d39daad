"""The GPU data path, checked in one command on a machine with a GPU.

    python -m bench.gpu_check --bundle bench/out/gpu         # on the GPU machine
    python -m bench.gpu_check --device cpu --sizes 64KiB     # the same steps on the CPU

It starts a local cluster (etcd, a master, one store node; in a private network
namespace), then, on `--device` memory:

1. registers tensors there and checks that put_from / get_into move them byte-identical
   (GPU -> store -> GPU, and GPU -> store -> host: the page sum a GPU writer records is
   verified on the host too), for every page size in `--sizes`;
2. times batches of `--pages` pages GPU-direct (the engine moves device memory), staged
   (a torch copy to a registered host buffer, then the engine), and a plain torch
   device-to-host / host-to-device copy of the same bytes, as a yardstick;
3. drives the vLLM connector's worker side (kvstore_vllm.worker_side: save a step's
   pages, load them into other blocks under a lease) on KV caches on the device, in the
   block-outermost layout (pages contiguous: GPU-direct) and with K and V in separate
   planes (staged), and checks the loaded pages. vLLM itself is not imported: the
   worker side needs none of its classes (the package's `__init__`, which registers the
   connector with vLLM, is bypassed).

One table; exit 0 when every check holds. `--bundle DIR` makes a machine without a
package registry ready first: DIR is what `python -m bench.gpu_bundle` wrote (the CUDA
Transfer Engine wheel and the pure-Python packages the project needs beyond torch,
numpy, grpcio, protobuf, uvloop, xxhash, sortedcontainers and prometheus-client; the
etcd binary; libibverbs and libnuma). See docs/benchmarks.md ("GPU data path").
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import tempfile
import time
import types
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_MARK = "KVSTORE_GPU_BUNDLE"


# -- a machine without a registry -----------------------------------------------------------


def use_bundle(bundle: Path) -> None:
    """Unpack `bundle` once and re-execute with its paths (the engine's shared libraries
    are found through LD_LIBRARY_PATH, which is read only when a process starts)."""
    from bench.gpu_bundle import unpack

    paths = unpack(bundle)
    if os.environ.get(_MARK) == str(bundle):
        sys.path[:0] = [str(paths.site)]
        return
    env = dict(os.environ)
    env[_MARK] = str(bundle)
    env["PATH"] = f"{paths.bin}:{env.get('PATH', '')}"
    libs = [str(paths.lib), *cuda_runtime_dirs()]
    env["LD_LIBRARY_PATH"] = ":".join([*libs, env.get("LD_LIBRARY_PATH", "")])
    here = Path(__file__).resolve().parent.parent
    extra = [str(paths.site), str(here), str(here / "client"), str(here / "vllm_adapter")]
    env["PYTHONPATH"] = ":".join([*extra, env.get("PYTHONPATH", "")])
    sys.stdout.flush()
    os.execvpe(sys.executable, [sys.executable, "-m", "bench.gpu_check", *sys.argv[1:]], env)


def cuda_runtime_dirs() -> list[str]:
    """The CUDA runtime libraries torch's CUDA build brings (the `nvidia` wheels): the
    engine links libcudart, which is often nowhere else on the loader's path."""
    import importlib.util

    spec = importlib.util.find_spec("nvidia")
    if spec is None or spec.submodule_search_locations is None:
        return []
    return sorted(str(p) for root in spec.submodule_search_locations
                  for p in Path(root).glob("*/lib") if p.is_dir())


# -- the table --------------------------------------------------------------------------------


@dataclass
class Row:
    what: str
    size: str
    result: str
    ok: bool = True


def gbps(nbytes: int, seconds: float) -> str:
    return f"{nbytes / seconds / 1e9:.2f} GB/s" if seconds > 0 else "-"


def timed(fn: Callable[[], Any], iters: int, sync: Callable[[], None]) -> float:
    """The best of `iters` runs (seconds): the figure least disturbed by a noisy host."""
    best = float("inf")
    for _ in range(iters):
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        best = min(best, time.perf_counter() - t0)
    return best


def fmt_size(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n >> 10} KiB"


# -- the checks -------------------------------------------------------------------------------


class Check:
    def __init__(self, torch: Any, device: str, etcd: str, pages: int, iters: int) -> None:
        from kvstore_client import KVStoreClient

        self.torch = torch
        self.device = device
        self.pages = pages
        self.iters = iters
        self.client = KVStoreClient(etcd=etcd)
        self.rows: list[Row] = []
        self.run_id = hashlib.sha256(f"{time.time()}".encode()).hexdigest()[:8]

    def sync(self) -> None:
        if self.device.startswith("cuda"):
            self.torch.cuda.synchronize()

    def keys(self, tag: str, size: int) -> list[bytes]:
        return [f"gpu-check/{self.run_id}/{tag}/{size}/{i}".encode() for i in range(self.pages)]

    def round_trip(self, size: int) -> None:
        t = self.torch
        src = t.randint(0, 256, (self.pages * size,), dtype=t.uint8, device=self.device)
        dst = t.zeros_like(src)
        host = t.zeros(self.pages * size, dtype=t.uint8)
        for buf in (src, dst, host):
            self.client.register(buf)
        try:
            keys = self.keys("rt", size)
            put = self.client.put_from(keys, [src[i * size:(i + 1) * size] for i in range(self.pages)])
            got = self.client.get_into(keys, [dst[i * size:(i + 1) * size] for i in range(self.pages)])
            to_host = self.client.get_into(keys, [host[i * size:(i + 1) * size]
                                                  for i in range(self.pages)])
            errors = [e for e in put + got + to_host if e is not None]
            same = bool(t.equal(src, dst)) and bool(t.equal(src.cpu(), host))
            self.rows.append(Row(f"put/get byte-identical ({self.device} -> store -> "
                                 f"{self.device}, and -> host)", fmt_size(size),
                                 "yes" if same and not errors else f"NO ({errors[:2]})",
                                 same and not errors))
        finally:
            for buf in (src, dst, host):
                self.client.unregister(buf)

    def throughput(self, size: int) -> None:
        t = self.torch
        n = self.pages * size
        dev = t.randint(0, 256, (n,), dtype=t.uint8, device=self.device)
        back = t.zeros_like(dev)
        staging = t.zeros(n, dtype=t.uint8).pin_memory() if self.device.startswith("cuda") \
            else t.zeros(n, dtype=t.uint8)
        for buf in (dev, back, staging):
            self.client.register(buf)
        try:
            def pieces(buf: Any) -> list[Any]:
                return [buf[i * size:(i + 1) * size] for i in range(self.pages)]

            rounds = iter(range(1 << 30))

            def direct_put() -> None:
                self._ok(self.client.put_from(self.keys(f"d{next(rounds)}", size), pieces(dev)))

            def staged_put() -> None:
                staging.copy_(dev)
                self._ok(self.client.put_from(self.keys(f"s{next(rounds)}", size), pieces(staging)))

            read_keys = self.keys("read", size)
            self._ok(self.client.put_from(read_keys, pieces(dev)))

            def direct_get() -> None:
                self._ok(self.client.get_into(read_keys, pieces(back)))

            def staged_get() -> None:
                self._ok(self.client.get_into(read_keys, pieces(staging)))
                back.copy_(staging)

            figures = {
                "put GPU-direct": timed(direct_put, self.iters, self.sync),
                "put staged (torch copy to host, then the engine)": timed(staged_put, self.iters,
                                                                         self.sync),
                "get GPU-direct": timed(direct_get, self.iters, self.sync),
                "get staged (the engine, then torch copy to device)": timed(staged_get,
                                                                           self.iters, self.sync),
                "torch device-to-host copy (yardstick)": timed(lambda: staging.copy_(dev),
                                                               self.iters, self.sync),
                "torch host-to-device copy (yardstick)": timed(lambda: back.copy_(staging),
                                                               self.iters, self.sync),
            }
            label = f"{self.pages} x {fmt_size(size)}"
            for what, seconds in figures.items():
                self.rows.append(Row(what, label, gbps(n, seconds)))
        finally:
            for buf in (dev, back, staging):
                self.client.unregister(buf)

    def _ok(self, errors: list[Any]) -> None:
        bad = [e for e in errors if e is not None]
        if bad:
            raise RuntimeError(f"{len(bad)} of {len(errors)} objects failed: {bad[0]}")

    def worker_side(self, etcd: str) -> None:
        for layout in ("blocks-outermost", "split-kv"):
            ok, path = worker_round_trip(self.torch, self.device, etcd, layout, self.run_id)
            self.rows.append(Row(f"connector worker side, {layout} KV caches ({path})",
                                 "4 pages", "loaded pages equal saved" if ok else "NO", ok))

    def close(self) -> None:
        self.client.close()


def import_worker_side() -> types.ModuleType:
    """kvstore_vllm's worker side without its package `__init__` (which imports vLLM)."""
    import importlib

    if "kvstore_vllm" not in sys.modules:
        spec = importlib.util.find_spec("kvstore_vllm")
        if spec is None or spec.submodule_search_locations is None:
            raise RuntimeError("kvstore_vllm is not importable: run from the repository root")
        pkg = types.ModuleType("kvstore_vllm")
        pkg.__path__ = list(spec.submodule_search_locations)
        sys.modules["kvstore_vllm"] = pkg
    return importlib.import_module("kvstore_vllm.worker_side")


def worker_round_trip(torch: Any, device: str, etcd: str, layout: str,
                      run_id: str) -> tuple[bool, str]:
    """Save blocks 3 and 5 of two layers from one worker, load them into blocks 7 and 9
    of another, under a lease: what one prefix hit does between two engines."""
    ws = import_worker_side()
    from kvstore_client import KVStoreClient
    from kvstore_vllm.keys import KeyPlan, Namespace, RankLayers
    from kvstore_vllm.link import StoreLink
    from kvstore_vllm.plans import LoadPlan, SavePlan, StepPlan
    from kvstore_vllm.settings import Settings

    layers, blocks, heads, bs, hd = ("l0", "l1"), 16, 2, 32, 64
    shape = (blocks, 2, bs, heads, hd) if layout == "blocks-outermost" else (2, blocks, bs, heads, hd)

    def caches() -> dict[str, Any]:
        return {n: torch.zeros(shape, dtype=torch.float16, device=device) for n in layers}

    def page(kv: dict[str, Any], name: str, b: int) -> Any:
        return kv[name][b] if layout == "blocks-outermost" else kv[name][:, b]

    ns = Namespace(model=f"gpu-check-{run_id}-{layout}", revision="", kv_dtype="float16",
                   block_size=bs, hash_algo="sha256", hash_seed="0", tp_size=1, tp_rank=0,
                   pp_size=1, pp_rank=0, layout=layout)
    hashes = [hashlib.sha256(f"{run_id}-{layout}-{i}".encode()).digest() for i in range(2)]
    links = [StoreLink(Settings(etcd=etcd), "worker", buffer_size=1 << 20) for _ in range(2)]

    def step(w: Any, plan: Any) -> None:
        w.begin_step(plan)
        w.start_loads(plan)
        for name in layers:
            w.wait_layer(name)
            w.save_layer(name)
        w.end_step()

    try:
        src = caches()
        for t in src.values():
            t.normal_()
        writer = ws.WorkerSide(links[0], RankLayers(ns, layers), num_blocks=blocks,
                               layerwise_load=False, staging_bytes=8 << 20)
        writer.register(src)
        step(writer, StepPlan(saves=[SavePlan("r1", hashes, [3, 5])]))
        dst = caches()
        reader = ws.WorkerSide(links[1], RankLayers(ns, layers), num_blocks=blocks,
                               layerwise_load=True, staging_bytes=8 << 20)
        reader.register(dst)
        assert reader.pages is not None
        keys = KeyPlan([reader.rank]).keys(hashes)
        with KVStoreClient(etcd=etcd) as c:
            lease = c.lookup(keys, ttl=30)
            if lease.count != len(keys):
                return False, reader.pages.path()
            step(reader, StepPlan(loads=[LoadPlan("r2", lease.id, 29.0, hashes, [7, 9], 0)]))
            c.release(lease)
        ok = not reader.take_failed_blocks() and all(
            bool(torch.equal(page(dst, n, 7), page(src, n, 3)))
            and bool(torch.equal(page(dst, n, 9), page(src, n, 5))) for n in layers)
        return ok, reader.pages.path()
    finally:
        for link in links:
            link.close()


# -- main -------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.gpu_check", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bundle", type=Path, help="what bench.gpu_bundle wrote (no registry here)")
    ap.add_argument("--device", default="cuda", help="cuda, cuda:N, or cpu (the same steps "
                    "on host memory, as the CPU machines run them)")
    ap.add_argument("--sizes", default="64KiB,256KiB,1MiB,4MiB")
    ap.add_argument("--pages", type=int, default=32, help="pages per batch")
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--dram", default="4GiB", help="the store node's DRAM segment")
    args = ap.parse_args(argv)
    if args.bundle is not None:
        use_bundle(args.bundle.resolve())

    from bench.netns import ensure_private_netns

    ensure_private_netns("bench.gpu_check")

    import torch

    from kvstore.devices import cuda_build_hint, engine_devices
    from kvstore.units import parse_size

    kind = args.device.split(":")[0]
    if kind == "cuda" and not torch.cuda.is_available():
        print("gpu_check: torch sees no CUDA device here; run it on the GPU machine, or with "
              "--device cpu for the same steps on host memory", file=sys.stderr)
        return 2
    if kind not in engine_devices():
        print(f"gpu_check: the installed Transfer Engine cannot move {kind} memory: "
              f"{cuda_build_hint()}", file=sys.stderr)
        return 2
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    need = 4 * args.pages * max(sizes) * (args.iters + 2)
    if need > parse_size(args.dram):
        print(f"gpu_check: --dram {args.dram} is too small for {args.pages} pages of "
              f"{fmt_size(max(sizes))} over {args.iters} rounds; give --dram {need >> 20}MiB "
              "or more", file=sys.stderr)
        return 2

    from bench.clusters import ours

    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="kvstore-gpu-check-") as tmp, \
            ours(Path(tmp), dram=args.dram) as cluster:
        check = Check(torch, args.device, cluster.etcd, args.pages, args.iters)
        try:
            for size in sizes:
                check.round_trip(size)
            for size in sizes:
                check.throughput(size)
            check.worker_side(cluster.etcd)
        finally:
            check.close()
    engine = "CUDA build" if "cuda" in engine_devices() else "CPU build"
    print(f"\nGPU data path check: device {args.device} "
          f"({torch.cuda.get_device_name() if kind == 'cuda' else 'host memory'}), "
          f"Transfer Engine {engine} over TCP, {time.monotonic() - started:.0f} s\n")
    width = max(len(r.what) for r in check.rows)
    print(f"| {'check':<{width}} | {'size':>13} | result |")
    print(f"| {'-' * width} | {'-' * 13} | ------ |")
    for r in check.rows:
        print(f"| {r.what:<{width}} | {r.size:>13} | {r.result} |")
    failed = [r for r in check.rows if not r.ok]
    print(f"\n{len(check.rows) - len(failed)} passed, {len(failed)} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
