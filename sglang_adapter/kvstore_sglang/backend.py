"""`KVStoreHiCacheStorage`: kvstore as SGLang's HiCache L3 storage backend.

SGLang builds it through its own factory (`--hicache-storage-backend dynamic`, the class
named in the extra config) as `cls(storage_config, kwargs)`, then hands it the host KV
pool with `register_mem_pool_host`. From then on three SGLang threads call it: the
prefetch thread asks `batch_exists`, the prefetch I/O thread reads with `batch_get_v1`
(or the generic `batch_get`), the backup thread writes with `batch_set_v1` (or
`batch_set`). One kvstore client serves them all under a lock (the client is not
thread-safe; its calls are short and batched).

- Zero copy: the host pool's buffer is registered with the client once; v1 reads and
  writes move bytes between the pool's pages and the store nodes directly.
- The promise: `batch_exists` pins what it reports under a lease (`pins.py`), and the
  read that follows reads under it, so an eviction in between cannot turn a reported
  hit into a partial load.
- The store down is misses and failed writes, reported the way SGLang expects (a
  count, lists of False), never an exception out of a data call: SGLang would log it
  and carry on, but a store that is down would then cost a timeout per call. After a
  failure the store is left alone for `retry_interval` seconds.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import torch
from sglang.srt.mem_cache.hicache_storage import (
    HiCacheStorage,
    HiCacheStorageConfig,
    HiCacheStorageExtraInfo,
)

from kvstore_client import KVStoreClient, KVStoreError, Lease, LeaseExpired, PermissionDenied
from kvstore_sglang.errors import BadKey, KVStoreSGLangError, NotRegistered, PageSizeMismatch
from kvstore_sglang.namespace import KeyMaker, Namespace, Shard
from kvstore_sglang.pins import PinTable
from kvstore_sglang.pool import PagePool
from kvstore_sglang.settings import Settings
from kvstore_sglang.stats import Stats
from kvstore_sglang.store import StoreLink

log = logging.getLogger("kvstore_sglang")


class KVStoreHiCacheStorage(HiCacheStorage):
    """SGLang HiCache storage backend over kvstore (see the module docstring)."""

    def __init__(self, storage_config: HiCacheStorageConfig,
                 kwargs: dict[str, Any] | None = None) -> None:
        self.settings = Settings.from_extra_config(storage_config.extra_config)
        self.storage_config = storage_config
        self.stats = Stats()
        self.is_writer = bool(storage_config.is_storage_writer)
        self.shard = Shard.of(storage_config, self.settings.model_id)
        self._lock = threading.RLock()
        self._store = StoreLink(self.settings, self.stats)
        self._pins = PinTable()
        self._pool: PagePool | None = None
        self._keys: KeyMaker | None = None
        self._staging: np.ndarray | None = None
        self._metrics: dict[str, list[Any]] = {"prefetch_pgs": [], "backup_pgs": [],
                                                "prefetch_bandwidth": [], "backup_bandwidth": []}
        with self._lock:
            self._store.get()  # connect now, so a bad address is logged at start-up
        log.info("KVStoreHiCacheStorage store %s (%s), lease_ttl=%.0fs, writer=%s",
                 self._store.describe(), "connected" if self._store.client else "down for now",
                 self.settings.lease_ttl, self.is_writer)

    # -- set-up ---------------------------------------------------------------------------

    def register_mem_pool_host(self, mem_pool_host: Any) -> None:
        if self._pool is not None and self._pool.host_pool is mem_pool_host:
            return  # registered already (a second attach of the same pool)
        if self._pool is not None:
            raise NotRegistered("KVStoreHiCacheStorage serves one host pool; build another "
                                "backend for another pool")
        super().register_mem_pool_host(mem_pool_host)
        pool = PagePool(mem_pool_host)
        namespace = Namespace(self.shard, pool.geometry())
        with self._lock:
            self._pool = pool
            self._keys = KeyMaker(namespace)
            pages = max(1, self.settings.staging_bytes // pool.page_bytes)
            self._staging = np.zeros(pages * pool.page_bytes, dtype=np.uint8)
            self._store.register(pool.tensor)
            self._store.register(self._staging)
        log.info("KVStoreHiCacheStorage namespace %s", namespace.describe())

    @property
    def namespace(self) -> Namespace:
        return self._ready()[1].namespace

    def _ready(self) -> tuple[PagePool, KeyMaker]:
        if self._pool is None or self._keys is None:
            raise NotRegistered("KVStoreHiCacheStorage has no host pool yet: SGLang calls "
                                "register_mem_pool_host(host_pool) right after creating it")
        return self._pool, self._keys

    @contextlib.contextmanager
    def _client(self) -> Iterator[KVStoreClient | None]:
        with self._lock:
            yield self._store.get()

    def _call(self, fn: Callable[[KVStoreClient], Any], client: KVStoreClient) -> Any:
        """One store call; any failure of the call itself marks the store down and
        comes back as None (per-key failures come back in the call's own result)."""
        try:
            return fn(client)
        except KVStoreError as exc:
            if isinstance(exc, LeaseExpired):
                raise
            self._store.failed(exc)
        except Exception as exc:  # a store failure must not reach SGLang's threads
            self._store.failed(exc)
        return None

    # -- existence and leases ---------------------------------------------------------------

    def exists(self, key: str) -> bool:
        _, keys = self._ready()
        objs = keys.page_keys(key)
        with self._client() as client:
            if client is None:
                return False
            found = self._call(lambda c: c.exists(objs), client)
        return bool(found) and all(found)

    def batch_exists(self, keys: list[str],
                     extra_info: HiCacheStorageExtraInfo | None = None) -> int:
        """The number of consecutive pages from the start that the store holds, pinned
        under a lease until they are read (or `lease_ttl` passes)."""
        _, maker = self._ready()
        if not keys:
            return 0
        objs = maker.keys(keys)
        per = maker.objects
        t0 = time.perf_counter()
        with self._client() as client:
            lease: Lease | None = None
            if client is not None:
                lease = self._call(lambda c: c.lookup(objs, ttl=self.settings.lease_ttl), client)
            pages = lease.count // per if lease is not None else 0
            if lease is not None and lease.id and client is not None:
                if pages * per < lease.count:  # a page found only in part is no hit
                    _quiet_release(client, lease, keep_first=pages * per)
                if pages:
                    self._pins.add(lease, lease.keys[:pages * per])
                else:
                    _quiet_release(client, lease)
            self.stats.latency["exists"].append(time.perf_counter() - t0)
            self.stats.exists_calls += 1
            self.stats.pages_queried += len(keys)
            self.stats.hits += pages
            self.stats.misses += len(keys) - pages
        if pages < len(keys):
            log.debug("kvstore_sglang: %d of %d page(s) found under namespace %s; page %r "
                      "and the rest are misses", pages, len(keys), maker.namespace.digest.hex(),
                      keys[pages])
        return pages

    # -- zero-copy (v1) -----------------------------------------------------------------------

    def batch_get_v1(self, keys: list[str], host_indices: torch.Tensor,
                     extra_info: HiCacheStorageExtraInfo | None = None) -> list[bool]:
        """Read pages straight into the host pool at `host_indices`; per page, whether
        it arrived whole and verified."""
        pool, maker = self._ready()
        if not keys:
            return []
        objs = maker.keys(keys)
        bufs = pool.buffers(host_indices, len(keys))
        t0 = time.perf_counter()
        ok = self._read(objs, bufs, maker.objects)
        self._note_read(ok, pool.page_bytes, t0)
        return ok

    def batch_set_v1(self, keys: list[str], host_indices: torch.Tensor,
                     extra_info: HiCacheStorageExtraInfo | None = None) -> list[bool]:
        """Write pages straight from the host pool; per page, whether it is stored."""
        pool, maker = self._ready()
        if not keys:
            return []
        if not self.is_writer:  # MLA: another rank of the group writes the same pages
            self.stats.pages_write_skipped += len(keys)
            return [True] * len(keys)
        objs = maker.keys(keys)
        bufs = pool.buffers(host_indices, len(keys))
        t0 = time.perf_counter()
        ok = self._write(objs, bufs, maker.objects)
        self._note_write(ok, pool.page_bytes, t0)
        return ok

    # -- generic (copying) API ------------------------------------------------------------------

    def get(self, key: str, target_location: Any = None,
            target_sizes: Any = None) -> torch.Tensor | None:
        return self.batch_get([key], [target_location])[0]

    def batch_get(self, keys: list[str], target_locations: Any = None,
                  target_sizes: Any = None) -> list[torch.Tensor | None]:
        """Read pages into the given flat CPU tensors (one page each): per page the
        tensor, or None for a miss. Bytes land in registered staging memory under the
        pages' lease and are copied out (the generic API is SGLang's copying one)."""
        pool, maker = self._ready()
        if not keys:
            return []
        if target_locations is None or len(target_locations) != len(keys):
            raise PageSizeMismatch(f"batch_get needs one target tensor per key ({len(keys)})")
        out: list[torch.Tensor | None] = [None] * len(keys)
        t0 = time.perf_counter()
        ok_all: list[bool] = []
        staging = self._staging
        assert staging is not None
        chunk = staging.nbytes // pool.page_bytes
        for lo in range(0, len(keys), chunk):
            part = list(range(lo, min(len(keys), lo + chunk)))
            good = [i for i in part if self._page_target(target_locations[i], pool, keys[i])]
            with self._lock:
                bufs = self._split(staging, len(good), pool)
                ok = self._read(maker.keys([keys[i] for i in good]), bufs, maker.objects) \
                    if good else []
                for j, (i, hit) in enumerate(zip(good, ok, strict=True)):
                    if hit:
                        view = staging[j * pool.page_bytes:(j + 1) * pool.page_bytes]
                        _bytes_of(target_locations[i])[:] = view
                        out[i] = target_locations[i]
            ok_all.extend(out[i] is not None for i in part)
        self._note_read(ok_all, pool.page_bytes, t0)
        return out

    def set(self, key: str, value: Any = None, target_location: Any = None,
            target_sizes: Any = None) -> bool:
        return self.batch_set([key], [value])

    def batch_set(self, keys: list[str], values: Any = None, target_locations: Any = None,
                  target_sizes: Any = None) -> bool:
        """Store flat CPU page tensors; True when every page is stored."""
        pool, maker = self._ready()
        if not keys:
            return True
        if values is None or len(values) != len(keys):
            log.warning("kvstore_sglang: batch_set got %d key(s) and %s value(s); nothing "
                        "stored", len(keys), "no" if values is None else len(values))
            return False
        if not self.is_writer:
            self.stats.pages_write_skipped += len(keys)
            return True
        if not all(self._page_target(v, pool, k) for k, v in zip(keys, values, strict=True)):
            self.stats.pages_write_failed += len(keys)
            return False
        bufs: list[Any] = []
        for v in values:
            bufs.extend(self._split(_bytes_of(v.contiguous()), 1, pool))
        t0 = time.perf_counter()
        ok = self._write(maker.keys(keys), bufs, maker.objects, copy=True)
        self._note_write(ok, pool.page_bytes, t0)
        return all(ok)

    def _page_target(self, tensor: Any, pool: PagePool, key: str) -> bool:
        """Whether `tensor` can hold one page; if not, say why (a logged miss)."""
        if (not isinstance(tensor, torch.Tensor) or tensor.device.type != "cpu"
                or not tensor.is_contiguous()):
            log.warning("kvstore_sglang: page %r: expected a contiguous CPU tensor, got %s; "
                        "treated as a miss", key, type(tensor).__name__)
            return False
        n = tensor.numel() * tensor.element_size()
        if n != pool.page_bytes:
            log.warning("kvstore_sglang: page %r: tensor of %d bytes, but a page of this pool "
                        "is %d bytes (%d object(s)); treated as a miss", key, n, pool.page_bytes,
                        pool.objects)
            return False
        return True

    @staticmethod
    def _split(flat: np.ndarray, pages: int, pool: PagePool) -> list[np.ndarray]:
        out = []
        off = 0
        for _ in range(pages):
            for n in pool.object_bytes:
                out.append(flat[off:off + n])
                off += n
        return out

    # -- moving bytes ---------------------------------------------------------------------------

    def _read(self, objs: list[bytes], bufs: Sequence[Any], per: int) -> list[bool]:
        """Read objects into registered buffers, each under the lease that promised it
        (or a short one the read takes itself); per page, whether all its objects came."""
        pages = len(objs) // per
        with self._client() as client:
            taken = self._pins.take(objs)
            if client is None:
                self._release(None, taken.done)
                return [False] * pages
            # Every object counts as failed until a read says otherwise.
            errs: list[Any] = [_NOT_READ] * len(objs)
            groups: list[tuple[Lease | None, list[int]]] = list(taken.groups.values())
            if taken.unpinned:
                groups.append((None, taken.unpinned))
            for lease, idx in groups:
                got = None
                try:
                    got = self._call(lambda c, lease=lease, idx=idx: c.get_into(  # type: ignore[misc]
                        [objs[i] for i in idx], [bufs[i] for i in idx], lease=lease), client)
                except LeaseExpired as exc:
                    self.stats.lease_expired += len(idx) // per
                    got = [exc] * len(idx)
                if got is None:
                    got = [KVStoreSGLangError("store down")] * len(idx)
                elif lease is not None:
                    self.stats.leased_reads += sum(e is None for e in got) // per
                for i, e in zip(idx, got, strict=True):
                    errs[i] = e
                if self._store.client is None or self._store.outage.down:
                    break
            self._release(client, taken.done)
        return [all(e is None for e in errs[p * per:(p + 1) * per]) for p in range(pages)]

    def _release(self, client: KVStoreClient | None, leases: list[Lease]) -> None:
        if client is None:
            return  # they expire on the master by themselves
        for lease in leases:
            _quiet_release(client, lease)

    def _write(self, objs: list[bytes], bufs: list[Any], per: int,
               copy: bool = False) -> list[bool]:
        pages = len(objs) // per
        with self._client() as client:
            if client is None:
                return [False] * pages
            if copy:  # bytes from unregistered tensors: the client copies them itself
                errs = self._call(lambda c: c.put_many(objs, bufs), client)
            else:
                errs = self._call(lambda c: c.put_from(objs, bufs), client)
        if errs is None:
            return [False] * pages
        bad = [e for e in errs if e is not None]
        if bad:
            log.debug("kvstore_sglang: %d object(s) not stored, first: %s", len(bad), bad[0])
        return [all(e is None for e in errs[p * per:(p + 1) * per]) for p in range(pages)]

    def _note_read(self, ok: list[bool], page_bytes: int, t0: float) -> None:
        with self._lock:  # SGLang's threads share the counters
            self._note_read_locked(ok, page_bytes, t0)

    def _note_read_locked(self, ok: list[bool], page_bytes: int, t0: float) -> None:
        dt = time.perf_counter() - t0
        n = sum(ok)
        self.stats.latency["get"].append(dt)
        self.stats.pages_read += n
        self.stats.pages_read_failed += len(ok) - n
        self.stats.bytes_read += n * page_bytes
        self._metrics["prefetch_pgs"].append(n)
        self._metrics["prefetch_bandwidth"].append(n * page_bytes / (1 << 30) / dt if dt else 0.0)

    def _note_write(self, ok: list[bool], page_bytes: int, t0: float) -> None:
        with self._lock:
            self._note_write_locked(ok, page_bytes, t0)

    def _note_write_locked(self, ok: list[bool], page_bytes: int, t0: float) -> None:
        dt = time.perf_counter() - t0
        n = sum(ok)
        self.stats.latency["set"].append(dt)
        self.stats.pages_written += n
        self.stats.pages_write_failed += len(ok) - n
        self.stats.bytes_written += n * page_bytes
        self._metrics["backup_pgs"].append(n)
        self._metrics["backup_bandwidth"].append(n * page_bytes / (1 << 30) / dt if dt else 0.0)

    # -- the rest -----------------------------------------------------------------------------

    def clear(self) -> bool:
        """Remove every page of this backend's namespace from the store (needs a token
        that may list keys: the admin role on a secured cluster)."""
        _, maker = self._ready()
        prefix = maker.namespace.digest
        removed = 0
        with self._client() as client:
            self._release(client, self._pins.drain())
            if client is None:
                log.warning("kvstore_sglang: clear: the store is down; nothing removed")
                return False
            try:
                from kvstore.v1 import master_pb2 as pb

                while True:
                    # ListKeys is the admin listing the CLI uses; the client has no public
                    # call for it.
                    reply = client._call("ListKeys", pb.ListKeysRequest(prefix=prefix, limit=1000))
                    keys = [o.key for o in reply.objects]
                    if keys:
                        client.remove_many(keys, force=True)
                        removed += len(keys)
                    if not reply.truncated or not keys:
                        break
            except PermissionDenied as exc:
                log.warning("kvstore_sglang: clear needs a token that may list keys (%s); "
                            "nothing more removed", exc)
                return False
            except Exception as exc:
                self._store.failed(exc)
                return False
        log.info("kvstore_sglang: cleared %d object(s) of namespace %s", removed, prefix.hex())
        return True

    def get_stats(self) -> Any:
        """SGLang's StorageMetrics for the calls since the last get_stats (pages and GB/s
        per prefetch and backup call), with `.kvstore`: this backend's counters since it
        was built (hits, misses, bytes, lease use, p50/p99 latencies per operation)."""
        snap = self.stats.snapshot()
        snap["pinned_pages"] = self._pins.pinned_keys() // (self._keys.objects if self._keys else 1)
        try:
            from sglang.srt.observability.metrics_collector import StorageMetrics
        except ImportError:  # pragma: no cover - an SGLang without it
            return snap
        metrics = StorageMetrics()
        for name, values in self._metrics.items():
            getattr(metrics, name).extend(values)
            values.clear()
        metrics.kvstore = snap
        return metrics

    def close(self) -> None:
        with self._lock:
            client = self._store.client
            self._release(client, self._pins.drain())
            self._store.close()


_NOT_READ = KVStoreSGLangError("not read")


def _quiet_release(client: KVStoreClient, lease: Lease, keep_first: int | None = None) -> None:
    """Release (or trim) a lease; a failure is harmless: it expires on the master."""
    with contextlib.suppress(Exception):
        client.release(lease, keep_first=keep_first)


def _bytes_of(tensor: Any) -> np.ndarray:
    """A flat uint8 numpy view of a contiguous CPU tensor (no copy)."""
    if isinstance(tensor, np.ndarray):
        return tensor.reshape(-1).view(np.uint8)
    t = tensor if tensor.is_contiguous() else tensor.contiguous()
    return t.detach().reshape(-1).view(torch.uint8).numpy()


__all__ = ["BadKey", "KVStoreHiCacheStorage", "Stats"]
