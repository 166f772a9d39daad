"""Least privilege with etcd's auth on (issue 29), through real processes.

A real etcd gets its users and roles from `kvstore etcd-setup`; masters and a store node
run as the daemon user, with an access file of admin, client and node tokens. What a
client (or a tenant's engine) may hold cannot change the cluster's truth: the reader
user reads the leader's record and nothing else, settings change only through the
leader with an admin token, and a client given master addresses needs no etcd at all.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvstore.coord.etcd import read_key_sync, read_prefix_sync, write_keys_sync
from kvstore.coord.etcd_auth import Roles
from kvstore.coord.layout import Layout, MasterRecord
from kvstore.devcluster import wait_for_port
from kvstore.errors import PermissionDenied, Unauthenticated
from kvstore.security.access import new_token, token_hash
from kvstore_client import KVStoreClient
from tests.conftest import Cluster
from tests.unit.polling import wait_until

ROLES = Roles.of("default")
LAYOUT = Layout()
UNREACHABLE_ETCD = "127.0.0.1:1"  # a client given master addresses must never need it


class Authed:
    def __init__(self, c: Cluster, tmp: Path) -> None:
        self.c = c
        self.secrets = tmp / "secrets"
        run = subprocess.run([sys.executable, "-m", "kvstore", "etcd-setup", "--etcd", c.etcd,
                              "--secrets", str(self.secrets), "--json"],
                             capture_output=True, text=True, env=self.env(None), timeout=60)
        assert run.returncode == 0, run.stderr
        self.setup = json.loads(run.stdout)
        self.tokens = {name: new_token() for name in ("admin", "alice", "node")}
        access = {"tenants": {"a": {}}, "tokens": [
            {"name": "ops", "role": "admin", "sha256": token_hash(self.tokens["admin"])},
            {"name": "alice", "role": "client", "tenant": "a",
             "sha256": token_hash(self.tokens["alice"])},
            {"name": "nodes", "role": "node", "sha256": token_hash(self.tokens["node"])}]}
        (tmp / "access.json").write_text(json.dumps(access))
        (tmp / "node.token").write_text(self.tokens["node"])
        self.flags = ["--auth-file", str(tmp / "access.json"),
                      "--token-file", str(tmp / "node.token"), "--etcd-lease-ttl", "2"]

    def env(self, user: str | None) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("KVSTORE_ETCD_")}
        if user is not None:
            env["KVSTORE_ETCD_USER"] = user
            env["KVSTORE_ETCD_PASSWORD_FILE"] = str(self.secrets / f"{user}.password")
        return env

    @contextlib.contextmanager
    def as_user(self, user: str | None) -> Iterator[None]:
        """This process (and what it spawns) under `user`'s etcd credentials."""
        saved = dict(os.environ)
        os.environ.clear()
        os.environ.update(self.env(user))
        try:
            yield
        finally:
            os.environ.clear()
            os.environ.update(saved)

    def start_master(self) -> str:
        with self.as_user(ROLES.daemon):
            return self.c.start_master(*self.flags)

    def start_store(self) -> None:
        with self.as_user(ROLES.daemon):
            self.c.start_store("64MiB", *self.flags[:4])

    def leader(self) -> str:
        with self.as_user(ROLES.reader):
            raw = read_key_sync(self.c.etcd, LAYOUT.leader)
        return MasterRecord.decode(raw).address if raw else ""

    def kvstore(self, *words: str, token: str, user: str | None = ROLES.reader,
                expect: int | None = 0) -> subprocess.CompletedProcess[str]:
        """`kvstore WORDS`; `expect` None: any exit code."""
        run = subprocess.run([sys.executable, "-m", "kvstore", *words, "--etcd", self.c.etcd,
                              "--token", token], capture_output=True, text=True,
                             env=self.env(user), timeout=60)
        if expect is not None:
            assert run.returncode == expect, (run.stdout, run.stderr, self.c.logs())
        return run


@pytest.fixture
def authed(cluster_factory: Cluster, tmp_path: Path) -> Authed:
    a = Authed(cluster_factory, tmp_path)
    a.start_master()
    a.start_store()
    wait_until(lambda: a.leader(), what=lambda: "a leader; logs:\n" + cluster_factory.logs())
    wait_until(lambda: _nodes(a) == 1, what=lambda: "the node mounted; logs:\n"
               + cluster_factory.logs())
    return a


def _nodes(a: Authed) -> int:
    run = a.kvstore("nodes", "--json", token=a.tokens["admin"], expect=0)
    return len(json.loads(run.stdout)["nodes"])


def test_setup_prints_what_each_process_needs(authed: Authed) -> None:
    assert authed.setup["daemons"]["KVSTORE_ETCD_USER"] == ROLES.daemon
    assert authed.setup["clients"]["KVSTORE_ETCD_USER"] == ROLES.reader
    for name in ("root", ROLES.daemon, ROLES.reader):
        path = authed.secrets / f"{name}.password"
        assert path.stat().st_mode & 0o077 == 0  # the operator's alone
    # A second run changes nothing and keeps the daemons logged in.
    again = subprocess.run([sys.executable, "-m", "kvstore", "etcd-setup", "--etcd",
                            authed.c.etcd, "--secrets", str(authed.secrets), "--json"],
                           capture_output=True, text=True, env=authed.env(None), timeout=60)
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["auth_was_on"] is True
    assert _nodes(authed) == 1


def test_a_client_credential_cannot_change_the_clusters_truth(authed: Authed) -> None:
    etcd = authed.c.etcd
    node_key = LAYOUT.node("node-0")
    for user in (ROLES.reader, None):
        with authed.as_user(user):
            refused = PermissionDenied if user else Unauthenticated
            with pytest.raises(refused) as exc:
                write_keys_sync(etcd, {LAYOUT.setting("evict_high"): b"0.5"})
            assert "kvstore config set" in exc.value.message or "KVSTORE_ETCD_USER" in \
                exc.value.message
            with pytest.raises(refused):
                write_keys_sync(etcd, {}, [node_key])  # delete a node's record
            with pytest.raises(refused):
                write_keys_sync(etcd, {LAYOUT.node("forged"): b"{}"})  # write one
            with pytest.raises(refused):
                write_keys_sync(etcd, {}, [LAYOUT.leader])  # depose the leader
            with pytest.raises(refused):
                write_keys_sync(etcd, {LAYOUT.leader: MasterRecord("evil", "127.0.0.1:9", 1)
                                       .encode()})  # take the seat
            with pytest.raises(refused):
                read_prefix_sync(etcd, LAYOUT.nodes)
    # The reader may read what discovery needs; the daemon user sees everything intact.
    assert authed.leader()
    with authed.as_user(ROLES.daemon):
        assert read_key_sync(etcd, node_key) is not None
        assert read_prefix_sync(etcd, LAYOUT.config) == []
    assert _nodes(authed) == 1


def test_config_set_goes_through_the_leader_with_an_admin_token(authed: Authed) -> None:
    # Above the default evict_low (0.97): valid alone.
    ok = authed.kvstore("config", "set", "evict_high", "0.99", "--json",
                        token=authed.tokens["admin"])
    assert json.loads(ok.stdout) == {"set": {"evict_high": 0.99}, "applied": True}
    with authed.as_user(ROLES.daemon):
        assert read_prefix_sync(authed.c.etcd, LAYOUT.config) == [b"0.99"]  # the leader wrote it

    refused = authed.kvstore("config", "set", "evict_high", "0.5",
                             token=authed.tokens["alice"], expect=2)
    assert "token 'alice' has role client, which may not call SetConfig" in refused.stderr
    # A conflict is the leader's sentence, and nothing is written.
    bad = authed.kvstore("config", "set", "evict_low", "0.995", token=authed.tokens["admin"],
                         expect=2)
    assert "evict_low" in bad.stderr and bad.stderr.startswith("kvstore: ")
    got = authed.kvstore("config", "get", "--json", token=authed.tokens["admin"])
    settings = json.loads(got.stdout)["settings"]
    assert settings["evict_high"]["value"] == 0.99
    assert settings["evict_high"]["etcd"] is None  # the reader may not read config/

    authed.kvstore("config", "unset", "evict_high", token=authed.tokens["admin"])
    with authed.as_user(ROLES.daemon):
        assert read_prefix_sync(authed.c.etcd, LAYOUT.config) == []


def test_a_client_given_master_addresses_follows_a_failover_without_etcd(
        authed: Authed) -> None:
    first = authed.leader()
    second = authed.start_master()
    masters = ",".join([second, first])  # a standby first: it names the leader
    with authed.as_user(None), KVStoreClient(etcd=UNREACHABLE_ETCD, master=masters,
                                             token=authed.tokens["alice"], timeout=60) as c:
        assert c.put_many([b"k"], [b"v" * 4096]) == [None]
        before = c.master_address
        old = next(p for p, addr in authed.c.masters if addr == first)
        old.kill(signal.SIGKILL)
        wait_until(lambda: authed.leader() == second,
                   what=lambda: "the standby leading; logs:\n" + authed.c.logs())
        # The same client, with no etcd to read, finds the new leader.
        assert c.put_many([b"k2"], [b"w" * 4096]) == [None]
        assert c.get_many([b"k2"]) == [b"w" * 4096]
        assert c.master_address != before


def test_the_daemons_log_in_again_after_etcd_restarts(authed: Authed) -> None:
    """etcd forgets every auth token when it restarts: the daemons must log in again
    rather than fail every etcd call until a periodic renewal."""
    etcd = next(p for p in authed.c.procs if p.name == "etcd")
    etcd.kill(signal.SIGKILL)
    again = authed.c.spawn("etcd-again", etcd.cmd)
    wait_for_port(authed.c.etcd_port, again.popen, "etcd")
    # The leader writes etcd for this (with a token etcd no longer knows at first).
    wait_until(lambda: authed.kvstore("config", "set", "put_timeout", "12", "--json",
                                      token=authed.tokens["admin"], expect=None).returncode == 0,
               what=lambda: "a setting stored after etcd's restart; logs:\n" + authed.c.logs())
    with authed.as_user(ROLES.daemon):
        assert read_prefix_sync(authed.c.etcd, LAYOUT.config) == [b"12.0"]
    assert _nodes(authed) == 1

