"""Tenant quotas: bytes per tenant key prefix (b"team-a/"), PENDING included.

The usage counts live in the object table (ObjectTable.usage, kept only for tenants with
a quota, so the common path pays nothing); this module sets the quotas and decides a
put's fate against them. A put over its tenant's quota first evicts that tenant's own
least recently used objects (never another tenant's); QUOTA_EXCEEDED when what is left
of the tenant's is pinned or PENDING.
"""

from __future__ import annotations

from .eviction import Eviction
from .objects import tenant_prefix
from .state import CoreState


class Quotas:
    def __init__(self, state: CoreState, eviction: Eviction) -> None:
        self._state = state
        self._t = state.objects
        self._eviction = eviction

    def set_quotas(self, quotas: dict[bytes, int]) -> None:
        state = self._state
        state.quotas = {p: q for p, q in quotas.items() if q > 0}
        t = self._t
        if not state.quotas:
            t.usage = None
            return
        usage = dict.fromkeys(state.quotas, 0)
        for key, s in t.index.items():
            p = tenant_prefix(key)
            if p in usage:
                usage[p] += t.size[s]
        t.usage = usage

    def tenant_usage(self) -> dict[bytes, tuple[int, int]]:
        """Tenant prefix -> (bytes used, quota), for the tenants with a quota."""
        usage = self._t.usage or {}
        return {p: (usage.get(p, 0), q) for p, q in self._state.quotas.items()}

    def room(self, key: bytes, size: int, now: float) -> tuple[str, str] | None:
        """None when `key`'s tenant may hold `size` more bytes (after evicting some of
        its own objects if need be); otherwise why not: (failure reason, message), for
        a QUOTA_EXCEEDED answer."""
        prefix = tenant_prefix(key)
        quota = self._state.quotas.get(prefix)
        usage = self._t.usage
        if not quota or usage is None:
            return None
        need = usage[prefix] + size - quota
        if need <= 0:
            return None
        tenant = prefix[:-1].decode(errors="replace")
        if size > quota:
            return ("quota", f"object of {size} bytes is larger than tenant {tenant}'s whole "
                    f"quota ({quota} bytes)")
        if now >= self._state.hold_until:
            self._eviction.evict_tenant(prefix, need)
            need = usage[prefix] + size - quota
            if need <= 0:
                return None
        return ("quota", f"tenant {tenant} is at its quota: {usage[prefix]} of {quota} bytes "
                "held by objects that are pinned or still being written; retry after readers "
                "release their leases, or ask for a larger quota")

    def crosses(self, placeholder: bytes, key: bytes) -> bool:
        """Whether renaming `placeholder` to `key` would move bytes into or out of a
        tenant with a quota without put_start's check (put_commit refuses that)."""
        quotas = self._state.quotas
        was, now = tenant_prefix(placeholder), tenant_prefix(key)
        return (was in quotas or now in quotas) and was != now

