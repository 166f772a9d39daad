"""A store node record is trusted only once the node it names proves itself.

etcd's record of a node says where clients will write bytes (its segment) and where the
leader reaches it (its service). Before mounting one, the leader calls that service and
asks who answers (Inventory, identity only): the answer must name the record's node,
segment, base address and size. The call carries the leader's node token, and goes
over TLS whenever the leader has TLS material (DaemonSecurity.channel: a record that
says "plaintext" cannot talk it out of TLS), so there the node's certificate is the
proof; on a plaintext dev cluster the proof is that the node really runs at that
address. A record that fails is logged with the reason and not mounted; the membership
watch tries it again when it changes.
"""

from __future__ import annotations

import contextlib

import grpc

from kvstore.coord.layout import NodeRecord
from kvstore.security.daemons import DaemonSecurity
from kvstore.v1 import store_pb2 as spb
from kvstore.v1 import store_pb2_grpc as spbg

PROOF_TIMEOUT = 3.0  # s for the node to answer


async def disproof(security: DaemonSecurity, record: NodeRecord, epoch: int,
                   timeout: float = PROOF_TIMEOUT, shard: int = 0, shards: int = 1) -> str:
    """"" if the node the record names proves itself; else why not, as a phrase.
    `epoch` is that of master shard `shard` of `shards` (a node fences each shard)."""
    if not record.service:
        return ("it names no service address, so the node cannot prove itself (a store "
                "node of this version always announces one)")
    channel = security.channel(record.service, record.tls)
    try:
        reply = await spbg.StoreNodeStub(channel).Inventory(
            spb.InventoryRequest(epoch=epoch, identity_only=True, shard=shard,
                                 shards=shards), timeout=timeout)
    except grpc.aio.AioRpcError as exc:
        return (f"nothing at {record.service} answered as a store node "
                f"({exc.code().name}: {exc.details()})")
    finally:
        with contextlib.suppress(Exception):
            await channel.close()
    if reply.error.code:
        return f"the node at {record.service} refused: {reply.error.message}"
    said = (reply.node_id, reply.segment, reply.base_addr, reply.size)
    want = (record.node_id, record.segment, record.base_addr, record.size)
    if said != want:
        return (f"the node at {record.service} is {reply.node_id!r} with segment "
                f"{reply.segment!r} ({reply.size} bytes at {reply.base_addr:#x}), not the "
                f"record's {record.node_id!r} with {record.segment!r} ({record.size} bytes "
                f"at {record.base_addr:#x})")
    return ""
