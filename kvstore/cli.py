"""The one `kvstore` command: daemons (master, store, up) and admin subcommands."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

# gRPC's C core, left to itself, logs every failed TLS handshake at INFO ("Handshake
# failed ... WRONG_VERSION_NUMBER") before the command can say what is wrong in its own
# words (a TlsMismatch). ERROR is gRPC's documented default; it is read when grpc loads.
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")

from kvstore import admin
from kvstore.admin import etcd_setup
from kvstore.errors import InvalidArgument, KVStoreError
from kvstore.logs import ENV_FORMAT, FORMATS, default_format, setup_logging
from kvstore.units import parse_size

if TYPE_CHECKING:
    from kvstore.security.daemons import DaemonSecurity


def _setup_logging(level: str, fmt: str = "text") -> None:
    # Children (`kvstore up` spawns the daemons) inherit the format through the env.
    os.environ[ENV_FORMAT] = fmt
    setup_logging(level, fmt)


def _run_async(coro_factory: object) -> int:
    try:
        import uvloop

        uvloop.install()
    except ImportError:  # optional speed-up only
        pass
    return int(asyncio.run(coro_factory()))  # type: ignore[operator]


def _security(args: argparse.Namespace) -> DaemonSecurity:
    from kvstore.security.daemons import DaemonSecurity

    return DaemonSecurity.from_flags(
        tls_cert=args.tls_cert, tls_key=args.tls_key, tls_ca=args.tls_ca,
        tls_client_ca=args.tls_client_ca, auth_file=args.auth_file, token_file=args.token_file,
        insecure=args.insecure, tls_server_name=args.tls_server_name)


def _drain_mover(args: argparse.Namespace) -> Any:
    """`kvstore drain` moves bytes through the client library. This command line is the
    one place where the servers' package and the client meet (see the import contracts
    in pyproject.toml)."""
    from kvstore.security.credentials import Credentials
    from kvstore_client.mover import SoleCopyMover

    # The admin's credentials, as the admin calls resolve them (--token, then
    # $KVSTORE_ADMIN_TOKEN, then the credentials file): the keys the leader hands the
    # mover carry their tenant's prefix, which a tenant's client token would add again.
    creds = Credentials.resolve(
        cluster=f"{args.master or args.etcd}/{args.cluster}", role="admin", token=args.token,
        tls_ca=args.tls_ca, tls_server_name=args.tls_server_name)
    return SoleCopyMover(args.etcd, args.master or None, args.cluster, args.timeout,
                         token=creds.token or None, tls_ca=creds.tls_ca or None,
                         tls_server_name=creds.tls_server_name or None)


def cmd_master(args: argparse.Namespace) -> int:
    from kvstore.master.core import CoreConfig
    from kvstore.master.daemon import MasterDaemon, MasterOptions, tune_gc
    from kvstore.shards import ShardSpec

    if not args.ack_timeout > 0:
        raise InvalidArgument(f"--ack-timeout must be a positive number of seconds, got "
                              f"{args.ack_timeout}")
    core = CoreConfig(
        put_timeout=args.put_timeout, default_lease_ttl=args.lease_ttl,
        max_lease_ttl=args.max_lease_ttl, evict_high=args.evict_high, evict_low=args.evict_low,
        default_replicas=args.replicas,
    )
    opts = MasterOptions(etcd=args.etcd, listen=args.listen, cluster=args.cluster,
                         master_id=args.master_id, etcd_lease_ttl=args.etcd_lease_ttl,
                         metrics_port=args.metrics_port, metrics_host=args.metrics_host,
                         core=core, fast_listen=args.fast_listen,
                         security=_security(args), ack_timeout=args.ack_timeout,
                         shard=ShardSpec.parse(args.shard))
    tune_gc()
    return _run_async(lambda: MasterDaemon(opts).run())


def cmd_store(args: argparse.Namespace) -> int:
    from kvstore.store.daemon import StoreDaemon, StoreOptions

    if not args.shutdown_flush >= 0:  # also refuses NaN
        raise InvalidArgument(f"--shutdown-flush must be seconds >= 0, got {args.shutdown_flush}")

    opts = StoreOptions(etcd=args.etcd, dram=parse_size(args.dram), cluster=args.cluster,
                        node_id=args.node_id, host=args.host, protocol=args.protocol,
                        device=args.device, etcd_lease_ttl=args.etcd_lease_ttl,
                        metrics_port=args.metrics_port, listen=args.listen,
                        metrics_host=args.metrics_host, ssd_dir=args.ssd_dir,
                        data_dir=args.data_dir,
                        ssd=parse_size(args.ssd) if args.ssd else 0,
                        ssd_fsync=not args.ssd_no_fsync, prefault=not args.no_prefault,
                        shutdown_flush=args.shutdown_flush, security=_security(args))
    return _run_async(lambda: StoreDaemon(opts).run())


def cmd_up(args: argparse.Namespace) -> int:
    from kvstore.devcluster import UpOptions, run_up

    parse_size(args.dram)  # fail before starting anything
    return run_up(UpOptions(data_dir=Path(args.data_dir), nodes=args.nodes, dram=args.dram,
                            etcd_port=args.etcd_port, master_port=args.master_port,
                            metrics_port=args.metrics_port, cluster=args.cluster,
                            shards=args.shards, secure=not args.insecure))


def cmd_token_new(args: argparse.Namespace) -> int:
    """Print a fresh token, and the access-file entry that admits it (its hash only)."""
    import json

    from kvstore.security.access import AccessList, new_token, token_hash

    entry: dict[str, str] = {"name": args.name, "role": args.role}
    if args.role == "client":
        entry["tenant"] = args.tenant
    elif args.tenant:
        print("kvstore: only client tokens belong to a tenant", file=sys.stderr)
        return 2
    token = new_token()
    entry["sha256"] = token_hash(token)
    # Validate the entry the way the daemons will read it.
    AccessList.parse({"tenants": {args.tenant: {}} if args.tenant else {}, "tokens": [entry]})
    print(f"token (give it to the {args.role}; it is not stored anywhere): {token}")
    print("access-file entry (add it under \"tokens\", then SIGHUP the master):")
    print(json.dumps(entry))
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    """`kvstore bench NAME ARGS...` is `python -m bench.NAME ARGS...` run from the source tree."""
    import os

    root = Path(__file__).resolve().parent.parent
    if not args.name.isidentifier() or not (root / "bench" / f"{args.name}.py").is_file():
        print(f"kvstore: no benchmark bench/{args.name}.py under {root}", file=sys.stderr)
        return 2
    path = os.pathsep.join(p for p in (str(root), os.environ.get("PYTHONPATH", "")) if p)
    sys.stdout.flush()
    os.execve(sys.executable, [sys.executable, "-m", f"bench.{args.name}", *args.args],
              {**os.environ, "PYTHONPATH": path})
    return 0  # not reached


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kvstore", description="Distributed KV-cache store for LLM inference")
    p.add_argument("--log-level", default="info", help="debug, info, warning, error")
    p.add_argument("--log-format", default=default_format(), choices=FORMATS,
                   help="text: `ts LEVEL logger msg key=value`; json: one object per line "
                        "(ts, level, logger, msg, extra fields). Default: $KVSTORE_LOG_FORMAT "
                        "or text")
    sub = p.add_subparsers(dest="command", required=True)

    def common(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--etcd", default="127.0.0.1:2379", help="etcd HOST:PORT")
        sp.add_argument("--cluster", default="default", help="cluster name (etcd key prefix)")

    def security(sp: argparse.ArgumentParser) -> None:
        g = sp.add_argument_group("security (see the README's Security section)")
        g.add_argument("--tls-cert", default="", help="PEM certificate: serve TLS only")
        g.add_argument("--tls-key", default="", help="PEM private key of --tls-cert")
        g.add_argument("--tls-ca", default="",
                       help="CA of the peers' certificates (master <-> store nodes); default: "
                            "the system's roots")
        g.add_argument("--tls-server-name", default="",
                       help="check peers' certificates for this name instead of their address")
        g.add_argument("--tls-client-ca", default="",
                       help="require client certificates signed by this CA (mutual TLS)")
        g.add_argument("--auth-file", default="",
                       help="access file (tokens, roles, tenants, quotas); master: SIGHUP "
                            "reloads it. Unset: no tokens are checked")
        g.add_argument("--token-file", default="",
                       help="file holding the node token this daemon presents to its peers")
        g.add_argument("--insecure", action="store_true",
                       help="allow listening beyond loopback without TLS and tokens")

    m = sub.add_parser("master", help="run a master (leader or standby)")
    common(m)
    m.add_argument("--listen", default="127.0.0.1:50051", help="gRPC HOST:PORT")
    m.add_argument("--fast-listen", default="",
                   help="HOST:PORT of the fast control channel the clients use by default "
                        "(default: --listen's host, a free port; announced in etcd)")
    m.add_argument("--master-id", default="")
    m.add_argument("--shard", default="0/1", metavar="K/N",
                   help="this master's shard K of the cluster's N (default 0/1: one shard); "
                        "the count is recorded in etcd by the first master and fixed")
    m.add_argument("--put-timeout", type=float, default=30.0,
                   help="seconds before an uncommitted put is reclaimed")
    m.add_argument("--lease-ttl", type=float, default=30.0, help="default read-lease TTL, s")
    m.add_argument("--max-lease-ttl", type=float, default=60.0,
                   help="cap on read-lease TTLs, s; also how long a new leader holds eviction")
    m.add_argument("--evict-high", type=float, default=0.98)
    m.add_argument("--evict-low", type=float, default=0.97)
    m.add_argument("--replicas", type=int, default=1, help="default replicas per object")
    m.add_argument("--etcd-lease-ttl", type=int, default=5)
    m.add_argument("--ack-timeout", type=float, default=3.0,
                   help="seconds a write's reply waits for its store nodes to record it "
                        "before the write fails as Unavailable (see docs/durability.md)")
    m.add_argument("--metrics-port", type=int, default=0, help="serve /metrics here (0: off)")
    m.add_argument("--metrics-host", default="127.0.0.1",
                   help="address /metrics listens on (the pod IP under Kubernetes)")
    security(m)
    m.set_defaults(func=cmd_master)

    s = sub.add_parser("store", help="run a store node")
    common(s)
    s.add_argument("--dram", default="1GiB", help="DRAM segment size, e.g. 4GiB")
    s.add_argument("--no-prefault", action="store_true",
                   help="do not reserve and map the DRAM segment at start (faster start, about "
                        "0.5 s per GiB less; first writes to each page are slower and the memory "
                        "is not reserved until written)")
    s.add_argument("--node-id", default="",
                   help="the node's id (default: the one its --ssd-dir or --data-dir records, "
                        "else a new random one); recorded there for the next start")
    s.add_argument("--data-dir", default="",
                   help="directory that keeps the node's identity across restarts, for a "
                        "DRAM-only node (one with --ssd-dir keeps it there); see docs/ssd.md")
    s.add_argument("--host", default="127.0.0.1", help="address the Transfer Engine announces")
    s.add_argument("--protocol", default="tcp", choices=["tcp", "rdma"])
    s.add_argument("--device", default="", help="RDMA NIC name(s) for --protocol rdma")
    s.add_argument("--etcd-lease-ttl", type=int, default=5)
    s.add_argument("--metrics-port", type=int, default=0)
    s.add_argument("--listen", default="", help="the node's gRPC HOST:PORT (default: --host, free port)")
    s.add_argument("--metrics-host", default="127.0.0.1", help="address /metrics listens on")
    s.add_argument("--ssd-dir", default="", help="directory of the SSD tier (none if unset)")
    s.add_argument("--ssd", default="", help="SSD tier cap in bytes on disk, e.g. 100GiB")
    s.add_argument("--ssd-no-fsync", action="store_true",
                   help="skip fsync on SSD writes (faster; a crash may lose recent demotions)")
    s.add_argument("--shutdown-flush", type=float, default=20.0, metavar="SECONDS",
                   help="on SIGTERM, spend at most this long writing the DRAM objects to the "
                        "SSD tier, so that a restart keeps them (0: do not; keep it below "
                        "the service manager's stop timeout) (default %(default)s)")
    security(s)
    s.set_defaults(func=cmd_store)

    u = sub.add_parser("up", help="run a local dev cluster (etcd + master + store nodes)")
    u.add_argument("--data-dir", default=".kvstore")
    u.add_argument("--nodes", type=int, default=1)
    u.add_argument("--dram", default="1GiB", help="DRAM per store node")
    u.add_argument("--etcd-port", type=int, default=2379)
    u.add_argument("--master-port", type=int, default=50051,
                   help="the master's port; with --shards N, shard k's is this + k")
    u.add_argument("--shards", type=int, default=1,
                   help="control-plane shards: one master per shard, started with --shard "
                        "k/N (default %(default)s: one master, as without shards)")
    u.add_argument("--metrics-port", type=int, default=0)
    u.add_argument("--cluster", default="default")
    u.add_argument("--insecure", action="store_true",
                   help="no TLS, no tokens (default: a dev CA and tokens under --data-dir)")
    u.set_defaults(func=cmd_up)

    # status, nodes, capacity, evictions, keys, inspect, evict, drain, config
    admin.register(sub, make_mover=_drain_mover)
    etcd_setup.register(sub)  # etcd's users and roles, auth on (docs/operations.md)

    t = sub.add_parser("token", help="make tokens for the access file (--auth-file)")
    tsub = t.add_subparsers(dest="token_command", required=True)
    tn = tsub.add_parser("new", help="print a new token and its access-file entry")
    tn.add_argument("--name", required=True, help="who holds it (shown in logs and refusals)")
    tn.add_argument("--role", required=True, choices=["client", "node", "admin"])
    tn.add_argument("--tenant", default="", help="the tenant of a client token")
    tn.set_defaults(func=cmd_token_new)

    b = sub.add_parser("bench", help="run a benchmark: python -m bench.NAME ARGS (e.g. replay)")
    b.add_argument("name", help="module under bench/: replay, vs_mooncake, master_ops, ...")
    b.add_argument("args", nargs=argparse.REMAINDER, help="passed to the benchmark")
    b.set_defaults(func=cmd_bench)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    _setup_logging(args.log_level, args.log_format)
    try:
        return int(args.func(args))
    except KVStoreError as exc:
        print(f"kvstore: {exc.message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
