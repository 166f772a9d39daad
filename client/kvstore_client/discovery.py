"""Finding the leader: from etcd's leader key, or by asking the masters themselves.

`find_leader` is the one function a client calls (at start and after every failover).

- `master=` given (`"host1:50051,host2:50051"`, or one DNS name whose addresses are the
  masters): the client asks each in turn who leads (Coordination.WhoLeads, which a
  standby answers too) and never talks to etcd, so a client needs no etcd credentials
  at all (docs/operations.md, "etcd's users and roles"). The first master that names a
  leader wins; one that predates WhoLeads is used as the fixed gRPC address it was.
- otherwise etcd's leader key is read (the dev cluster's way; under etcd's auth a
  client reads it as the reader role, which may read that key and nothing else).

A cluster of several master shards (docs/scaling.md) has one leader per shard: the
client asks for shard k's (etcd's `shards/<k>/leader`, or WhoLeads(shard=k), which a
master of another shard refuses with WRONG_SHARD: it is skipped), and learns the count
once (`find_shards`: etcd's `shards/count`, absent for a cluster of one shard, or the
masters' WhoLeads replies). A tenant's client of such a cluster also learns its tenant's
key prefix (`find_key_prefix`): a key's shard is that of the key the masters store.

Either way a record is only an address: the master proves itself when the client
connects, by its TLS certificate wherever the client holds the cluster's CA (a record
or a master that says "plaintext" does not talk such a client out of TLS).
"""

from __future__ import annotations

import logging

import grpc

from kvstore.coord.etcd import read_key_sync
from kvstore.coord.layout import Layout, MasterRecord
from kvstore.errors import (
    Code,
    InvalidArgument,
    KVStoreError,
    NotLeader,
    PermissionDenied,
    Unavailable,
    error_for,
)
from kvstore.security.access import Role, key_prefix
from kvstore.security.credentials import Credentials
from kvstore.v1 import master_pb2 as pb
from kvstore.v1 import master_pb2_grpc as pbg

ASK_TIMEOUT = 3.0  # s at most per master asked

log = logging.getLogger(__name__)


def master_addresses(master: str) -> list[str]:
    """The entries of a `master=` value, in order, without blanks or repeats."""
    out: list[str] = []
    for part in master.split(","):
        part = part.strip()
        if part and part not in out:
            out.append(part)
    return out


def _who_leads(address: str, creds: Credentials, timeout: float,
               shard: int) -> pb.WhoLeadsResponse | str:
    """The master at `address`'s WhoLeads reply for `shard`, or why none (a phrase);
    UNIMPLEMENTED (a master older than WhoLeads) comes back as that word."""
    with creds.grpc_channel(address, False, []) as channel:
        try:
            return pbg.CoordinationStub(channel).WhoLeads(
                pb.WhoLeadsRequest(shard=shard), timeout=timeout, metadata=creds.metadata())
        except grpc.RpcError as exc:
            return exc.code().name


def _ask(address: str, creds: Credentials, timeout: float,
         shard: int = 0) -> MasterRecord | str:
    """Shard `shard`'s leader's record as the master at `address` knows it, or why not
    (a phrase)."""
    reply = _who_leads(address, creds, timeout, shard)
    if reply == "UNIMPLEMENTED":
        # A master older than WhoLeads: talk to it as the fixed address it was.
        return MasterRecord(master_id="", address=address, pid=0)
    if isinstance(reply, str):
        return reply
    if reply.error.code == Code.WRONG_SHARD:
        return f"serves another shard than {shard}"
    if reply.error.code:
        raise error_for(reply.error.code, reply.error.message)
    if not reply.address:
        return "no leader elected yet"
    return MasterRecord(master_id=reply.master_id, address=reply.address, pid=0,
                        fast=reply.fast, tls=reply.tls)


def find_leader(etcd: str, layout: Layout, master: str | None, timeout: float,
                creds: Credentials | None = None, shard: int = 0) -> MasterRecord:
    """The leader's record of shard `shard` (`layout` is that shard's): asked of the
    masters in `master` if given, else read from etcd. Unavailable (with each master's
    answer) when none names a leader; a master's refusal of the caller's token is raised
    as the typed error it is."""
    creds = creds or Credentials()
    which = f" of shard {shard}" if layout.shards > 1 else ""
    if master:
        addresses = master_addresses(master)
        answers = []
        for address in addresses:
            got = _ask(address, creds, min(timeout, ASK_TIMEOUT), shard)
            if isinstance(got, MasterRecord):
                return got
            answers.append(f"{address}: {got}")
        raise Unavailable(f"no master named a leader{which} "
                          f"({'; '.join(answers) or 'none given'}); "
                          "is one running, and are these the cluster's master addresses?")
    raw = read_key_sync(etcd, layout.leader, timeout=min(timeout, 3.0))
    if raw is None:
        start = f" --shard {shard}/{layout.shards}" if layout.shards > 1 else ""
        raise Unavailable(
            f"no kvstore master{which} is registered in etcd at {etcd}; start one with "
            f"`kvstore master --etcd {etcd}{start}` (or `kvstore up` for a dev cluster)"
        )
    return MasterRecord.decode(raw)


def find_shards(etcd: str, layout: Layout, master: str | None, timeout: float,
                creds: Credentials | None = None) -> int:
    """The cluster's shard count: etcd's `shards/count` (absent: 1, a cluster from before
    shards), or with `master` the first WhoLeads reply's (0 there, or a master older
    than WhoLeads: 1). When no master answers, 1: `find_leader` then says why."""
    creds = creds or Credentials()
    if master:
        for address in master_addresses(master):
            reply = _who_leads(address, creds, min(timeout, ASK_TIMEOUT), 0)
            if reply == "UNIMPLEMENTED":
                return 1
            if isinstance(reply, str):
                continue
            if reply.shards:
                return int(reply.shards)
            if not reply.error.code:
                return 1  # a master of a cluster of one shard (or from before shards)
        return 1
    try:
        raw = read_key_sync(etcd, layout.shard_count, timeout=min(timeout, 3.0))
    except PermissionDenied:
        # An etcd reader role from before shards may read the leader key only: such a
        # cluster has one shard (a sharded one grants its clients the count too).
        log.debug("etcd refused to let this client read %r; taking one shard",
                  layout.shard_count)
        return 1
    if raw is None:
        return 1
    try:
        return max(int(raw), 1)
    except ValueError:
        raise InvalidArgument(f"etcd's {layout.shard_count.decode()} holds {raw!r}, not a "
                              "shard count; it is written once by the cluster's first "
                              "master") from None


def find_key_prefix(etcd: str, layout: Layout, master: str | None, timeout: float,
                    creds: Credentials, shards: int) -> bytes:
    """What the masters put before this client's keys: its token's tenant and the
    separator (b"team-a/"), or b"" (no token, an admin's or a node's, an open cluster).

    A sharded cluster places a key on the shard of the key it *stores*: a node lists
    its SSD objects to a shard by that key, and a new leader adopts them by it. So a
    tenant's client routes `tenant/key`, and learns its tenant once, with one
    Authenticate (the call any role may make) at the first shard's leader that answers:
    one shard down does not keep the client from the others."""
    if not creds.token:
        return b""
    why: KVStoreError | None = None
    for shard in range(shards):
        try:
            record = find_leader(etcd, layout.for_shard(shard, shards), master, timeout,
                                 creds, shard)
            return _tenant_prefix(record, creds, timeout)
        except (Unavailable, NotLeader) as exc:
            why = why or exc
    raise why or Unavailable(f"a cluster of {shards} shards has no shard to ask for this "
                             "client's tenant")


def _tenant_prefix(record: MasterRecord, creds: Credentials, timeout: float) -> bytes:
    with creds.grpc_channel(record.address, record.tls, []) as channel:
        try:
            reply = pbg.MasterStub(channel).Authenticate(
                pb.AuthenticateRequest(token=creds.token), timeout=min(timeout, ASK_TIMEOUT),
                metadata=creds.metadata())
        except grpc.RpcError as exc:
            raise Unavailable(
                f"the master at {record.address} did not say which tenant this client's "
                f"token belongs to ({exc.code().name}), which a client of several master "
                "shards needs to route its keys; retry once it answers") from None
    if reply.error.code:
        raise error_for(reply.error.code, reply.error.message)
    return key_prefix(reply.tenant) if reply.role == Role.CLIENT.value else b""
