"""Etcd.keep_alive: when an unreachable etcd ends a lease, and when only etcd's answer does."""

from __future__ import annotations

import asyncio
import time

from kvstore.coord.etcd import Etcd
from kvstore.errors import Unavailable


def keeper(answers: list[object]) -> Etcd:
    """An Etcd whose refreshes follow `answers`: a TTL, or an exception to raise; the last
    answer repeats."""
    etcd = object.__new__(Etcd)
    etcd.timeout = 5.0

    async def refresh(lease_id: int, timeout: float | None = None) -> int:
        answer = answers.pop(0) if len(answers) > 1 else answers[0]
        if isinstance(answer, BaseException):
            raise answer
        assert isinstance(answer, int)
        return answer

    etcd.refresh = refresh  # type: ignore[method-assign]
    return etcd


def run(etcd: Etcd, confirm_loss: bool, seconds: float) -> float | None:
    """Seconds until on_lost ran, or None if it had not after `seconds` (keep_alive
    returns once it ran, so a generous `seconds` costs nothing where it does)."""
    lost: list[float] = []
    t0 = time.monotonic()

    async def main() -> None:
        task = asyncio.ensure_future(etcd.keep_alive(7, 1, lambda: lost.append(time.monotonic() - t0),
                                                     confirm_loss=confirm_loss))
        done, _ = await asyncio.wait({task}, timeout=seconds)
        if not done:
            task.cancel()
        else:
            task.result()  # a keep_alive that crashed fails the test, not passes it

    asyncio.run(main())
    return lost[0] if lost else None


def test_unreachable_etcd_ends_the_lease_at_its_deadline() -> None:
    took = run(keeper([Unavailable("etcd down")]), confirm_loss=False, seconds=60.0)
    assert took is not None and took > 0.9  # at the deadline, not before


def test_with_confirm_loss_an_outage_does_not_end_the_lease() -> None:
    # etcd away for 2 TTLs, then back with the lease restored (as after a restart)
    down = [Unavailable("etcd down")] * 6
    assert run(keeper([*down, 1]), confirm_loss=True, seconds=2.8) is None


def test_with_confirm_loss_etcd_saying_the_lease_is_gone_ends_it() -> None:
    took = run(keeper([Unavailable("etcd down")] * 5 + [0]), confirm_loss=True, seconds=60.0)
    assert took is not None and took > 1.5  # after the outage, at etcd's answer
