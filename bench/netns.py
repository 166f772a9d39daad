"""Run a benchmark inside a private network namespace that holds only loopback.

Every Transfer Engine (our store nodes and clients, Mooncake's store processes) listens
on all interfaces whatever address it is given. A benchmark therefore re-executes itself
under `unshare -n` (root needed), where nothing it starts can be reached from another
host and all traffic stays on 127.0.0.1.
"""

from __future__ import annotations

import os
import shlex
import shutil
import socket
import subprocess
import sys

_MARK = "KVSTORE_BENCH_NETNS"


def in_private_netns() -> bool:
    return [name for _, name in socket.if_nameindex()] == ["lo"]


def reexec_command(module: str, argv: list[str], python: str) -> list[str]:
    """The command line that runs `python -m module argv...` in a fresh namespace."""
    inner = shlex.join([python, "-m", module, *argv])
    return ["unshare", "-n", "sh", "-c", f"ip link set lo up && exec {inner}"]


def ensure_private_netns(module: str) -> None:
    """Return if already in a loopback-only namespace; else re-exec this process in one."""
    if in_private_netns():
        # Entered by hand with `unshare -n` but loopback left down: bring it up (idempotent).
        subprocess.run(["ip", "link", "set", "lo", "up"], check=False,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        return
    if os.environ.get(_MARK):
        sys.exit(f"{module}: still not in a private network namespace after unshare -n; "
                 "refusing to start Transfer Engines that listen on every interface")
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        sys.exit(f"{module} starts Transfer Engines, which listen on every interface; it must "
                 "run in a private network namespace. Run it as root (it re-executes itself "
                 "under `unshare -n`), or yourself: unshare -n sh -c 'ip link set lo up && "
                 f"exec {sys.executable} -m {module} ...'")
    sys.stdout.flush()
    sys.stderr.flush()
    os.environ[_MARK] = "1"
    cmd = reexec_command(module, sys.argv[1:], sys.executable)
    os.execvp(cmd[0], cmd)
