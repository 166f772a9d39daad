"""etcd's users and roles for one kvstore cluster, and turning etcd's auth on.

Two roles per cluster, each bound to one user of the same name:

- the daemon role (`kvstore-daemon`) reads and writes the cluster's prefix: masters
  elect and announce themselves, store nodes announce themselves, the leader writes the
  live settings it was asked to set;
- the reader role (`kvstore-client`) reads the leader's record, and in a sharded
  cluster the shard count and each shard's records under `shards/`, and nothing else:
  what a client that discovers the leaders through etcd needs (a client given master
  addresses needs no etcd user at all).

Everything else, the settings included, is the daemons' alone; an operator changes
settings through the leader (`kvstore config set` with an admin token), which checks them.
etcd itself wants a `root` user with the `root` role before it turns auth on; its
password is for the operator only.

Every step is idempotent, so the setup can run again on an etcd whose auth is already on
(it then logs in as root), e.g. to add a cluster's roles or set new passwords.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import grpc
from etcd3aio import Etcd3Client
from etcd3aio.auth import PermissionType
from etcd3aio.errors import EtcdError, EtcdPermissionDeniedError, EtcdUnauthenticatedError
from etcd3aio.kv import prefix_range_end

from kvstore.coord.etcd import auth_required, etcd_tls, parse_endpoint
from kvstore.coord.layout import DEFAULT_CLUSTER, Layout
from kvstore.errors import PermissionDenied, Unavailable

ROOT = "root"


@dataclass(frozen=True, slots=True)
class Roles:
    """The user (and role) names of one cluster."""

    daemon: str
    reader: str

    @classmethod
    def of(cls, cluster: str) -> Roles:
        suffix = "" if cluster == DEFAULT_CLUSTER else f"-{cluster}"
        return cls(f"kvstore-daemon{suffix}", f"kvstore-client{suffix}")


@dataclass(frozen=True, slots=True)
class SetupResult:
    roles: Roles
    auth_was_on: bool


async def _ensure_user(client: Etcd3Client, name: str, password: str) -> None:
    """Add the user, or give an existing one this password. A password that works
    already is left alone: etcd drops every token of a user whose password is set, and
    the daemons logged in as that user would have to log in again."""
    assert client.auth is not None
    try:
        await client.auth.user_add(name, password)
        return
    except (EtcdError, grpc.aio.AioRpcError) as exc:
        if "already exists" not in str(exc):
            raise
    try:
        await client.auth.authenticate(name, password)
        return
    except (EtcdError, grpc.aio.AioRpcError):
        pass  # another password, or etcd's auth is off still: set this one
    await client.auth.user_change_password(name, password)


async def _ensure_role(client: Etcd3Client, name: str) -> None:
    assert client.auth is not None
    try:
        await client.auth.role_add(name)
    except (EtcdError, grpc.aio.AioRpcError) as exc:
        if "already exists" not in str(exc):
            raise


async def set_up(endpoint: str, cluster: str, passwords: dict[str, str],
                 timeout: float = 5.0) -> SetupResult:
    """Create the roles and users of `cluster` and turn auth on. `passwords` holds one
    for `root` and for each of the cluster's two users (Roles.of)."""
    parse_endpoint(endpoint)
    layout = Layout(cluster)
    roles = Roles.of(cluster)
    tls = etcd_tls()
    client = Etcd3Client([endpoint], rpc_max_attempts=2, ca_cert=tls.get("ca_cert"),
                         cert_key=tls.get("cert_key"), cert_chain=tls.get("cert_chain"))
    await client.connect()
    try:
        assert client.auth is not None
        auth_was_on = False
        try:
            await client.auth.user_list(timeout=timeout)
        except (EtcdUnauthenticatedError, EtcdPermissionDeniedError):
            auth_was_on = True
        except grpc.aio.AioRpcError as exc:
            if not auth_required(exc):
                raise Unavailable(f"cannot reach etcd at {endpoint} ({exc.details()}); start "
                                  "etcd or pass the right --etcd HOST:PORT") from exc
            auth_was_on = True
        except (EtcdError, OSError, TimeoutError) as exc:
            raise Unavailable(f"cannot reach etcd at {endpoint} ({exc}); start etcd or pass "
                              "the right --etcd HOST:PORT") from exc
        if auth_was_on:
            try:
                resp = await client.auth.authenticate(ROOT, passwords[ROOT], timeout=timeout)
            except EtcdError as exc:
                raise PermissionDenied(
                    f"etcd at {endpoint} has auth on and refused root's password ({exc}); "
                    "put root's password in the secrets directory's root.password") from exc
            client.set_token(resp.token)
        await _ensure_user(client, ROOT, passwords[ROOT])
        with contextlib.suppress(EtcdError, grpc.aio.AioRpcError):  # it has the role already
            await client.auth.user_grant_role(ROOT, ROOT, timeout=timeout)
        for name in (roles.daemon, roles.reader):
            await _ensure_role(client, name)
            await _ensure_user(client, name, passwords[name])
            await client.auth.user_grant_role(name, name, timeout=timeout)
        await client.auth.role_grant_permission(
            roles.daemon, layout.root, prefix_range_end(layout.root),
            perm_type=PermissionType.READWRITE, timeout=timeout)
        await client.auth.role_grant_permission(
            roles.reader, layout.leader, perm_type=PermissionType.READ, timeout=timeout)
        # A sharded cluster's count and each shard's leader (and masters registry) lie
        # under `shards/`: a client reads the count, then each shard's leader.
        shards = layout.root + b"shards/"
        await client.auth.role_grant_permission(
            roles.reader, shards, prefix_range_end(shards), perm_type=PermissionType.READ,
            timeout=timeout)
        if not auth_was_on:
            await client.auth.auth_enable(timeout=timeout)
        return SetupResult(roles, auth_was_on)
    finally:
        await client.close()
