"""The one `kvstore` command: daemons (master, store, up) and admin subcommands."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from pathlib import Path

from kvstore.errors import KVStoreError
from kvstore.units import parse_size


def _setup_logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
        stream=sys.stderr,
    )


def _run_async(coro_factory: object) -> int:
    try:
        import uvloop

        uvloop.install()
    except ImportError:  # optional speed-up only
        pass
    return int(asyncio.run(coro_factory()))  # type: ignore[operator]


def cmd_master(args: argparse.Namespace) -> int:
    from kvstore.master.core import CoreConfig
    from kvstore.master.daemon import MasterDaemon, MasterOptions

    core = CoreConfig(
        put_timeout=args.put_timeout, default_lease_ttl=args.lease_ttl,
        max_lease_ttl=args.max_lease_ttl, evict_high=args.evict_high, evict_low=args.evict_low,
        default_replicas=args.replicas,
    )
    opts = MasterOptions(etcd=args.etcd, listen=args.listen, cluster=args.cluster,
                         master_id=args.master_id, etcd_lease_ttl=args.etcd_lease_ttl,
                         metrics_port=args.metrics_port, metrics_host=args.metrics_host,
                         core=core)
    return _run_async(lambda: MasterDaemon(opts).run())


def cmd_store(args: argparse.Namespace) -> int:
    from kvstore.store.daemon import StoreDaemon, StoreOptions

    opts = StoreOptions(etcd=args.etcd, dram=parse_size(args.dram), cluster=args.cluster,
                        node_id=args.node_id, host=args.host, protocol=args.protocol,
                        device=args.device, etcd_lease_ttl=args.etcd_lease_ttl,
                        metrics_port=args.metrics_port, listen=args.listen)
    return _run_async(lambda: StoreDaemon(opts).run())


def cmd_up(args: argparse.Namespace) -> int:
    from kvstore.devcluster import UpOptions, run_up

    parse_size(args.dram)  # fail before starting anything
    return run_up(UpOptions(data_dir=Path(args.data_dir), nodes=args.nodes, dram=args.dram,
                            etcd_port=args.etcd_port, master_port=args.master_port,
                            metrics_port=args.metrics_port, cluster=args.cluster))


def cmd_status(args: argparse.Namespace) -> int:
    from kvstore.admin import status

    return status(args)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kvstore", description="Distributed KV-cache store for LLM inference")
    p.add_argument("--log-level", default="info", help="debug, info, warning, error")
    sub = p.add_subparsers(dest="command", required=True)

    def common(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--etcd", default="127.0.0.1:2379", help="etcd HOST:PORT")
        sp.add_argument("--cluster", default="default", help="cluster name (etcd key prefix)")

    m = sub.add_parser("master", help="run a master (leader or standby)")
    common(m)
    m.add_argument("--listen", default="127.0.0.1:50051", help="gRPC HOST:PORT")
    m.add_argument("--master-id", default="")
    m.add_argument("--put-timeout", type=float, default=30.0,
                   help="seconds before an uncommitted put is reclaimed")
    m.add_argument("--lease-ttl", type=float, default=30.0, help="default read-lease TTL, s")
    m.add_argument("--max-lease-ttl", type=float, default=60.0,
                   help="cap on read-lease TTLs, s; also how long a new leader holds eviction")
    m.add_argument("--evict-high", type=float, default=0.90)
    m.add_argument("--evict-low", type=float, default=0.80)
    m.add_argument("--replicas", type=int, default=1, help="default replicas per object")
    m.add_argument("--etcd-lease-ttl", type=int, default=5)
    m.add_argument("--metrics-port", type=int, default=0, help="serve /metrics here (0: off)")
    m.add_argument("--metrics-host", default="127.0.0.1",
                   help="address /metrics listens on (the pod IP under Kubernetes)")
    m.set_defaults(func=cmd_master)

    s = sub.add_parser("store", help="run a store node")
    common(s)
    s.add_argument("--dram", default="1GiB", help="DRAM segment size, e.g. 4GiB")
    s.add_argument("--node-id", default="")
    s.add_argument("--host", default="127.0.0.1", help="address the Transfer Engine announces")
    s.add_argument("--protocol", default="tcp", choices=["tcp", "rdma"])
    s.add_argument("--device", default="", help="RDMA NIC name(s) for --protocol rdma")
    s.add_argument("--etcd-lease-ttl", type=int, default=5)
    s.add_argument("--metrics-port", type=int, default=0)
    s.add_argument("--listen", default="", help="the node's gRPC HOST:PORT (default: --host, free port)")
    s.set_defaults(func=cmd_store)

    u = sub.add_parser("up", help="run a local dev cluster (etcd + master + store nodes)")
    u.add_argument("--data-dir", default=".kvstore")
    u.add_argument("--nodes", type=int, default=1)
    u.add_argument("--dram", default="1GiB", help="DRAM per store node")
    u.add_argument("--etcd-port", type=int, default=2379)
    u.add_argument("--master-port", type=int, default=50051)
    u.add_argument("--metrics-port", type=int, default=0)
    u.add_argument("--cluster", default="default")
    u.set_defaults(func=cmd_up)

    st = sub.add_parser("status", help="leader, nodes, capacity, objects")
    common(st)
    st.add_argument("--master", default="", help="master HOST:PORT (default: from etcd)")
    st.add_argument("--json", action="store_true")
    st.set_defaults(func=cmd_status)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    _setup_logging(args.log_level)
    try:
        return int(args.func(args))
    except KVStoreError as exc:
        print(f"kvstore: {exc.message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
