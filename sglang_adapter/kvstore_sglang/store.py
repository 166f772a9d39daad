"""The backend's link to kvstore: one client, built lazily, and whether the store is
down right now. A store that failed a call is left alone for `retry_interval` seconds
(misses and failed writes at once; `kvstore_client.outage`, the rule every adapter
follows), so SGLang's threads never wait a timeout per call while it is down; one
warning per outage, one line when it answers again."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from kvstore_client import KVStoreClient
from kvstore_client.outage import Outage
from kvstore_sglang.settings import Settings
from kvstore_sglang.stats import Stats

log = logging.getLogger("kvstore_sglang")


class StoreLink:
    """The client, built lazily, and whether the store is down right now."""

    def __init__(self, settings: Settings, stats: Stats) -> None:
        self.settings = settings
        self.stats = stats
        self.client: KVStoreClient | None = None
        self.outage = Outage(settings.retry_interval)
        self.buffers: list[Any] = []  # registered with every client built

    def describe(self) -> str:
        s = self.settings
        return f"master={s.master}" if s.master else f"etcd={s.etcd} cluster={s.cluster}"

    def get(self) -> KVStoreClient | None:
        """The client, or None while the store counts as down."""
        if self.outage.down:
            return None
        if self.client is None:
            self._connect()
        return self.client

    def _connect(self) -> None:
        s = self.settings
        token = Path(s.token_file).read_text().strip() if s.token_file else None
        try:
            client = KVStoreClient(
                s.etcd, master=s.master or None, cluster=s.cluster, timeout=s.timeout,
                host=s.host, protocol=s.protocol, device=s.device, same_host=s.same_host,
                token=token, tls_ca=s.tls_ca or None, tls_server_name=s.tls_server_name or None)
        except Exception as exc:  # any failure to connect is the store down
            self.failed(exc)
            return
        try:
            for buf in self.buffers:
                client.register(buf)
        except Exception as exc:
            client.close()
            self.failed(exc)
            return
        if self.outage.answered():
            log.info("kvstore_sglang: store %s reachable again", self.describe())
        self.client = client

    def register(self, buf: Any) -> None:
        """Register memory with this client and every later one. A failure is the store
        down (the next client, built after `retry_interval`, registers it again)."""
        self.buffers.append(buf)
        if self.client is not None:
            try:
                self.client.register(buf)
            except Exception as exc:  # the engine must start without the store
                self.close()
                self.failed(exc)

    def failed(self, exc: BaseException) -> None:
        """The store did not answer: misses and failed writes for `retry_interval`."""
        self.stats.store_down += 1
        reason = f"{type(exc).__name__}: {exc}"
        if self.outage.fail(reason):  # one line per outage, not one per call
            log.warning("kvstore_sglang: store %s unavailable (%s); pages are misses and "
                        "writes fail for the next %.0f s, then it is tried again",
                        self.describe(), reason, self.settings.retry_interval)

    def close(self) -> None:
        if self.client is not None:
            self.client.close()
            self.client = None
