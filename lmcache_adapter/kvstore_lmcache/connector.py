"""`KVStoreConnector`: an LMCache `RemoteConnector` over a kvstore cluster.

Threads. LMCache calls the coroutines on its own event loop and the synchronous methods
(`exists_sync`, `batched_contains`, `remove_sync`) from its lookup threads. The kvstore
client is blocking and not thread-safe, so one worker thread owns it: every call is a
job on that thread (coroutines await it, sync methods wait for it). The lease book (what
each lookup pinned) lives on the same thread, so it needs no lock either.

Bytes. A chunk is stored as its raw KV bytes, nothing else: LMCache's chunk shapes,
dtypes and format are fixed by the engine's metadata, and they are part of every key's
namespace (`namespace_digest`), so a reader's local metadata is the writer's by
construction and no per-object header is needed. That makes both directions zero-copy:
LMCache's CPU buffer (the allocator's big tensor every MemoryObj is carved from) is
registered with the client once, puts go `put_from` the MemoryObj's memory, gets
allocate a MemoryObj and `get_into` it. Memory outside that buffer takes the client's
staging path (one copy each way).

The promise. `batched_async_contains(lookup_id, keys, pin=True)` and `batched_contains`
pin the hit prefix under one kvstore lease; the matching get (`batched_get_non_blocking`
with the same lookup id, or a `get`/`batched_get` of those keys) reads under it and then
releases it; a lease no get claims expires after `lease_ttl`. An eviction between
LMCache's lookup and its load therefore cannot turn a reported hit into a miss.

Failures. Nothing here raises into LMCache for a store problem: an unreachable or
failing store makes lookups return 0 and gets return None (LMCache recomputes), puts are
dropped, each with a logged sentence (rate-limited). After a failure the connector does
not call the store again for `retry_interval` seconds, so a dead store costs at most one
client timeout per interval.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import hashlib
import json
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import torch
from lmcache.utils import CacheEngineKey
from lmcache.v1.config import LMCacheEngineConfig
from lmcache.v1.memory_management import MemoryObj
from lmcache.v1.metadata import LMCacheMetadata
from lmcache.v1.storage_backend.connector.base_connector import RemoteConnector

from kvstore.v1 import master_pb2 as pb
from kvstore_client import (
    KVStoreClient,
    KVStoreError,
    Lease,
    LeaseExpired,
    LeaseNotFound,
    NotFound,
    Unavailable,
)
from kvstore_client.outage import Outage
from kvstore_lmcache.options import PLUGIN_TYPE, ConfigError, Options

log = logging.getLogger("kvstore_lmcache")

T = TypeVar("T")

# Bumped when the stored bytes of a chunk change meaning: old objects become misses.
FORMAT_VERSION = 1
KEY_PREFIX = f"lmc{FORMAT_VERSION}/"
LIST_LIMIT = 10000  # keys per list(): one ListKeys reply
LONG_KEY = 768  # store keys longer than this are hashed (the store's limit is 1024 bytes)


def namespace_digest(metadata: LMCacheMetadata, shapes: Sequence[torch.Size],
                     dtypes: Sequence[torch.dtype], fmt: Any, namespace: str) -> str:
    """What a chunk's bytes mean, hashed: two engines share a chunk only when it has the
    same layout for both. The key string itself carries model, world size, worker id,
    the chunk's token hash and KV dtype (LMCache's CacheEngineKey)."""
    desc = {"format": FORMAT_VERSION, "namespace": namespace,
            "shapes": [list(s) for s in shapes], "dtypes": [str(d) for d in dtypes],
            "fmt": str(getattr(fmt, "name", fmt)), "chunk_size": metadata.chunk_size,
            "mla": bool(metadata.use_mla)}
    return hashlib.sha256(json.dumps(desc, sort_keys=True).encode()).hexdigest()[:16]


@dataclass
class ConnectorStats:
    """Counters since the connector started (read them from any thread; approximate)."""

    lookups: int = 0
    hit_chunks: int = 0  # chunks reported present by lookups
    gets: int = 0  # chunks asked for
    got: int = 0  # chunks delivered
    misses: int = 0  # chunks asked for and not delivered
    puts: int = 0  # chunks stored (or already there)
    put_skipped: int = 0  # chunks not stored: refused, store down, failed
    bytes_read: int = 0
    bytes_written: int = 0
    zero_copy_reads: int = 0
    zero_copy_writes: int = 0
    store_down: int = 0  # calls answered as misses because the store failed
    leases_taken: int = 0
    leases_released: int = 0


@dataclass
class _Pin:
    lease: Lease
    left: set[bytes] = field(default_factory=set)  # pinned keys no get has read yet


class _Down(Exception):
    """The store failed recently; the call is a miss without trying (see retry_interval)."""


class KVStoreConnector(RemoteConnector):
    """LMCache remote connector storing chunks in kvstore. Built by
    `KVStoreConnectorAdapter` (options parsed there) or by LMCache's
    DynamicConnectorAdapter as `cls(loop=..., local_cpu_backend=..., config=...)`, in
    which case the options come from extra_config under `remote_storage_plugin.kvstore.`."""

    def __init__(self, loop: asyncio.AbstractEventLoop, local_cpu_backend: Any,
                 config: LMCacheEngineConfig | None, options: Options | None = None,
                 metadata: LMCacheMetadata | None = None, plugin_name: str | None = None) -> None:
        metadata = metadata if metadata is not None else getattr(local_cpu_backend, "metadata", None)
        config = config if config is not None else getattr(local_cpu_backend, "config", None)
        if config is None or metadata is None:
            raise ConfigError("the kvstore connector needs LMCache's engine config and metadata "
                              "(chunk shapes and dtypes); none were given")
        if options is None:
            from kvstore_lmcache.adapter import options_for_plugin

            options = options_for_plugin(config, plugin_name or PLUGIN_TYPE)
        if getattr(config, "use_layerwise", False):
            raise ConfigError("the kvstore plugin stores whole chunks; use_layerwise=True "
                              "(per-layer keys) is not supported")
        serde = getattr(config, "remote_serde", None)
        if serde not in (None, "naive"):
            raise ConfigError(f"the kvstore plugin stores raw chunks; remote_serde={serde!r} "
                              "is not supported (use 'naive', the default)")
        super().__init__(config, metadata)
        self.loop = loop
        self.options = options
        self.metadata = metadata
        self.local_cpu_backend = local_cpu_backend
        self.plugin_name = plugin_name
        self.stats = ConnectorStats()
        self.chunk_bytes: int = self.full_chunk_size_bytes
        digest = namespace_digest(metadata, self.meta_shapes, self.meta_dtypes, self.meta_fmt,
                                  options.namespace)
        self._prefix = f"{KEY_PREFIX}{digest}/".encode()
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="kvstore-lmcache")
        # Worker-thread state (touched only by jobs on _pool).
        self._client: KVStoreClient | None = None
        self._outage = Outage(options.retry_interval)
        self._regions: list[tuple[int, int]] = []
        self._registered: list[Any] = []
        self._pins: dict[str, _Pin] = {}
        self._pinned_by: dict[bytes, str] = {}  # key -> the lookup id whose lease pins it
        self._synthetic = 0
        self._said: dict[str, float] = {}  # log sentence -> when last logged
        self._said_lock = threading.Lock()
        self._closed = False
        # Connect now, in the background: the first call then finds the client ready
        # (or the store known down), and an unreachable etcd never blocks LMCache here.
        self._pool.submit(self._connect_quietly)
        log.info("kvstore connector for %s (namespace %s, chunk %d bytes, zero_copy=%s)",
                 options.etcd, self._prefix.decode(), self.chunk_bytes, options.zero_copy)

    def __repr__(self) -> str:
        return f"<KVStoreConnector etcd={self.options.etcd}>"

    # -- keys -----------------------------------------------------------------------------

    def store_key(self, key: CacheEngineKey) -> bytes:
        """The kvstore key of an LMCache chunk key (this connector's namespace). A key
        string that would pass the store's 1 KiB key limit (long model paths, many
        request tags) is stored under its hash instead."""
        text = key.to_string().encode()
        if len(self._prefix) + len(text) > LONG_KEY:
            text = b"#" + hashlib.sha256(text).hexdigest().encode()
        return self._prefix + text

    def _foreign(self, key: CacheEngineKey) -> str | None:
        """Why `key` is not a key of this engine's namespace, or None if it is."""
        md = self.metadata
        if hasattr(key, "layer_id"):
            return f"key {key.to_string()} is a per-layer key; this plugin stores whole chunks"
        if key.model_name != md.model_name:
            return (f"key {key.to_string()} is of model {key.model_name!r}; this connector "
                    f"serves {md.model_name!r}")
        if key.world_size != md.world_size:
            return (f"key {key.to_string()} is of world size {key.world_size}; this engine "
                    f"runs {md.world_size}")
        return None

    # -- the worker thread ----------------------------------------------------------------

    def _say(self, sentence: str, *args: Any, level: int = logging.WARNING,
             topic: str = "") -> None:
        """Log, at most once per 10 s per topic (the sentence itself when none is given;
        sentences naming a key or an error give one): a dead store, or a stream of
        refused keys, must not flood the log."""
        now = time.monotonic()
        topic = topic or sentence
        with self._said_lock:
            if now - self._said.get(topic, -1e9) < 10.0:
                return
            self._said[topic] = now
        log.log(level, "kvstore: " + sentence, *args)

    def _connect_quietly(self) -> None:
        with contextlib.suppress(_Down):
            self._store()

    def _store(self) -> KVStoreClient:
        """The client, connected; _Down while the store is known to have failed (also
        with a client: a store that failed a call is left alone for retry_interval)."""
        if self._outage.down:
            raise _Down(f"the store failed recently ({self._outage.reason})")
        if self._client is not None:
            return self._client
        if self._closed:
            raise _Down("the connector is closed")
        o = self.options
        try:
            client = KVStoreClient(etcd=o.etcd, cluster=o.cluster, timeout=o.timeout,
                                   replicas=o.replicas, transport=o.transport or None,
                                   same_host=o.same_host)
        except Exception as exc:  # any failure to connect is a miss, never LMCache's crash
            self._failed(f"cannot reach the kvstore cluster at {o.etcd} ({exc}); lookups "
                         f"are misses and puts are dropped, next try in {o.retry_interval:g} s")
            raise _Down(str(exc)) from exc
        self._client = client
        if o.zero_copy:
            self._register(client)
        again = " again" if self._outage.answered() else ""
        log.info("kvstore: connected%s to %s (leader %s)", again, o.etcd, client.master_address)
        return client

    def _register(self, client: KVStoreClient) -> None:
        """Register the CPU buffer LMCache carves MemoryObjs from (zero-copy both ways)."""
        allocator = getattr(self.local_cpu_backend, "memory_allocator", None)
        candidates = [getattr(getattr(allocator, "pin_allocator", None), "buffer", None),
                      getattr(allocator, "buffer", None)]
        for buf in candidates:
            if not isinstance(buf, torch.Tensor) or buf.device.type != "cpu":
                continue
            if not buf.is_contiguous() or not buf.numel():
                continue
            lo = int(buf.data_ptr())
            hi = lo + buf.numel() * buf.element_size()
            if any(a <= lo < b for a, b in self._regions):
                continue
            try:
                client.register(buf)
            except KVStoreError as exc:
                self._say("cannot register LMCache's CPU buffer (%s); chunks go through the "
                          "client's staging buffer (one copy each way)", exc)
                continue
            self._regions.append((lo, hi))
            self._registered.append(buf)
        if not self._regions:
            self._say("LMCache's CPU buffer is not a registrable CPU tensor; chunks go "
                      "through the client's staging buffer (one copy each way)",
                      level=logging.INFO)

    def _failed(self, sentence: str) -> None:
        self.stats.store_down += 1
        if self._outage.fail(sentence):  # one warning per outage
            self._say(sentence, topic="store down")

    def _job(self, what: str, fn: Callable[[KVStoreClient], T], default: T) -> T:
        """Run `fn(client)` on the worker thread; `default` (a miss) if the store fails."""
        try:
            client = self._store()
        except _Down:
            self.stats.store_down += 1
            return default
        try:
            result = fn(client)
        except Unavailable as exc:
            self._failed(f"{what} failed: the store is unavailable ({exc}); treated as a miss, "
                         f"next try in {self.options.retry_interval:g} s")
            return default
        except KVStoreError as exc:
            self._say(f"{what} failed ({type(exc).__name__}: {exc}); treated as a miss", topic=what)
            return default
        except Exception as exc:  # a bug must not take LMCache down either
            log.exception("kvstore: %s failed unexpectedly; treated as a miss", what)
            self._say(f"{what} failed ({type(exc).__name__}: {exc})", topic=what)
            return default
        if self._outage.answered():
            log.info("kvstore: the store at %s answers again", self.options.etcd)
        return result

    def _submit(self, what: str, fn: Callable[[KVStoreClient], T],
                default: T) -> concurrent.futures.Future[T]:
        try:
            return self._pool.submit(self._job, what, fn, default)
        except RuntimeError:  # the pool is shut down: the connector was closed
            done: concurrent.futures.Future[T] = concurrent.futures.Future()
            done.set_result(default)
            return done

    async def _run(self, what: str, fn: Callable[[KVStoreClient], T], default: T) -> T:
        return await asyncio.wrap_future(self._submit(what, fn, default))

    def _run_sync(self, what: str, fn: Callable[[KVStoreClient], T], default: T) -> T:
        if threading.current_thread().name.startswith("kvstore-lmcache"):
            return self._job(what, fn, default)  # already on the worker (never deadlock)
        return self._submit(what, fn, default).result()

    # -- leases (worker thread) -----------------------------------------------------------

    def _expire_pins(self) -> None:
        for lid in [lid for lid, p in self._pins.items() if p.lease.expired]:
            self._forget(lid)  # the master already dropped it: nothing to release

    def _forget(self, lookup_id: str) -> _Pin | None:
        pin = self._pins.pop(lookup_id, None)
        if pin is not None:
            for k in pin.lease.keys:
                if self._pinned_by.get(k) == lookup_id:
                    del self._pinned_by[k]
        return pin

    def _release(self, client: KVStoreClient, lookup_id: str) -> None:
        pin = self._forget(lookup_id)
        if pin is None or not pin.lease.id:
            return
        try:
            client.release(pin.lease)
            self.stats.leases_released += 1
        except KVStoreError as exc:  # it expires by itself after lease_ttl
            self._say(f"releasing a lease failed ({exc}); it expires on its own", topic="release")

    def _pin(self, client: KVStoreClient, lookup_id: str, keys: list[bytes]) -> int:
        """Lookup under a lease kept for `lookup_id`; the number of leading hits."""
        self._expire_pins()
        if lookup_id in self._pins:  # a repeated lookup replaces the earlier pin
            self._release(client, lookup_id)
        lease = client.lookup(keys, ttl=self.options.lease_ttl)
        if not lease.count:
            if lease.id:
                with contextlib.suppress(KVStoreError):
                    client.release(lease)
            return 0
        self.stats.leases_taken += 1
        pin = _Pin(lease, set(lease.keys))
        self._pins[lookup_id] = pin
        for k in lease.keys:
            older = self._pinned_by.get(k)
            self._pinned_by[k] = lookup_id
            if older is not None and older != lookup_id:
                # The newer lease pins this key too: the older one need not wait for it.
                old = self._pins.get(older)
                if old is not None:
                    old.left.discard(k)
                    if not old.left:
                        self._release(client, older)
        return lease.count

    def _claimed(self, client: KVStoreClient, keys: Sequence[bytes]) -> None:
        """These keys were read: leases with nothing left to read are released."""
        done: set[str] = set()
        for k in keys:
            lid = self._pinned_by.get(k)
            pin = self._pins.get(lid) if lid is not None else None
            if pin is not None:
                pin.left.discard(k)
                if not pin.left:
                    done.add(lid)  # type: ignore[arg-type]
        for lid in done:
            self._release(client, lid)

    # -- moving bytes (worker thread) -----------------------------------------------------

    def _view(self, obj: MemoryObj) -> torch.Tensor | None:
        """The chunk's bytes as a flat uint8 CPU tensor over the MemoryObj's memory."""
        raw = getattr(obj, "raw_tensor", None)
        if raw is None or raw.device.type != "cpu":
            return None
        flat = raw.reshape(-1).view(torch.uint8)
        return flat[:obj.get_size()]

    def _registered_view(self, view: torch.Tensor | None) -> bool:
        if view is None:
            return False
        lo = int(view.data_ptr())
        hi = lo + view.numel()
        return any(a <= lo and hi <= b for a, b in self._regions)

    def _stored_size(self, client: KVStoreClient, key: bytes) -> int | None:
        """The size of the object just read, from the client's placement memory (None if
        it kept none): get_into reports success, not how many bytes the object had."""
        state = getattr(client, "_state", None)
        placements = getattr(state, "placements", None)
        seen = placements.recall_one(key) if placements is not None else None
        return int(seen.size) if seen is not None else None

    def _read(self, client: KVStoreClient, keys: list[bytes], objs: list[MemoryObj],
              lease: Lease | None) -> list[bool]:
        """Fill each MemoryObj with its chunk; per key whether it now holds it."""
        views = [self._view(o) for o in objs]
        ok = [False] * len(keys)
        if self.options.zero_copy and all(self._registered_view(v) for v in views):
            try:
                errs = client.get_into(keys, views, lease=lease)
            except (LeaseExpired, LeaseNotFound) as exc:
                # The promise is over (TTL passed): read what is still there, unpinned.
                self._say(f"a lookup's lease ended before its get ({exc}); reading unpinned",
                          topic="lease ended")
                errs = client.get_into(keys, views)
            for i, (k, err) in enumerate(zip(keys, errs, strict=True)):
                if err is None:
                    size = self._stored_size(client, k)
                    if size is not None and size != self.chunk_bytes:
                        self._say(f"object {k!r} holds {size} bytes where a chunk of this "
                                  f"engine has {self.chunk_bytes}; treated as a miss", topic="size")
                        continue
                    ok[i] = True
                    self.stats.zero_copy_reads += 1
                elif not isinstance(err, NotFound):
                    self._say(f"reading a chunk failed ({type(err).__name__}: {err}); "
                              "treated as a miss", topic="read")
            return ok
        datas = client.get_many(keys)
        for i, (k, data, view) in enumerate(zip(keys, datas, views, strict=True)):
            if data is None or view is None:
                continue
            if len(data) != self.chunk_bytes:
                self._say(f"object {k!r} holds {len(data)} bytes where a chunk of this engine "
                          f"has {self.chunk_bytes}; treated as a miss", topic="size")
                continue
            view.copy_(torch.frombuffer(bytearray(data), dtype=torch.uint8))
            ok[i] = True
        return ok

    def _write(self, client: KVStoreClient, keys: list[bytes], objs: list[MemoryObj]) -> int:
        views = [self._view(o) for o in objs]
        if any(v is None for v in views):
            self._say("a chunk to store is not in CPU memory; not stored")
            self.stats.put_skipped += len(keys)
            return 0
        if self.options.zero_copy and all(self._registered_view(v) for v in views):
            errs = client.put_from(keys, views)
            zero_copy = True
        else:
            errs = client.put_many(keys, views)
            zero_copy = False
        stored = 0
        for err, view in zip(errs, views, strict=True):
            if err is None:
                stored += 1
                self.stats.bytes_written += view.numel()  # type: ignore[union-attr]
                self.stats.zero_copy_writes += zero_copy
            else:
                self._say(f"storing a chunk failed ({type(err).__name__}: {err}); not stored", topic="write")
        self.stats.puts += stored
        self.stats.put_skipped += len(keys) - stored
        return stored

    # -- checks before a call (loop thread) -----------------------------------------------

    def _admit(self, keys: Sequence[CacheEngineKey], what: str) -> list[bytes] | None:
        """Store keys for `keys`, or None (with a sentence) if any is not this engine's."""
        for k in keys:
            why = self._foreign(k)
            if why is not None:
                self._say(f"{what}: {why}; treated as a miss", topic="foreign")
                return None
        return [self.store_key(k) for k in keys]

    def _leading(self, keys: Sequence[CacheEngineKey], what: str) -> list[bytes]:
        """Store keys of the leading keys that are this engine's (a lookup counts a prefix)."""
        out: list[bytes] = []
        for k in keys:
            why = self._foreign(k)
            if why is not None:
                self._say(f"{what}: {why}; the lookup stops there", topic="foreign")
                break
            out.append(self.store_key(k))
        return out

    def _allocate(self, n: int) -> list[MemoryObj]:
        """Up to n full-chunk MemoryObjs (fewer when LMCache's CPU buffer is full)."""
        objs: list[MemoryObj] = []
        for _ in range(n):
            try:
                obj = self.local_cpu_backend.allocate(self.meta_shapes, self.meta_dtypes,
                                                      self.meta_fmt, busy_loop=False)
            except Exception as exc:  # the scheduler role's stub backend allocates nothing
                self._say(f"cannot allocate a chunk in LMCache's CPU buffer ({exc}); a miss",
                          topic="allocate")
                break
            if obj is None:
                self._say("LMCache's CPU buffer is full; the remaining chunks are misses")
                break
            objs.append(obj)
        return objs

    # -- RemoteConnector ------------------------------------------------------------------

    async def exists(self, key: CacheEngineKey) -> bool:
        return await self._run("exists", lambda c: self._exists(c, [key]) == 1, False)

    def exists_sync(self, key: CacheEngineKey) -> bool:
        return self._run_sync("exists", lambda c: self._exists(c, [key]) == 1, False)

    def _exists(self, client: KVStoreClient, keys: Sequence[CacheEngineKey]) -> int:
        skeys = self._leading(keys, "exists")
        if not skeys:
            return 0
        found = client.exists(skeys)
        return found.index(False) if False in found else len(found)

    def support_batched_contains(self) -> bool:
        return True

    def batched_contains(self, keys: list[CacheEngineKey]) -> int:
        """Leading keys present, pinned until they are read (LMCache's synchronous lookup
        path: its retrieve reads them with `batched_get`) or lease_ttl passes."""
        def job(client: KVStoreClient) -> int:
            skeys = self._leading(keys, "batched_contains")
            if not skeys:
                return 0
            self._synthetic += 1
            n = self._pin(client, f"\0contains-{self._synthetic}", skeys)
            self.stats.lookups += 1
            self.stats.hit_chunks += n
            return n

        return self._run_sync("batched_contains", job, 0)

    def support_batched_async_contains(self) -> bool:
        return True

    async def batched_async_contains(self, lookup_id: str, keys: list[CacheEngineKey],
                                     pin: bool = False) -> int:
        """Leading keys present. With pin=True they stay pinned under one lease until
        `batched_get_non_blocking(lookup_id, ...)` (or a get of those keys) reads them, or
        lease_ttl passes."""
        def job(client: KVStoreClient) -> int:
            if pin:
                skeys = self._leading(keys, "batched_async_contains")
                n = self._pin(client, lookup_id, skeys) if skeys else 0
            else:
                n = self._exists(client, keys)
            self.stats.lookups += 1
            self.stats.hit_chunks += n
            return n

        return await self._run("batched_async_contains", job, 0)

    def support_batched_get(self) -> bool:
        return True

    async def get(self, key: CacheEngineKey) -> MemoryObj | None:
        return (await self.batched_get([key]))[0]

    async def batched_get(self, keys: list[CacheEngineKey]) -> list[MemoryObj | None]:
        return await self._get(None, keys)

    def support_batched_get_non_blocking(self) -> bool:
        return True

    async def batched_get_non_blocking(self, lookup_id: str,
                                       keys: list[CacheEngineKey]) -> list[MemoryObj]:
        """The leading chunks read (under `lookup_id`'s lease when it pinned them); the
        lease is released afterwards."""
        got = await self._get(lookup_id, keys)
        out: list[MemoryObj] = []
        for obj in got:
            if obj is None:
                break
            out.append(obj)
        for obj in got[len(out):]:
            if obj is not None:
                obj.ref_count_down()
        return out

    async def _get(self, lookup_id: str | None, keys: list[CacheEngineKey]) -> list[MemoryObj | None]:
        self.stats.gets += len(keys)
        out: list[MemoryObj | None] = [None] * len(keys)
        skeys = self._admit(keys, "get")
        objs = self._allocate(len(keys)) if skeys else []
        n = len(objs)

        def job(client: KVStoreClient) -> list[bool]:
            assert skeys is not None
            try:
                pin = self._pins.get(lookup_id) if lookup_id is not None else None
                lease = pin.lease if pin is not None and set(skeys[:n]) <= set(pin.lease.keys) else None
                return self._read(client, skeys[:n], objs, lease)
            finally:
                if lookup_id is not None:
                    self._release(client, lookup_id)
                self._claimed(client, skeys)

        ok = await self._run("get", job, [False] * n) if n else []
        for i, (obj, good) in enumerate(zip(objs, ok, strict=True)):
            if good:
                out[i] = obj
                self.stats.got += 1
                self.stats.bytes_read += self.chunk_bytes
            else:
                obj.ref_count_down()
        self.stats.misses += sum(o is None for o in out)
        return out

    async def put(self, key: CacheEngineKey, memory_obj: MemoryObj) -> None:
        await self.batched_put([key], [memory_obj])

    def support_batched_put(self) -> bool:
        return True

    async def batched_put(self, keys: list[CacheEngineKey], memory_objs: list[MemoryObj]) -> None:
        """Store the chunks; LMCache's wrapper drops its references once this returns.
        A chunk that is not a full chunk of this engine, or of another namespace, is not
        stored (a sentence says so); store failures are logged, never raised."""
        send_keys: list[bytes] = []
        send: list[MemoryObj] = []
        for key, obj in zip(keys, memory_objs, strict=True):
            why = self._foreign(key)
            size = obj.get_size()
            if why is None and size != self.chunk_bytes:
                why = (f"chunk {key.to_string()} has {size} bytes, a full chunk {self.chunk_bytes} "
                       "(partial chunks, save_unfull_chunk=True, are not stored)")
            if why is not None:
                self._say(f"put: {why}; not stored", topic="put refused")
                self.stats.put_skipped += 1
                continue
            send_keys.append(self.store_key(key))
            send.append(obj)
        if not send:
            return

        def job(client: KVStoreClient) -> int:
            return self._write(client, send_keys, send)

        stored = await self._run("put", job, -1)
        if stored < 0:
            self.stats.put_skipped += len(send)

    def remove_sync(self, key: CacheEngineKey) -> bool:
        skeys = self._admit([key], "remove")
        if skeys is None:
            return False
        return self._run_sync("remove", lambda c: c.remove(skeys[0]), False)

    async def list(self) -> list[str]:
        """The LMCache keys (as strings) this namespace holds, at most LIST_LIMIT."""
        def job(client: KVStoreClient) -> list[str]:
            # An operator call of the master; the client has no public wrapper for it.
            reply = client._call("ListKeys", pb.ListKeysRequest(prefix=self._prefix, limit=LIST_LIMIT))
            if reply.truncated:
                self._say(f"list: more than {LIST_LIMIT} keys; the first {LIST_LIMIT} listed")
            n = len(self._prefix)
            return [o.key[n:].decode(errors="replace") for o in reply.objects
                    if o.state == "complete"]

        return await self._run("list", job, [])

    async def close(self) -> None:
        await asyncio.wrap_future(self._pool.submit(self._shutdown))
        self._pool.shutdown(wait=True)

    def _shutdown(self) -> None:
        self._closed = True
        client, self._client = self._client, None
        if client is None:
            return
        for lid in list(self._pins):
            self._release(client, lid)
        for buf in self._registered:
            with contextlib.suppress(KVStoreError):
                client.unregister(buf)
        self._registered.clear()
        self._regions.clear()
        with contextlib.suppress(Exception):
            client.close()

