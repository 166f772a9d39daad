"""Tenants in the master: quotas in the core, lease ownership, and the service's role
check and key namespaces (one tenant cannot name another's keys)."""

from __future__ import annotations

import pytest

from kvstore.errors import Code, LeaseNotFound
from kvstore.master.core import CoreConfig, ManualClock, MasterCore
from kvstore.master.metrics import MasterMetrics
from kvstore.master.service import MasterService
from kvstore.security.access import AccessList, Authenticator, new_token, token_hash
from kvstore.v1 import master_pb2 as pb

KiB = 1 << 10


def make(seg: int = 1 << 20) -> tuple[MasterCore, ManualClock]:
    clock = ManualClock()
    core = MasterCore(CoreConfig(), clock)
    core.mount_segment("n0", "seg0", 1 << 32, seg)
    return core, clock


def put(core: MasterCore, keys: list[bytes], size: int = KiB) -> list[Code]:
    rs = core.put_start(keys, [size] * len(keys), [7] * len(keys))
    ok = [k for k, r in zip(keys, rs, strict=True) if r.code == Code.OK]
    core.put_end(ok)
    return [r.code for r in rs]


def test_quota_evicts_own_lru_never_another_tenants() -> None:
    core, clock = make()
    core.set_quotas({b"a/": 3 * KiB})
    assert put(core, [b"b/0", b"a/0", b"a/1", b"a/2"]) == [Code.OK] * 4
    assert core.tenant_usage() == {b"a/": (3 * KiB, 3 * KiB)}
    clock.advance(1)
    core.lookup([b"a/0"])  # a/0 is pinned; a/1 is now a's oldest evictable
    assert put(core, [b"a/3"]) == [Code.OK]
    assert core.exists([b"b/0", b"a/0", b"a/1", b"a/2", b"a/3"]) == [True, True, False, True, True]
    assert core.tenant_usage()[b"a/"][0] == 3 * KiB
    st = core.stats()
    assert st.tenants == {"a": (3 * KiB, 3 * KiB)} and st.quota_evictions == 1


def test_quota_refuses_when_the_rest_is_pinned_or_pending() -> None:
    core, _ = make()
    core.set_quotas({b"a/": 2 * KiB})
    rs = core.put_start([b"a/p"], [KiB], [1])  # PENDING counts
    assert rs[0].code == Code.OK
    assert put(core, [b"a/x"]) == [Code.OK]
    core.lookup([b"a/x"])
    r = core.put_start([b"a/y"], [KiB], [1])[0]
    assert r.code == Code.QUOTA_EXCEEDED and "at its quota" in r.message
    r = core.put_start([b"a/big"], [3 * KiB], [1])[0]
    assert r.code == Code.QUOTA_EXCEEDED and "whole quota" in r.message
    assert put(core, [b"b/free"]) == [Code.OK]  # no quota for b


def test_usage_follows_removes_and_set_quotas_counts_existing() -> None:
    core, _ = make()
    put(core, [b"a/0", b"a/1", b"c/0"])
    core.set_quotas({b"a/": 10 * KiB})
    assert core.tenant_usage() == {b"a/": (2 * KiB, 10 * KiB)}
    core.remove([b"a/0"])
    assert core.tenant_usage()[b"a/"][0] == KiB
    core.set_quotas({})
    assert core.tenant_usage() == {}
    assert put(core, [b"a/2"]) == [Code.OK]


def test_leases_are_owned_by_their_tenant() -> None:
    core, _ = make()
    put(core, [b"a/0"])
    lease = core.lookup([b"a/0"], owner="a").lease_id
    with pytest.raises(LeaseNotFound):
        core.renew_lease(lease, owner="b")
    with pytest.raises(LeaseNotFound):
        core.get_replicas([b"a/0"], lease, owner="b")
    with pytest.raises(LeaseNotFound):
        core.release_lease(lease, owner="b")
    core.renew_lease(lease, owner="a")
    core.renew_lease(lease)  # admin (no owner check)
    core.release_lease(lease, owner="a")
    assert core.inspect(b"a/0").pins == 0  # type: ignore[union-attr]


class Leader:
    is_leader = True
    epoch = 3
    leader_address = "127.0.0.1:1"
    leader_for = 1.0


def test_service_namespaces_keys_and_checks_roles() -> None:
    tokens = {"a": new_token(), "b": new_token(), "adm": new_token()}
    acl = AccessList.parse({
        "tenants": {"ta": {"quota_bytes": 0}, "tb": {}},
        "tokens": [{"name": "a", "role": "client", "tenant": "ta", "sha256": token_hash(tokens["a"])},
                   {"name": "b", "role": "client", "tenant": "tb", "sha256": token_hash(tokens["b"])},
                   {"name": "adm", "role": "admin", "sha256": token_hash(tokens["adm"])}],
    })
    core, _ = make()
    auth = Authenticator(acl)
    svc = MasterService(core, Leader(), MasterMetrics(), auth)
    a, b, adm = (auth.principal(tokens[k]) for k in ("a", "b", "adm"))
    r = svc.handle("PutStart", pb.PutStartRequest(keys=[b"k"], sizes=[10], checksums=[1]), a)
    assert r.items[0].code == 0
    assert list(svc.handle("PutEnd", pb.KeysRequest(keys=[b"k"]), a).codes) == [0]
    assert list(svc.handle("Exists", pb.KeysRequest(keys=[b"k"]), a).exists) == [True]
    assert list(svc.handle("Exists", pb.KeysRequest(keys=[b"k"]), b).exists) == [False]
    assert svc.handle("Lookup", pb.LookupRequest(keys=[b"k"]), b).count == 0
    assert list(svc.handle("Remove", pb.RemoveRequest(keys=[b"k"]), b).codes) == [Code.NOT_FOUND]
    assert core.exists([b"ta/k"]) == [True]
    listed = svc.handle("ListKeys", pb.ListKeysRequest(limit=10), adm)
    assert [o.key for o in listed.objects] == [b"ta/k"]
    denied = svc.handle("ListKeys", pb.ListKeysRequest(limit=10), a)
    assert denied.error.code == Code.PERMISSION_DENIED
    who = svc.handle("Authenticate", pb.AuthenticateRequest(token=tokens["b"]))
    assert (who.role, who.tenant, who.error.code) == ("client", "tb", 0)
    bad = svc.handle("Authenticate", pb.AuthenticateRequest(token="nope"))
    assert bad.error.code == Code.UNAUTHENTICATED
