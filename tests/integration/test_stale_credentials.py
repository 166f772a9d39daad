"""Credentials that match the cluster: a secure `kvstore up`, stopped, then `kvstore up
--insecure` on the same endpoint. The insecure run removes the secure run's entry from
the credentials file, so a client with default arguments works at once; a client that is
still told to use TLS fails at once, with a sentence naming the master's endpoint and
where its CA came from, instead of retrying until its timeout.

HOME points at a temporary directory: the user's own ~/.config/kvstore stays untouched.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from kvstore.devcluster import DevCluster, UpOptions, free_port
from kvstore.errors import KVStoreError, TlsMismatch
from kvstore.security.credentials import credentials_path
from kvstore.security.devca import write_credentials
from kvstore.v1 import master_pb2 as pb
from kvstore.v1 import master_pb2_grpc as pbg
from kvstore_client import KVStoreClient
from tests.conftest import require_private_netns

LONG = 60.0  # the clients' timeout: a mismatch must fail, not use it up retrying


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    require_private_netns()
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    for name in ("KVSTORE_CREDENTIALS", "XDG_CONFIG_HOME", "KVSTORE_TOKEN", "KVSTORE_TLS_CA",
                 "KVSTORE_ADMIN_TOKEN", "KVSTORE_TRANSPORT", "KVSTORE_TLS_SERVER_NAME"):
        monkeypatch.delenv(name, raising=False)
    path = credentials_path()
    assert path == tmp_path / "home" / ".config" / "kvstore" / "credentials.json"
    return path


@pytest.fixture
def up_options(tmp_path: Path) -> UpOptions:
    return UpOptions(data_dir=tmp_path / "up", nodes=1, dram="64MiB", etcd_port=free_port(),
                     master_port=free_port(), extra_store_args=["--no-prefault"])


def up(opts: UpOptions, secure: bool) -> DevCluster:
    opts.secure = secure
    cluster = DevCluster(opts)
    try:
        cluster.start()
    except BaseException:
        cluster.stop()
        raise
    return cluster


def wait_until_serving(opts: UpOptions, cluster: DevCluster) -> None:
    """Until a client with default arguments can put (its node is mounted)."""
    deadline = time.monotonic() + 60
    last: Exception | None = None
    while time.monotonic() < deadline:
        dead = [name for name, proc in cluster.procs if proc.poll() is not None]
        assert not dead, f"{dead} exited; see {opts.data_dir / 'logs'}"
        try:
            with KVStoreClient(etcd=f"127.0.0.1:{opts.etcd_port}", timeout=5) as client:
                client.put(b"probe", b"x" * 100)
                return
        except KVStoreError as exc:
            last = exc
        time.sleep(0.2)
    raise AssertionError(f"the dev cluster did not serve: {last}")


def wait_until_plaintext_serving(opts: UpOptions, cluster: DevCluster) -> None:
    """Until the insecure run's leader answers in plaintext with its node mounted."""
    master = f"127.0.0.1:{opts.master_port}"
    deadline = time.monotonic() + 60
    while True:
        dead = [name for name, proc in cluster.procs if proc.poll() is not None]
        assert not dead, f"{dead} exited; see {opts.data_dir / 'logs'}"
        with grpc.insecure_channel(master) as ch:
            try:
                st = pbg.MasterStub(ch).ClusterStatus(pb.ClusterStatusRequest(), timeout=2)
                if st.nodes and not st.error.code:
                    return
            except grpc.RpcError:
                pass
        assert time.monotonic() < deadline, "the insecure cluster did not serve"
        time.sleep(0.2)


@pytest.fixture
def insecure_after_secure(home: Path, up_options: UpOptions) -> Iterator[tuple[UpOptions, dict]]:
    """A secure run, stopped, then an insecure one on the same endpoint (left running);
    yields the options and the secure run's credentials entry."""
    entry = f"127.0.0.1:{up_options.etcd_port}/default"
    secure = up(up_options, secure=True)
    try:
        wait_until_serving(up_options, secure)
    finally:
        secure.stop()
    stale = json.loads(home.read_text())[entry]
    assert stale["tls_ca"]
    insecure = up(up_options, secure=False)
    try:
        assert up_options.removed_credentials
        assert entry not in json.loads(home.read_text())
        wait_until_plaintext_serving(up_options, insecure)
        yield up_options, stale
    finally:
        insecure.stop()


def test_a_client_with_default_arguments_works_at_once(
        insecure_after_secure: tuple[UpOptions, dict]) -> None:
    opts, _ = insecure_after_secure
    for transport in ("fast", "grpc"):
        with KVStoreClient(etcd=f"127.0.0.1:{opts.etcd_port}", timeout=LONG,
                           transport=transport) as client:
            assert client.put(transport.encode(), b"v" * 1000) is None
            assert client.get(transport.encode()) == b"v" * 1000
            assert client.stats.failovers == 0


@pytest.mark.parametrize("transport", ["fast", "grpc"])
def test_a_stale_credentials_entry_fails_at_once_naming_the_file(
        insecure_after_secure: tuple[UpOptions, dict], home: Path, transport: str) -> None:
    opts, stale = insecure_after_secure
    etcd = f"127.0.0.1:{opts.etcd_port}"
    write_credentials(home, f"{etcd}/default", stale)  # as the secure run used to leave it
    with KVStoreClient(etcd=etcd, timeout=LONG, transport=transport) as client, \
            pytest.raises(TlsMismatch) as err:
        client.put(b"k", b"v")
    message = str(err.value)
    assert "answers in plaintext, but this client connects with TLS" in message
    assert f"the credentials file {home} gives it a CA (entry '{etcd}/default')" in message
    assert "127.0.0.1:" in message and f"remove the entry '{etcd}/default'" in message


def test_a_ca_given_to_the_client_against_a_plaintext_master_fails_at_once(
        insecure_after_secure: tuple[UpOptions, dict]) -> None:
    opts, stale = insecure_after_secure
    with KVStoreClient(etcd=f"127.0.0.1:{opts.etcd_port}", timeout=LONG,
                       tls_ca=stale["tls_ca"]) as client, pytest.raises(TlsMismatch) as err:
        client.exists([b"k"])
    assert "because it was given tls_ca=" in str(err.value)


def test_the_vllm_connectors_warning_carries_the_sentence(
        insecure_after_secure: tuple[UpOptions, dict], home: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    pytest.importorskip("vllm")
    from kvstore_vllm.link import StoreLink
    from kvstore_vllm.settings import Settings

    opts, stale = insecure_after_secure
    etcd = f"127.0.0.1:{opts.etcd_port}"
    write_credentials(home, f"{etcd}/default", stale)
    link = StoreLink(Settings(etcd=etcd, timeout=LONG), "scheduler")

    async def exists(client: object) -> object:
        return await client.exists([b"k"])  # type: ignore[attr-defined]

    try:
        with caplog.at_level("WARNING", logger="vllm.kvstore_vllm"), \
                pytest.raises(TlsMismatch):
            link.call(exists)
    finally:
        link.close()
    warning = next(r.getMessage() for r in caplog.records if "unreachable" in r.getMessage())
    assert "answers in plaintext, but this client connects with TLS because the " \
           f"credentials file {home} gives it a CA" in warning
