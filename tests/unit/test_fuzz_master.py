"""Bad input at every master RPC: a typed error or a per-key code, never a crash, never
an INTERNAL error (which would mean a bug), and no state change when a call fails."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvstore.errors import Code
from kvstore.master.core import CoreConfig, ManualClock, MasterCore
from kvstore.master.metrics import MasterMetrics
from kvstore.master.service import MasterService
from kvstore.rpc.methods import METHODS
from kvstore.v1 import master_pb2 as pb


class Leader:
    is_leader = True
    epoch = 7
    leader_address = "127.0.0.1:1"
    leader_for = 1.0


def make_service() -> MasterService:
    core = MasterCore(CoreConfig(), ManualClock())
    core.mount_segment("n0", "seg0", 1 << 32, 1 << 20)
    core.mount_segment("n1", "seg1", 1 << 33, 1 << 20)
    service = MasterService(core, Leader(), MasterMetrics())
    # Something to find, pin and break.
    service.handle("PutStart", pb.PutStartRequest(keys=[b"a", b"b"], sizes=[10, 20],
                                                   checksums=[1, 2]))
    service.handle("PutEnd", pb.KeysRequest(keys=[b"a", b"b"]))
    return service


SERVICE = make_service()

keys = st.lists(st.one_of(st.binary(max_size=1100), st.text(max_size=40).map(str.encode),
                          st.sampled_from([b"a", b"b", b""])), max_size=40)
u64 = st.one_of(st.integers(0, 2**64 - 1), st.sampled_from([0, 1, 2**63, 2**64 - 1]))
ttl = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([0.0, -1.0]))


def structured(method: str) -> st.SearchStrategy[Any]:
    req = METHODS[method].request
    fields = {f.name: f for f in req.DESCRIPTOR.fields}

    def build(draw_keys: list[bytes], ints: list[int], floats: float, flag: bool,
              text: str) -> Any:
        msg = req()
        for name, f in fields.items():
            if f.type == f.TYPE_BYTES and f.is_repeated:
                getattr(msg, name).extend(draw_keys)
            elif f.type == f.TYPE_BYTES:
                setattr(msg, name, draw_keys[0] if draw_keys else b"")
            elif f.type in (f.TYPE_UINT64, f.TYPE_UINT32) and f.is_repeated:
                bits = 64 if f.type == f.TYPE_UINT64 else 32
                getattr(msg, name).extend(i % (1 << bits) for i in ints)
            elif f.type in (f.TYPE_UINT64, f.TYPE_UINT32):
                bits = 64 if f.type == f.TYPE_UINT64 else 32
                setattr(msg, name, (ints[0] if ints else 0) % (1 << bits))
            elif f.type in (f.TYPE_DOUBLE, f.TYPE_FLOAT):
                setattr(msg, name, floats)
            elif f.type == f.TYPE_BOOL:
                setattr(msg, name, flag)
            elif f.type == f.TYPE_STRING and not f.is_repeated:
                setattr(msg, name, text)
        return msg

    return st.builds(build, keys, st.lists(u64, max_size=40), ttl, st.booleans(),
                     st.text(max_size=30))


def check(method: str, request: Any) -> None:
    before = SERVICE.core.stats()
    reply = SERVICE.handle(method, request)
    assert reply.epoch == 7
    assert reply.error.code != Code.INTERNAL, (method, request, reply.error.message)
    if reply.error.code:
        assert reply.error.message, "every error carries a sentence"
        after = SERVICE.core.stats()
        assert (after.objects_complete, after.objects_pending, after.pool_used,
                after.active_leases) == (before.objects_complete, before.objects_pending,
                                         before.pool_used, before.active_leases), method
    for code in getattr(reply, "codes", []):
        assert code != Code.INTERNAL
    for item in list(getattr(reply, "items", [])):
        assert getattr(item, "code", 0) != Code.INTERNAL


STATEFUL = ("UnmountSegment", "Drain", "SetDraining", "Evict")  # change state on purpose
FUZZED = sorted(m for m in METHODS if m not in STATEFUL)


# Every RPC gets its own examples (a shared draw left some with none).
@pytest.mark.parametrize("method", FUZZED)
@settings(max_examples=40, deadline=None, derandomize=True,
          suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_structured_garbage_at_every_rpc(method: str, data: st.DataObject) -> None:
    check(method, data.draw(structured(method)))


@pytest.mark.parametrize("method", FUZZED)
@settings(max_examples=40, deadline=None, derandomize=True,
          suppress_health_check=list(HealthCheck))
@given(data=st.data(), cut=st.floats(0.0, 1.0), noise=st.binary(max_size=8))
def test_messages_cut_short_or_with_junk_appended(method: str, data: st.DataObject, cut: float,
                                                  noise: bytes) -> None:
    """A well-formed message cut at a random byte (then maybe junk): either the transport
    refuses it as no message, or the handler answers with a typed error or a result."""
    raw = data.draw(structured(method)).SerializeToString()
    raw = raw[:int(len(raw) * cut)] + noise
    try:
        msg = METHODS[method].request.FromString(raw)
    except Exception:
        return  # not a message: the transport refuses it before any handler
    check(method, msg)


@settings(max_examples=200, deadline=None, derandomize=True,
          suppress_health_check=list(HealthCheck))
@given(st.sampled_from(FUZZED), st.binary(max_size=200))
def test_random_bytes(method: str, raw: bytes) -> None:
    try:
        msg = METHODS[method].request.FromString(raw)
    except Exception:
        return
    if method != "MountSegment":
        check(method, msg)


def test_lease_ids_of_other_clients_and_huge_batches() -> None:
    service = make_service()  # the fuzz tests above may have removed a and b
    lease = service.handle("Lookup", pb.LookupRequest(keys=[b"a", b"b"], holder="x"))
    assert lease.count == 2
    for lease_id in (lease.lease_id + 1, 2**64 - 1, 12345):
        r = service.handle("GetReplicas", pb.GetReplicasRequest(keys=[b"a"], lease_id=lease_id))
        assert r.error.code in (Code.LEASE_NOT_FOUND, Code.LEASE_EXPIRED)
    big = pb.KeysRequest(keys=[b"k"] * 100_000)
    r = service.handle("Exists", big)
    assert r.error.code == Code.INVALID_ARGUMENT and "batch" in r.error.message.lower()
    assert service.handle("ReleaseLease", pb.ReleaseLeaseRequest(lease_id=lease.lease_id)).error.code == 0


def _tenant_service() -> tuple[MasterService, Any]:
    from kvstore.security.access import AccessList, Authenticator, token_hash

    acl = AccessList.parse({"tenants": {"t": {"quota_bytes": 1 << 16}},
                            "tokens": [{"name": "c", "role": "client", "tenant": "t",
                                        "sha256": token_hash("tok")}]})
    core = MasterCore(CoreConfig(), ManualClock())
    core.mount_segment("n0", "seg0", 1 << 32, 1 << 20)
    core.set_quotas(acl.quotas())
    auth = Authenticator(acl)
    service = MasterService(core, Leader(), MasterMetrics(), auth)
    # another tenant's object, which no input of tenant t may reach
    core.put_start([b"u/secret"], [10], [1])
    core.put_end([b"u/secret"])
    return service, auth.principal("tok")


TENANT_SERVICE, TENANT = _tenant_service()


@pytest.mark.parametrize("method", sorted(METHODS))
@settings(max_examples=25, deadline=None, derandomize=True,
          suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_a_tenant_cannot_reach_outside_its_namespace(method: str, data: st.DataObject) -> None:
    """Whatever a client of tenant t sends, to any RPC: no INTERNAL, operator calls are
    refused, and every key in the index is t's or the one other tenant's untouched."""
    request = data.draw(structured(method))
    reply = TENANT_SERVICE.handle(method, request, TENANT)
    assert reply.error.code != Code.INTERNAL, (method, reply.error.message)
    if not TENANT.may_call(method):
        assert reply.error.code == Code.PERMISSION_DENIED
    core = TENANT_SERVICE.core
    assert core.exists([b"u/secret"]) == [True]
    assert core.inspect(b"u/secret").pins == 0  # type: ignore[union-attr]
    assert all(k.startswith((b"t/", b"u/secret")) for k in core.keys(b"", 100_000))
