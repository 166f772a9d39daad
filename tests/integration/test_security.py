"""Security through real processes: TLS on every control endpoint, tokens with roles,
tenants that cannot see each other's keys, and per-tenant quotas."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import grpc
import pytest

from kvstore.errors import (
    Code,
    PermissionDenied,
    QuotaExceeded,
    Unauthenticated,
    Unavailable,
    error_for,
)
from kvstore.security.access import new_token, token_hash
from kvstore.security.devca import make_ca_and_cert
from kvstore.v1 import master_pb2 as pb
from kvstore.v1 import master_pb2_grpc as pbg
from kvstore.v1 import store_pb2 as spb
from kvstore.v1 import store_pb2_grpc as spbg
from kvstore_client import KVStoreClient
from tests.conftest import Cluster

QUOTA = 1 << 20  # tenant "small": 1 MiB
TRANSPORTS = ["fast", "grpc"]


class Secure:
    def __init__(self, c: Cluster, tmp: Path) -> None:
        self.c = c
        self.ca, self.cert, self.key = make_ca_and_cert(tmp / "tls", ["127.0.0.1", "localhost"])
        self.tokens = {name: new_token() for name in ("alice", "bob", "small", "admin", "node")}
        access = {
            "tenants": {"a": {}, "b": {}, "small": {"quota_bytes": QUOTA}},
            "tokens": [
                {"name": "alice", "role": "client", "tenant": "a",
                 "sha256": token_hash(self.tokens["alice"])},
                {"name": "bob", "role": "client", "tenant": "b",
                 "sha256": token_hash(self.tokens["bob"])},
                {"name": "small", "role": "client", "tenant": "small",
                 "sha256": token_hash(self.tokens["small"])},
                {"name": "ops", "role": "admin", "sha256": token_hash(self.tokens["admin"])},
                {"name": "nodes", "role": "node", "sha256": token_hash(self.tokens["node"])},
            ],
        }
        self.access = tmp / "access.json"
        self.access.write_text(json.dumps(access))
        node_token = tmp / "node.token"
        node_token.write_text(self.tokens["node"])
        self.flags = ["--tls-cert", str(self.cert), "--tls-key", str(self.key), "--tls-ca", str(self.ca),
                      "--auth-file", str(self.access), "--token-file", str(node_token)]
        self.master = c.start_master(*self.flags)
        c.start_store("64MiB", *self.flags)
        c.start_store("64MiB", *self.flags)

    def channel(self, address: str | None = None) -> grpc.Channel:
        return grpc.secure_channel(address or self.master,
                                   grpc.ssl_channel_credentials(self.ca.read_bytes()))

    def admin(self, method: str, request: object, token: str | None = None) -> object:
        with self.channel() as ch:
            md = [("authorization", f"Bearer {token or self.tokens['admin']}")]
            return getattr(pbg.MasterStub(ch), method)(request, timeout=5, metadata=md)

    def wait_nodes(self, n: int, timeout: float = 40.0) -> pb.ClusterStatusResponse:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                st = self.admin("ClusterStatus", pb.ClusterStatusRequest())
                if len(st.nodes) == n:  # type: ignore[attr-defined]
                    return st  # type: ignore[return-value]
            except grpc.RpcError:
                pass
            time.sleep(0.2)
        raise AssertionError("nodes did not mount:\n" + self.c.logs())

    def client(self, who: str | None, transport: str = "fast", **kw: object) -> KVStoreClient:
        args: dict[str, object] = {"tls_ca": str(self.ca), "timeout": 5, "transport": transport}
        if who is not None:
            args["token"] = self.tokens.get(who, who)
        args.update(kw)
        return KVStoreClient(etcd=self.c.etcd, **args)  # type: ignore[arg-type]


@pytest.fixture
def secure(cluster_factory: Cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Secure:
    monkeypatch.setenv("KVSTORE_CREDENTIALS", str(tmp_path / "no-credentials.json"))
    for name in ("KVSTORE_TOKEN", "KVSTORE_TLS_CA", "KVSTORE_TRANSPORT"):
        monkeypatch.delenv(name, raising=False)
    s = Secure(cluster_factory, tmp_path)
    s.wait_nodes(2)
    return s


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_tokens_are_required_and_checked(secure: Secure, transport: str) -> None:
    with secure.client("alice", transport) as ok:
        assert ok.put_many([b"k"], [b"v" * 1000]) == [None]
        assert ok.get(b"k") == b"v" * 1000
    with pytest.raises(Unauthenticated, match="requires a token"), \
            secure.client(None, transport) as anonymous:
        anonymous.exists([b"k"])
    with pytest.raises(Unauthenticated, match="not valid"), \
            secure.client(new_token(), transport) as stranger:
        stranger.exists([b"k"])
    # a client token may not make operator calls, nor a node's
    for who in ("alice", "node"):
        reply = secure.admin("ClusterStatus", pb.ClusterStatusRequest(), token=secure.tokens[who])
        err = error_for(reply.error.code, reply.error.message)  # type: ignore[attr-defined]
        assert isinstance(err, PermissionDenied), err
        assert "may not call ClusterStatus" in err.message


def test_plaintext_and_unknown_ca_are_refused(secure: Secure) -> None:
    with grpc.insecure_channel(secure.master) as ch, pytest.raises(grpc.RpcError):
        pbg.MasterStub(ch).ClusterStatus(pb.ClusterStatusRequest(), timeout=3)
    # no CA given: the system's roots do not know the cluster's CA
    with pytest.raises(Unavailable, match="certificate"), \
            secure.client("alice", "fast", tls_ca="") as c:
        c.exists([b"k"])
    # the certificate is for 127.0.0.1/localhost: another name fails the check
    with pytest.raises(Unavailable, match="certificate"), \
            secure.client("alice", "fast", tls_server_name="evil.example") as c:
        c.exists([b"k"])


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_tenants_cannot_see_each_other(secure: Secure, transport: str) -> None:
    with secure.client("alice", transport) as a, secure.client("bob", transport) as b:
        assert a.put_many([b"shared", b"only-a"], [b"A" * 4096, b"a" * 100]) == [None, None]
        # bob cannot learn of, read, pin or remove alice's keys
        assert b.exists([b"shared", b"only-a"]) == [False, False]
        assert b.get_many([b"shared", b"only-a"]) == [None, None]
        lease = b.lookup([b"shared"])
        assert lease.count == 0
        assert b.remove(b"only-a") is False
        # the same key name is a different object in each tenant
        assert b.put_many([b"shared"], [b"B" * 2048]) == [None]
        assert a.get(b"shared") == b"A" * 4096
        assert b.get(b"shared") == b"B" * 2048
        assert a.exists([b"only-a"]) == [True]
    # an admin sees both, under their tenant prefixes
    reply = secure.admin("ListKeys", pb.ListKeysRequest(prefix=b"", limit=100))
    keys = sorted(o.key for o in reply.objects)  # type: ignore[attr-defined]
    assert keys == [b"a/only-a", b"a/shared", b"b/shared"]


def test_leases_belong_to_their_tenant(secure: Secure) -> None:
    with secure.client("alice") as a:
        assert a.put_many([b"x"], [b"x" * 512]) == [None]
        lease = a.lookup([b"x"])
        assert lease.count == 1
    with secure.channel() as ch:
        stub = pbg.MasterStub(ch)

        def as_(who: str) -> list[tuple[str, str]]:
            return [("authorization", f"Bearer {secure.tokens[who]}")]

        # bob knows (or guesses) alice's lease id: it is unknown to him
        r = stub.RenewLease(pb.RenewLeaseRequest(lease_id=lease.id), timeout=5, metadata=as_("bob"))
        assert r.error.code == Code.LEASE_NOT_FOUND
        r = stub.ReleaseLease(pb.ReleaseLeaseRequest(lease_id=lease.id), timeout=5,
                              metadata=as_("bob"))
        assert r.error.code == Code.LEASE_NOT_FOUND
        g = stub.GetReplicas(pb.GetReplicasRequest(keys=[b"x"], lease_id=lease.id), timeout=5,
                             metadata=as_("bob"))
        assert g.error.code == Code.LEASE_NOT_FOUND
        # alice still holds it
        r = stub.ReleaseLease(pb.ReleaseLeaseRequest(lease_id=lease.id), timeout=5,
                              metadata=as_("alice"))
        assert r.error.code == 0


def test_quota_evicts_the_tenants_own_objects_first(secure: Secure) -> None:
    with secure.client("small") as s, secure.client("alice") as a:
        assert a.put_many([b"keep"], [b"k" * (256 << 10)]) == [None]
        chunk = 256 << 10
        for i in range(8):  # 2 MiB through a 1 MiB quota
            assert s.put_many([f"s{i}".encode()], [bytes([i]) * chunk]) == [None]
        present = s.exists([f"s{i}".encode() for i in range(8)])
        assert present == [False] * 4 + [True] * 4  # the oldest went, in order
        assert a.get(b"keep") == b"k" * (256 << 10)  # other tenants are untouched
        # pinned objects cannot be evicted: the quota refuses instead
        lease = s.lookup([f"s{i}".encode() for i in range(4, 8)])
        assert lease.count == 4
        errs = s.put_many([b"one-more"], [b"z" * chunk])
        assert isinstance(errs[0], QuotaExceeded), errs
        assert "quota" in str(errs[0])
        s.release(lease)
        assert s.put_many([b"one-more"], [b"z" * chunk]) == [None]
        errs = s.put_many([b"too-big"], [b"z" * (QUOTA + 1)])
        assert isinstance(errs[0], QuotaExceeded)


def test_store_nodes_take_only_node_and_admin_tokens(secure: Secure) -> None:
    nodes = secure.admin("NodeList", pb.NodeListRequest())
    assert len(nodes.nodes) == 2  # type: ignore[attr-defined]
    from kvstore.coord.etcd import read_items_sync
    from kvstore.coord.layout import Layout, NodeRecord

    records = [NodeRecord.decode(raw) for _k, raw in read_items_sync(secure.c.etcd, Layout().nodes)]
    assert records and all(r.tls for r in records)
    address = records[0].service
    with secure.channel(address) as ch:
        stub = spbg.StoreNodeStub(ch)
        for who, code in ((None, grpc.StatusCode.UNAUTHENTICATED),
                          ("alice", grpc.StatusCode.PERMISSION_DENIED)):
            md = [("authorization", f"Bearer {secure.tokens[who]}")] if who else []
            with pytest.raises(grpc.RpcError) as err:
                stub.Inventory(spb.InventoryRequest(), timeout=5, metadata=md)
            assert err.value.code() == code  # type: ignore[attr-defined]
        inv = stub.Inventory(spb.InventoryRequest(), timeout=5,
                             metadata=[("authorization", f"Bearer {secure.tokens['node']}")])
        assert inv is not None
    # the master's own calls (inventory deltas) get through with its node token: what a
    # client of tenant a wrote is in a node's inventory, under the tenant's prefix
    with secure.client("alice") as a:
        assert a.put_many([b"inv-%d" % i for i in range(8)], [b"i" * 100] * 8) == [None] * 8
    epoch = secure.admin("ClusterStatus", pb.ClusterStatusRequest()).epoch  # type: ignore[attr-defined]
    deadline = time.monotonic() + 10
    held: set[bytes] = set()
    while time.monotonic() < deadline and len(held) < 8:
        held = set()
        for r in records:
            with secure.channel(r.service) as ch:
                inv = spbg.StoreNodeStub(ch).Inventory(
                    spb.InventoryRequest(epoch=epoch), timeout=5,
                    metadata=[("authorization", f"Bearer {secure.tokens['node']}")])
            held |= {rep.key for rep in inv.replicas if rep.key.startswith(b"a/inv-")}
        time.sleep(0.2)
    assert held == {b"a/inv-%d" % i for i in range(8)}
    with grpc.insecure_channel(address) as ch, pytest.raises(grpc.RpcError):
        spbg.StoreNodeStub(ch).Inventory(spb.InventoryRequest(), timeout=3)


def test_sighup_reloads_the_access_file(secure: Secure) -> None:
    with secure.client("bob") as b:
        assert b.exists([b"x"]) == [False]
        # revoke bob: rewrite the file without his token, SIGHUP the master
        access = json.loads(secure.access.read_text())
        access["tokens"] = [t for t in access["tokens"] if t["name"] != "bob"]
        secure.access.write_text(json.dumps(access))
        secure.c.masters[0][0].popen.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 10
        while True:
            try:
                b.exists([b"x"])
            except Unauthenticated:
                break
            assert time.monotonic() < deadline, "bob's token still works after the reload"
            time.sleep(0.1)
    with secure.client("alice") as a:
        assert a.exists([b"x"]) == [False]
    # a store node reloads on SIGHUP too (and keeps running)
    store = secure.c.stores[0]
    store.popen.send_signal(signal.SIGHUP)
    deadline = time.monotonic() + 10
    while "reloaded" not in store.log.read_text():
        assert time.monotonic() < deadline, "the store node did not reload its access file"
        time.sleep(0.1)
    assert store.alive()


def test_daemons_refuse_to_listen_in_the_open(cluster_factory: Cluster) -> None:
    import subprocess
    import sys

    run = subprocess.run(
        [sys.executable, "-m", "kvstore", "master", "--etcd", cluster_factory.etcd,
         "--listen", "0.0.0.0:0"], capture_output=True, text=True, timeout=60)
    assert run.returncode == 2
    assert "refusing to listen on 0.0.0.0:0 without TLS" in run.stderr


def test_etcd_over_tls_with_client_certificates(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from kvstore.coord.etcd import read_key_sync
    from kvstore.coord.layout import Layout
    from kvstore.devcluster import etcd_command, free_port, wait_for_port
    from tests.conftest import require_private_netns

    require_private_netns()
    ca, cert, key = make_ca_and_cert(tmp_path / "etcd-tls", ["127.0.0.1", "localhost"])
    c = Cluster(tmp_path)
    c.etcd_port = free_port()
    cmd = etcd_command(tmp_path / "etcd", c.etcd_port, free_port())
    cmd = [a.replace(f"http://127.0.0.1:{c.etcd_port}", f"https://127.0.0.1:{c.etcd_port}") for a in cmd]
    cmd += ["--cert-file", str(cert), "--key-file", str(key), "--client-cert-auth",
            "--trusted-ca-file", str(ca)]
    proc = c.spawn("etcd", cmd)
    try:
        wait_for_port(c.etcd_port, proc.popen, "etcd")
        # without the environment nothing gets through to etcd
        monkeypatch.delenv("KVSTORE_ETCD_CA", raising=False)
        with pytest.raises(Unavailable, match="cannot reach etcd"):
            read_key_sync(c.etcd, Layout().leader, timeout=2)
        # every process of the deployment reads the same three variables
        monkeypatch.setenv("KVSTORE_ETCD_CA", str(ca))
        monkeypatch.setenv("KVSTORE_ETCD_CERT", str(cert))
        monkeypatch.setenv("KVSTORE_ETCD_KEY", str(key))
        c.start_master()
        c.start_store("64MiB")
        c.wait_nodes(1)
        with KVStoreClient(etcd=c.etcd, timeout=10) as client:
            assert client.put_many([b"over-tls"], [b"t" * 5000]) == [None]
            assert client.get(b"over-tls") == b"t" * 5000
    finally:
        c.stop()


def test_certificates_with_one_dns_name_and_tls_server_name(cluster_factory: Cluster,
                                                            tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """Certificates naming one DNS name only (no IP SANs): daemons check each other with
    --tls-server-name, clients with tls_server_name; without it a client is refused."""
    monkeypatch.setenv("KVSTORE_CREDENTIALS", str(tmp_path / "none.json"))
    c = cluster_factory
    ca, cert, key = make_ca_and_cert(tmp_path / "dns", ["kvstore.test"])
    tok = new_token()
    access = tmp_path / "access.json"
    access.write_text(json.dumps({
        "tenants": {"t": {}},
        "tokens": [{"name": "c", "role": "client", "tenant": "t", "sha256": token_hash(tok)},
                   {"name": "n", "role": "node", "sha256": token_hash("node-secret")}]}))
    (tmp_path / "node.token").write_text("node-secret")
    flags = ["--tls-cert", str(cert), "--tls-key", str(key), "--tls-ca", str(ca),
             "--tls-server-name", "kvstore.test", "--auth-file", str(access),
             "--token-file", str(tmp_path / "node.token")]
    c.start_master(*flags)
    c.start_store("64MiB", *flags)
    deadline = time.monotonic() + 40
    while True:  # the node mounts only if master and node accept each other's names
        try:
            with KVStoreClient(etcd=c.etcd, token=tok, tls_ca=str(ca), timeout=5,
                               tls_server_name="kvstore.test") as client:
                if client.put_many([b"dns"], [b"d" * 3000]) == [None]:
                    assert client.get(b"dns") == b"d" * 3000
                    break
        except Unavailable:
            pass
        assert time.monotonic() < deadline, "no put through DNS-named certificates:\n" + c.logs()
        time.sleep(0.3)
    # the node reached the master over TLS (MountSegment), and the master the node
    # (inventory deltas), each checking the other's certificate for kvstore.test
    node = c.stores[0]
    while "mounted at master" not in node.log.read_text():
        assert time.monotonic() < deadline, c.logs()
        time.sleep(0.2)
    time.sleep(0.5)  # a few ticks of deltas
    assert "inventory delta to node" not in c.masters[0][0].log.read_text(), c.logs()
    with pytest.raises(Unavailable, match="certificate"), \
            KVStoreClient(etcd=c.etcd, token=tok, tls_ca=str(ca), timeout=5) as client:
        client.exists([b"dns"])
