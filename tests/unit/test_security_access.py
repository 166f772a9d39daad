"""The access file, tokens and roles; the credentials a client resolves."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvstore.errors import InvalidArgument, PermissionDenied, Unauthenticated
from kvstore.security.access import OPEN, AccessList, Authenticator, Role, new_token, token_hash
from kvstore.security.credentials import Credentials
from kvstore.security.daemons import DaemonSecurity, is_loopback


def access(**tenants: int) -> tuple[AccessList, dict[str, str]]:
    tokens = {"c": new_token(), "n": new_token(), "a": new_token()}
    raw = {
        "tenants": {name: {"quota_bytes": q} for name, q in tenants.items()},
        "tokens": [
            {"name": "c", "role": "client", "tenant": "t1", "sha256": token_hash(tokens["c"])},
            {"name": "n", "role": "node", "sha256": token_hash(tokens["n"])},
            {"name": "a", "role": "admin", "sha256": token_hash(tokens["a"]).upper()},
        ],
    }
    return AccessList.parse(raw), tokens


def test_tokens_map_to_roles_and_tenants() -> None:
    acl, tokens = access(t1=100, t2=0)
    c = acl.authenticate(tokens["c"])
    assert (c.role, c.tenant, c.prefix) == (Role.CLIENT, "t1", b"t1/")
    assert acl.authenticate(tokens["n"]).role is Role.NODE
    assert acl.authenticate(tokens["a"]).role is Role.ADMIN  # hashes are case-insensitive
    assert acl.quotas() == {b"t1/": 100}
    with pytest.raises(Unauthenticated, match="requires a token"):
        acl.authenticate("")
    with pytest.raises(Unauthenticated, match="not valid"):
        acl.authenticate(tokens["c"] + "x")


def test_roles_limit_the_rpcs() -> None:
    acl, tokens = access(t1=0)
    client, node, admin = (acl.authenticate(tokens[k]) for k in "cna")
    client.check("GetReplicas")
    node.check("MountSegment")
    for method in ("ClusterStatus", "Evict", "ListKeys", "Drain", "MountSegment"):
        with pytest.raises(PermissionDenied, match=f"may not call {method}"):
            client.check(method)
    with pytest.raises(PermissionDenied):
        node.check("PutStart")
    for method in ("ClusterStatus", "PutStart", "Drain"):
        admin.check(method)
        OPEN.check(method)


@pytest.mark.parametrize("raw, message", [
    ([], "top level"),
    ({"tenants": {"a/b": {}}}, "tenant name"),
    ({"tenants": {"t": {"quota_bytes": -1}}}, "quota_bytes"),
    ({"tokens": [{"name": "x", "role": "root", "sha256": "0" * 64}]}, "role must be"),
    ({"tokens": [{"name": "x", "role": "client", "sha256": "abc"}]}, "sha256 must be"),
    ({"tokens": [{"name": "x", "role": "client", "tenant": "nope", "sha256": "0" * 64}]},
     "needs a tenant"),
    ({"tenants": {"t": {}}, "tokens": [{"name": "x", "role": "admin", "tenant": "t",
                                        "sha256": "0" * 64}]}, "only client tokens"),
])
def test_bad_access_files_are_refused_with_a_reason(raw: object, message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        AccessList.parse(raw)


def test_access_file_on_disk(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgument, match="cannot read"):
        AccessList.load(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(InvalidArgument, match="not valid JSON"):
        AccessList.load(tmp_path / "bad.json")


def test_authenticator_reads_bearer_metadata_and_caches() -> None:
    acl, tokens = access(t1=0)
    auth = Authenticator(acl)
    p = auth.from_metadata([("x", "y"), ("authorization", f"Bearer {tokens['c']}")])
    assert p.tenant == "t1"
    with pytest.raises(Unauthenticated):
        auth.from_metadata([])
    assert Authenticator(None).from_metadata([]) is OPEN
    acl.principals.clear()  # revoked in the file...
    assert auth.principal(tokens["c"]).tenant == "t1"  # ...cached until forget()
    auth.forget()
    with pytest.raises(Unauthenticated):
        auth.principal(tokens["c"])


def test_credentials_resolve_args_env_then_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    f = tmp_path / "creds.json"
    f.write_text(json.dumps({"127.0.0.1:2379/default": {"token": "from-file", "admin_token": "adm",
                                                        "tls_ca": "/ca.pem"}}))
    monkeypatch.setenv("KVSTORE_CREDENTIALS", str(f))
    for name in ("KVSTORE_TOKEN", "KVSTORE_TLS_CA", "KVSTORE_ADMIN_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    here = "127.0.0.1:2379/default"
    assert Credentials.resolve(cluster=here) == Credentials(token="from-file", tls_ca="/ca.pem")
    assert Credentials.resolve(cluster=here, role="admin").token == "adm"
    # another cluster never gets this one's credentials
    assert Credentials.resolve(cluster="127.0.0.1:9999/default") == Credentials()
    monkeypatch.setenv("KVSTORE_TOKEN", "from-env")
    assert Credentials.resolve(cluster=here).token == "from-env"
    assert Credentials.resolve(cluster=here, token="given").token == "given"
    assert Credentials(token="t").metadata() == (("authorization", "Bearer t"),)
    f.write_text("{nope")
    with pytest.raises(InvalidArgument, match="not valid JSON"):
        Credentials.resolve(cluster=here)


def test_daemons_refuse_open_non_loopback_listens(tmp_path: Path) -> None:
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("10.0.0.1") and not is_loopback("")
    DaemonSecurity().check_exposure("127.0.0.1:5")
    with pytest.raises(InvalidArgument, match=r"without TLS .* and tokens"):
        DaemonSecurity().check_exposure("127.0.0.1:5", "0.0.0.0:7")
    DaemonSecurity(insecure=True).check_exposure("0.0.0.0:7")
    with pytest.raises(InvalidArgument, match="go together"):
        DaemonSecurity.from_flags(tls_cert="x")
    with pytest.raises(InvalidArgument, match="cannot read --token-file"):
        DaemonSecurity.from_flags(token_file=str(tmp_path / "none"))


def test_token_new_prints_a_token_its_entry_admits(capsys: pytest.CaptureFixture[str]) -> None:
    from kvstore.cli import main

    assert main(["token", "new", "--name", "vllm-a", "--role", "client", "--tenant", "team-a"]) == 0
    out = capsys.readouterr().out.splitlines()
    token = out[0].rsplit(" ", 1)[1]
    entry = json.loads(out[-1])
    acl = AccessList.parse({"tenants": {"team-a": {}}, "tokens": [entry]})
    assert acl.authenticate(token).tenant == "team-a"
    assert token not in json.dumps(entry)
    assert main(["token", "new", "--name", "n", "--role", "node", "--tenant", "x"]) == 2


def test_dev_certificates_pass_strict_verification(tmp_path: Path) -> None:
    """Python >= 3.13 verifies with VERIFY_X509_STRICT by default: the dev CA's chain must
    carry key identifiers, or `kvstore up` would refuse its own clients there."""
    import socket
    import ssl
    import threading

    from kvstore.security.devca import make_ca_and_cert
    from kvstore.security.tls import ClientTls, ServerTls

    ca, cert, key = make_ca_and_cert(tmp_path, ["127.0.0.1", "localhost"])
    server_ctx = ServerTls(str(cert), str(key)).ssl_context()
    client_ctx = ClientTls(str(ca)).ssl_context()
    client_ctx.verify_flags |= ssl.VERIFY_X509_STRICT
    a, b = socket.socketpair()
    errors: list[BaseException] = []

    def serve() -> None:
        try:
            with server_ctx.wrap_socket(a, server_side=True) as s:
                s.sendall(s.recv(5))
        except BaseException as exc:  # reported below
            errors.append(exc)

    t = threading.Thread(target=serve)
    t.start()
    with client_ctx.wrap_socket(b, server_hostname="localhost") as c:
        c.sendall(b"hello")
        assert c.recv(5) == b"hello"
    t.join(5)
    assert not errors


def test_authenticator_reload_swaps_the_file_or_keeps_the_old_one(tmp_path: Path) -> None:
    tok = new_token()
    path = tmp_path / "access.json"

    def write(tokens: list[dict[str, str]]) -> None:
        path.write_text(json.dumps({"tenants": {"t": {}}, "tokens": tokens}))

    write([{"name": "c", "role": "client", "tenant": "t", "sha256": token_hash(tok)}])
    auth = Authenticator(AccessList.load(path))
    assert auth.principal(tok).tenant == "t"
    write([])  # revoked
    assert auth.reload().principals == {}
    with pytest.raises(Unauthenticated):
        auth.principal(tok)  # the cache was dropped too
    path.write_text("{")
    with pytest.raises(InvalidArgument, match="not valid JSON"):
        auth.reload()
    assert auth.access is not None and auth.access.principals == {}  # the old one stays
    with pytest.raises(InvalidArgument, match="no --auth-file"):
        Authenticator(None).reload()
