"""A client whose TLS setting is not the master's fails at once, with TlsMismatch.

Every combination the client can meet: its TLS against a plaintext master and its
plaintext against a TLS one, over the fast channel and gRPC, blocking and asyncio. The
servers are in-process, on loopback; the calls get a long timeout, so a retry loop would
show as a hang (caught by the test's timeout), not as a pass.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import pytest

from kvstore.errors import TlsMismatch
from kvstore.rpc.server import FastServer
from kvstore.security.credentials import Credentials
from kvstore.security.devca import make_ca_and_cert
from kvstore.security.tls import ServerTls, looks_like_tls, speaks_tls
from kvstore.v1 import master_pb2 as pb
from kvstore_client.control import (
    AsyncFastControl,
    AsyncGrpcControl,
    FastControl,
    GrpcControl,
)

LONG = 60.0
FILE = "/home/u/.config/kvstore/credentials.json"
ENTRY = "127.0.0.1:2379/default"


class Servers:
    def __init__(self, tmp: Path) -> None:
        ca, cert, key = make_ca_and_cert(tmp / "certs", ["127.0.0.1"])
        self.ca = str(ca)
        self.tls = ServerTls(str(cert), str(key))
        self.addresses: dict[str, str] = {}
        self._ready = threading.Event()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(30)

    async def _start(self) -> None:
        def handle(method: str, request: Any, caller: Any) -> Any:
            return pb.ClusterStatusResponse()

        plain = FastServer(handle)
        secure = FastServer(handle, tls=self.tls.ssl_context())
        self.addresses["fast plaintext"] = await plain.start("127.0.0.1:0")
        self.addresses["fast tls"] = await secure.start("127.0.0.1:0")
        self._servers: list[Any] = [plain, secure]  # a grpc.aio server dies with its object
        for name, server in (("grpc plaintext", grpc.aio.server()),
                             ("grpc tls", grpc.aio.server())):
            port = (server.add_secure_port("127.0.0.1:0", self.tls.grpc_credentials())
                    if name.endswith("tls") else server.add_insecure_port("127.0.0.1:0"))
            await server.start()
            self._servers.append(server)
            self.addresses[name] = f"127.0.0.1:{port}"

    def close(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Servers]:
    s = Servers(tmp_path_factory.mktemp("tls"))
    yield s
    s.close()


def creds(servers: Servers, tls: bool) -> Credentials:
    if tls:
        return Credentials(tls_ca=servers.ca, tls_ca_from="file", file=FILE, entry=ENTRY)
    return Credentials(file=FILE, entry=ENTRY)


def call(transport: str, asyncio_: bool, address: str, tls: bool, c: Credentials) -> Any:
    req = pb.ClusterStatusRequest()
    if not asyncio_:
        control: Any = (FastControl(address, tls, c, announced=False) if transport == "fast"
                        else GrpcControl(address, tls, c))
        try:
            return control.call("ClusterStatus", req, LONG)
        finally:
            control.close()

    async def run() -> Any:
        control: Any = (AsyncFastControl(address, tls, c, announced=False)
                        if transport == "fast" else AsyncGrpcControl(address, tls, c))
        try:
            return await control.call("ClusterStatus", req, LONG)
        finally:
            await control.close()
    return asyncio.run(run())


@pytest.mark.parametrize("asyncio_", [False, True], ids=["blocking", "asyncio"])
@pytest.mark.parametrize("transport", ["fast", "grpc"])
def test_tls_client_against_a_plaintext_master(servers: Servers, transport: str,
                                               asyncio_: bool) -> None:
    address = servers.addresses[f"{transport} plaintext"]
    with pytest.raises(TlsMismatch) as err:
        call(transport, asyncio_, address, True, creds(servers, True))
    assert f"the kvstore master at {address} answers in plaintext, but this client connects " \
           f"with TLS because the credentials file {FILE} gives it a CA (entry '{ENTRY}')" \
           in str(err.value)


@pytest.mark.parametrize("asyncio_", [False, True], ids=["blocking", "asyncio"])
@pytest.mark.parametrize("transport", ["fast", "grpc"])
def test_plaintext_client_against_a_tls_master(servers: Servers, transport: str,
                                               asyncio_: bool) -> None:
    address = servers.addresses[f"{transport} tls"]
    with pytest.raises(TlsMismatch) as err:
        call(transport, asyncio_, address, False, creds(servers, False))
    assert f"the kvstore master at {address} serves TLS, but this client connected in " \
           f"plaintext" in str(err.value)
    assert FILE in str(err.value)


@pytest.mark.parametrize("transport", ["fast", "grpc"])
def test_matching_settings_still_work(servers: Servers, transport: str) -> None:
    for tls, kind in ((True, "tls"), (False, "plaintext")):
        address = servers.addresses[f"{transport} {kind}"]
        if transport == "grpc":  # no Master service behind it: a reply at all will do
            with pytest.raises(Exception, match="UNIMPLEMENTED"):
                call(transport, False, address, tls, creds(servers, tls))
        else:
            assert isinstance(call(transport, False, address, tls, creds(servers, tls)),
                              pb.ClusterStatusResponse)


def test_the_tls_probe(servers: Servers) -> None:
    assert speaks_tls(servers.addresses["fast tls"], 2.0)
    assert speaks_tls(servers.addresses["grpc tls"], 2.0)
    assert not speaks_tls(servers.addresses["grpc plaintext"], 2.0)
    assert not looks_like_tls(b"\x00\x00\x12\x04")  # an HTTP/2 SETTINGS frame
    assert looks_like_tls(b"\x15\x03\x03\x00\x02")  # a TLS alert


def test_the_sentence_says_where_the_ca_came_from() -> None:
    by_arg = Credentials(tls_ca="/ca.pem", tls_ca_from="argument").mismatch("m:1", False)
    assert "because it was given tls_ca=" in by_arg.message
    by_env = Credentials(tls_ca="/ca.pem", tls_ca_from="environment").mismatch("m:1", False)
    assert "KVSTORE_TLS_CA is set" in by_env.message
    announced = Credentials().mismatch("m:1", False)
    assert "etcd record announces TLS" in announced.message


def test_resolve_records_where_the_ca_came_from(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "credentials.json"
    path.write_text(f'{{"{ENTRY}": {{"tls_ca": "/from-file.pem"}}}}')
    monkeypatch.setenv("KVSTORE_CREDENTIALS", str(path))
    monkeypatch.delenv("KVSTORE_TLS_CA", raising=False)
    got = Credentials.resolve(cluster=ENTRY)
    assert (got.tls_ca, got.tls_ca_from, got.file, got.entry) == \
        ("/from-file.pem", "file", str(path), ENTRY)
    monkeypatch.setenv("KVSTORE_TLS_CA", "/env.pem")
    assert Credentials.resolve(cluster=ENTRY).tls_ca_from == "environment"
    assert Credentials.resolve(cluster=ENTRY, tls_ca="/arg.pem").tls_ca_from == "argument"
