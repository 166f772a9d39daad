"""A stranger's malformed requests cannot flood a daemon's log: grpc logs an ERROR with a
traceback for each request that does not deserialize; the daemons keep at most a burst
of grpc's records per minute (kvstore.logs.RateLimit)."""

from __future__ import annotations

import contextlib

import grpc

from kvstore.v1 import master_pb2 as pb
from kvstore.v1 import master_pb2_grpc as pbg
from tests.conftest import Cluster
from tests.unit.polling import wait_until


def test_malformed_requests_do_not_flood_the_log(cluster_factory: Cluster) -> None:
    address = cluster_factory.start_master()
    with grpc.insecure_channel(address) as ch:
        raw = ch.unary_unary("/kvstore.v1.Master/Exists")  # bytes in, bytes out
        for _ in range(100):
            with contextlib.suppress(grpc.RpcError):
                raw(b"\xff\xff\xff\xff", timeout=2)
        # still serving
        reply = pbg.MasterStub(ch).GetConfig(pb.GetConfigRequest(), timeout=5)
        assert not reply.error.code
    # The calls went one at a time and grpc logs each refusal as it makes it; the poll
    # is only for the log file to show the first of them.
    log = cluster_factory.masters[0][0].log
    wait_until(lambda: " ERROR grpc" in log.read_text(), what="grpc's ERROR in the log")
    grpc_errors = log.read_text().count(" ERROR grpc")
    assert 1 <= grpc_errors <= 20, grpc_errors
