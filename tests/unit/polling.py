"""Waiting in a test for something to happen: poll for it, never sleep a guessed time.

A test asserts the condition, not how soon it came: under load (CI, a shared machine)
anything can take longer, and a bound tight enough to say "promptly" flakes. The bound
here is a safety net that keeps a broken feature from hanging the run, far past what a
working one needs; failing it says what did not happen.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

PATIENCE = 30.0  # seconds: generous, a safety net and not the assertion


def _say(what: str | Callable[[], str]) -> str:
    return what if isinstance(what, str) else what()


def wait_until(pred: Callable[[], T], timeout: float = PATIENCE,
               what: str | Callable[[], str] = "the condition",
               interval: float = 0.01) -> T:
    """Poll `pred` until it returns something true, and return that. After `timeout`
    seconds without, fail with `what` (a callable: built only then, e.g. with logs)."""
    deadline = time.monotonic() + timeout
    while True:
        got = pred()
        if got:
            return got
        if time.monotonic() >= deadline:
            raise AssertionError(f"not so after {timeout:g} s: {_say(what)}")
        time.sleep(interval)


async def wait_until_async(pred: Callable[[], T], timeout: float = PATIENCE,
                           what: str | Callable[[], str] = "the condition",
                           interval: float = 0.01) -> T:
    """`wait_until` inside a coroutine: the loop runs between polls."""
    deadline = time.monotonic() + timeout
    while True:
        got = pred()
        if got:
            return got
        if time.monotonic() >= deadline:
            raise AssertionError(f"not so after {timeout:g} s: {_say(what)}")
        await asyncio.sleep(interval)
