"""The Master RPCs as the fast channel numbers them, derived from master.proto.

A method's id is the low 16 bits of the CRC-32 of its full name
(`kvstore.v1.Master.Lookup`), not its position in the service: inserting or reordering
RPCs in master.proto then never makes an older client's id name a different method (a
Lookup arriving as a Remove). A new RPC needs no edit here; if two names ever collide,
importing this module fails and says which.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

from google.protobuf.descriptor import ServiceDescriptor
from google.protobuf.message import Message
from google.protobuf.message_factory import GetMessageClass

from kvstore.v1 import master_pb2


@dataclass(frozen=True, slots=True)
class Method:
    name: str                 # the RPC's name in the service, e.g. "Lookup"
    id: int                   # its u16 id on the wire
    request: type[Message]
    response: type[Message]


def method_id(full_name: str) -> int:
    return zlib.crc32(full_name.encode()) & 0xFFFF


def method_table(service: ServiceDescriptor) -> dict[str, Method]:
    table: dict[str, Method] = {}
    by_id: dict[int, str] = {}
    for m in service.methods:
        mid = method_id(m.full_name)
        if mid in by_id:
            raise RuntimeError(f"fast-channel method ids collide: {m.full_name} and {by_id[mid]} "
                               f"both hash to {mid}; rename one of them")
        by_id[mid] = m.full_name
        table[m.name] = Method(m.name, mid, GetMessageClass(m.input_type),
                               GetMessageClass(m.output_type))
    return table


METHODS: dict[str, Method] = method_table(master_pb2.DESCRIPTOR.services_by_name["Master"])
BY_ID: dict[int, Method] = {m.id: m for m in METHODS.values()}
