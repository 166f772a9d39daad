"""Who a store node is, kept with its data, so that a restarted node is the same node.

A node's data directories (its SSD tier's directory, and --data-dir, which a DRAM-only
node may give for this alone) each hold two small files beside the data:

- IDENTITY_FILE, `{"cluster": ..., "node_id": ...}`: written at the first start, read at
  every later one. The node id in it is reused, so that the SSD objects a node re-indexed
  after a crash come back under the id the leader already knows, and the new incarnation
  replaces the old one's etcd record at once instead of appearing as a second node.
  `--node-id` still wins, and is recorded for the next start.
- LOCK_FILE, flock'ed for the life of the process: two processes never share a data
  directory. The kernel drops the lock when the process dies, even by `kill -9`, so a
  supervisor's immediate restart is never refused by a lock its crashed run left.

A directory recorded for another cluster is refused, never adopted: its objects belong
to another cluster's keyspace and its id may be live there.

This module only touches files; what etcd says about the id is the daemon's business.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from kvstore.errors import AlreadyExists, InvalidArgument

IDENTITY_FILE = "kvstore-node.json"
LOCK_FILE = "kvstore-node.lock"
FORMAT = 1


def random_node_id() -> str:
    return f"{socket.gethostname()}-{uuid.uuid4().hex[:8]}"


@dataclass
class NodeIdentity:
    """The id a node runs under, and the locks on its data directories (held until
    `release`, or the process's end)."""

    node_id: str
    cluster: str
    dirs: list[Path] = field(default_factory=list)
    recorded: str = ""  # the id the directories held before this start ("": none)
    _lock_fds: list[int] = field(default_factory=list, repr=False)

    def release(self) -> None:
        fds, self._lock_fds = self._lock_fds, []
        for fd in fds:
            with contextlib.suppress(OSError):
                os.close(fd)  # releases the flock


def claim(dirs: list[str], cluster: str, node_id: str = "") -> NodeIdentity:
    """Lock every data directory, check that they belong to `cluster`, and settle the id.

    The id is `node_id` if given, else the one the directories record, else a new random
    one; it is written to every directory that does not hold it yet. No directories: the
    id is `node_id` or a random one, and nothing is kept (today's DRAM-only node).
    Raises AlreadyExists (a directory in use by a running node) or InvalidArgument
    (another cluster's directory, directories of two different nodes, a bad file).
    """
    paths = list(dict.fromkeys(Path(d) for d in dirs if d))
    ident = NodeIdentity(node_id or "", cluster, paths)
    try:
        for path in paths:
            ident._lock_fds.append(_lock(path))
        found: dict[Path, str] = {}
        for path in paths:
            recorded = _read(path, cluster)
            if recorded:
                found[path] = recorded
        ids = set(found.values())
        if len(ids) > 1:
            listing = ", ".join(f"{p} holds {i!r}" for p, i in found.items())
            raise InvalidArgument(
                f"the data directories belong to different nodes ({listing}); give each "
                "node its own directories, or pass --node-id to choose one")
        ident.recorded = ids.pop() if ids else ""
        ident.node_id = node_id or ident.recorded or random_node_id()
        for path in paths:
            if found.get(path) != ident.node_id:
                _write(path, cluster, ident.node_id)
    except BaseException:
        ident.release()
        raise
    return ident


def _lock(path: Path) -> int:
    try:
        path.mkdir(parents=True, exist_ok=True)
        fd = os.open(path / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        raise InvalidArgument(f"cannot use {path} as a node data directory: "
                              f"{exc.strerror}") from exc
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _holder(fd)
        os.close(fd)
        raise AlreadyExists(
            f"the data directory {path} is in use by another store node{holder}; give each "
            "node its own directory (--ssd-dir, --data-dir), or stop that node first"
        ) from None
    # Who holds it, for the sentence a second node gets; the lock itself is the flock.
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def _holder(fd: int) -> str:
    with contextlib.suppress(OSError, ValueError):
        pid = int(os.pread(fd, 32, 0).decode().strip())
        return f" (pid {pid})"
    return ""


def _read(path: Path, cluster: str) -> str:
    """The node id recorded in `path` for `cluster`; "" if none is recorded yet."""
    file = path / IDENTITY_FILE
    try:
        raw = file.read_text()
    except FileNotFoundError:
        return ""
    except OSError as exc:
        raise InvalidArgument(f"cannot read the node identity file {file}: "
                              f"{exc.strerror}") from exc
    try:
        data = json.loads(raw)
        recorded_cluster, node_id = str(data["cluster"]), str(data["node_id"])
    except (ValueError, KeyError, TypeError) as exc:
        raise InvalidArgument(
            f"the node identity file {file} is damaged ({exc}); fix it, or delete it to "
            "start this directory under a new node id") from exc
    if recorded_cluster != cluster:
        raise InvalidArgument(
            f"the data directory {path} belongs to node {node_id!r} of cluster "
            f"{recorded_cluster!r}, not of cluster {cluster!r}; start the node with "
            f"--cluster {recorded_cluster}, or give it another directory")
    if not node_id:
        raise InvalidArgument(f"the node identity file {file} names no node; delete it to "
                              "start this directory under a new node id")
    return node_id


def _write(path: Path, cluster: str, node_id: str) -> None:
    """Replace the identity file atomically: a crash leaves the old one or the new one."""
    file = path / IDENTITY_FILE
    tmp = path / f".{IDENTITY_FILE}.tmp"
    data = json.dumps({"format": FORMAT, "cluster": cluster, "node_id": node_id}) + "\n"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        try:
            os.write(fd, data.encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, file)
        dfd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except OSError as exc:
        raise InvalidArgument(f"cannot write the node identity file {file}: "
                              f"{exc.strerror}") from exc
