"""Bad input at every master RPC: a typed error or a per-key code, never a crash, never
an INTERNAL error (which would mean a bug), and no state change when a call fails."""

from __future__ import annotations

from typing import Any

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


# Read-only and cheap methods get the most examples; all of them get some.
@settings(max_examples=60, deadline=None, derandomize=True,
          suppress_health_check=list(HealthCheck))
@given(st.sampled_from(sorted(METHODS)), st.data())
def test_structured_garbage_at_every_rpc(method: str, data: st.DataObject) -> None:
    if method in ("UnmountSegment", "Drain", "SetDraining", "Evict"):
        return  # they change state on purpose; covered by their own tests
    check(method, data.draw(structured(method)))


@settings(max_examples=200, deadline=None, derandomize=True,
          suppress_health_check=list(HealthCheck))
@given(st.sampled_from(sorted(METHODS)), st.binary(max_size=200))
def test_random_bytes_cut_short_messages(method: str, raw: bytes) -> None:
    req = METHODS[method].request
    try:
        msg = req.FromString(raw)
    except Exception:
        return  # not a message at all: the transport refuses it before any handler
    if method in ("UnmountSegment", "Drain", "SetDraining", "Evict", "MountSegment"):
        return
    check(method, msg)


def test_lease_ids_of_other_clients_and_huge_batches() -> None:
    lease = SERVICE.handle("Lookup", pb.LookupRequest(keys=[b"a", b"b"], holder="x"))
    assert lease.count == 2
    for lease_id in (lease.lease_id + 1, 2**64 - 1, 12345):
        r = SERVICE.handle("GetReplicas", pb.GetReplicasRequest(keys=[b"a"], lease_id=lease_id))
        assert r.error.code in (Code.LEASE_NOT_FOUND, Code.LEASE_EXPIRED)
    big = pb.KeysRequest(keys=[b"k"] * 100_000)
    r = SERVICE.handle("Exists", big)
    assert r.error.code == Code.INVALID_ARGUMENT and "batch" in r.error.message.lower()
    assert SERVICE.handle("ReleaseLease", pb.ReleaseLeaseRequest(lease_id=lease.lease_id)).error.code == 0
