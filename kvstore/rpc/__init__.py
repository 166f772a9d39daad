"""The fast control channel: the Master service's protobuf messages over plain TCP frames.

gRPC stays the public, documented contract of the master (admin tools, other languages).
This package carries the very same request and reply messages, handled by the very same
`MasterService.handle`, over length-prefixed frames on a raw socket: a loopback round
trip costs tens of microseconds instead of grpc's ~0.45 ms. The clients use it when the
leader's etcd record announces a `fast` address, and gRPC otherwise.

- `methods.py`    the method table, derived from master.proto's service descriptor
- `framing.py`    the frame format and an incremental decoder (no I/O)
- `server.py`     the asyncio server that runs inside the master process
- `client.py`     a blocking channel (one call in flight, no threads)
- `aio_client.py` an asyncio channel (many calls multiplexed on one connection)
"""

from kvstore.rpc.aio_client import AsyncFastChannel
from kvstore.rpc.client import FastChannel
from kvstore.rpc.framing import MAX_FRAME, FrameDecoder, FrameError
from kvstore.rpc.methods import BY_ID, METHODS, Method
from kvstore.rpc.server import FastServer

__all__ = [
    "BY_ID",
    "MAX_FRAME",
    "METHODS",
    "AsyncFastChannel",
    "FastChannel",
    "FastServer",
    "FrameDecoder",
    "FrameError",
    "Method",
]
