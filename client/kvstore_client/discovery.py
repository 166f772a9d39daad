"""Finding the leader: from etcd's leader key, or by asking the masters themselves.

`find_leader` is the one function a client calls (at start and after every failover).

- `master=` given (`"host1:50051,host2:50051"`, or one DNS name whose addresses are the
  masters): the client asks each in turn who leads (Coordination.WhoLeads, which a
  standby answers too) and never talks to etcd, so a client needs no etcd credentials
  at all (docs/operations.md, "etcd's users and roles"). The first master that names a
  leader wins; one that predates WhoLeads is used as the fixed gRPC address it was.
- otherwise etcd's leader key is read (the dev cluster's way; under etcd's auth a
  client reads it as the reader role, which may read that key and nothing else).

Either way a record is only an address: the master proves itself when the client
connects, by its TLS certificate wherever the client holds the cluster's CA (a record
or a master that says "plaintext" does not talk such a client out of TLS).
"""

from __future__ import annotations

import grpc

from kvstore.coord.etcd import read_key_sync
from kvstore.coord.layout import Layout, MasterRecord
from kvstore.errors import Unavailable, error_for
from kvstore.security.credentials import Credentials
from kvstore.v1 import master_pb2 as pb
from kvstore.v1 import master_pb2_grpc as pbg

ASK_TIMEOUT = 3.0  # s at most per master asked


def master_addresses(master: str) -> list[str]:
    """The entries of a `master=` value, in order, without blanks or repeats."""
    out: list[str] = []
    for part in master.split(","):
        part = part.strip()
        if part and part not in out:
            out.append(part)
    return out


def _ask(address: str, creds: Credentials, timeout: float) -> MasterRecord | str:
    """The leader's record as the master at `address` knows it, or why not (a phrase)."""
    with creds.grpc_channel(address, False, []) as channel:
        try:
            reply = pbg.CoordinationStub(channel).WhoLeads(
                pb.WhoLeadsRequest(), timeout=timeout, metadata=creds.metadata())
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
                # A master older than WhoLeads: talk to it as the fixed address it was.
                return MasterRecord(master_id="", address=address, pid=0)
            return exc.code().name
    if reply.error.code:
        raise error_for(reply.error.code, reply.error.message)
    if not reply.address:
        return "no leader elected yet"
    return MasterRecord(master_id=reply.master_id, address=reply.address, pid=0,
                        fast=reply.fast, tls=reply.tls)


def find_leader(etcd: str, layout: Layout, master: str | None, timeout: float,
                creds: Credentials | None = None) -> MasterRecord:
    """The leader's record: asked of the masters in `master` if given, else read from
    etcd. Unavailable (with each master's answer) when none names a leader; a master's
    refusal of the caller's token is raised as the typed error it is."""
    creds = creds or Credentials()
    if master:
        addresses = master_addresses(master)
        answers = []
        for address in addresses:
            got = _ask(address, creds, min(timeout, ASK_TIMEOUT))
            if isinstance(got, MasterRecord):
                return got
            answers.append(f"{address}: {got}")
        raise Unavailable(f"no master named a leader ({'; '.join(answers) or 'none given'}); "
                          "is one running, and are these the cluster's master addresses?")
    raw = read_key_sync(etcd, layout.leader, timeout=min(timeout, 3.0))
    if raw is None and layout.shards <= 1:
        count = read_key_sync(etcd, layout.shard_count, timeout=min(timeout, 3.0))
        if count is not None and count.strip() not in (b"", b"1"):
            raise Unavailable(
                f"the cluster at {etcd} runs {count.decode(errors='replace')} master shards, "
                "and this client does not route keys to shards yet (docs/scaling.md); "
                "run the cluster with one shard (the default) for this client")
    if raw is None:
        raise Unavailable(
            f"no kvstore master is registered in etcd at {etcd}; start one with "
            f"`kvstore master --etcd {etcd}` (or `kvstore up` for a dev cluster)"
        )
    return MasterRecord.decode(raw)
