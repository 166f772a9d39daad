"""The connector's store link: a store found down costs the scheduler nothing more."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from kvstore.errors import Unavailable
from kvstore_vllm.link import StoreLink
from kvstore_vllm.settings import Settings


def test_a_down_store_fails_calls_at_once_even_while_the_link_is_busy() -> None:
    link = StoreLink(Settings(etcd="127.0.0.1:1", timeout=1.0, retry_interval=5.0), "test")
    release, started = threading.Event(), threading.Event()

    async def stuck(_client: Any) -> None:
        started.set()
        release.wait(5.0)  # the link's loop is busy, as while it starts a Transfer Engine

    try:
        # Busy the loop without touching the store (the op runs before any client exists).
        link._client = object()  # type: ignore[assignment]
        link._connected = True
        busy = link.submit(stuck)
        assert started.wait(5.0)
        link.mark_down("cannot reach the kvstore master (test)")
        t = time.monotonic()
        with pytest.raises(Unavailable, match="treated as down"):
            link.call(stuck, timeout=3.0)
        assert time.monotonic() - t < 0.2  # not queued behind the busy loop
        release.set()
        busy.result(5.0)
    finally:
        release.set()
        link._client = None
        link.close()
