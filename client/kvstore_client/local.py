"""Same-host fast path: map a local store node's segment and copy with memcpy.

A store node's segment is a memfd; a client on the same host (same kernel boot, same pid
namespace) can map the very same pages through `/proc/<pid>/fd/<fd>` and skip the TCP
hop of the Transfer Engine. Nothing else changes: the master still allocates and pins,
and every read is still checked against its checksum. A mapping is trusted only if the
node's boot id and memfd inode, announced in etcd, match what this host sees.
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import os
from dataclasses import dataclass

from kvstore.coord.etcd import read_prefix_sync
from kvstore.coord.layout import Layout, NodeRecord
from kvstore.host import boot_id


@dataclass
class LocalSegment:
    node_id: str
    base_addr: int  # the segment's address in the store node
    size: int
    local_addr: int  # the same pages, mapped here
    _map: mmap.mmap
    path: str = ""  # the node's memfd under /proc: gone once the node's process is
    inode: int = 0

    def alive(self) -> bool:
        """Whether the node's process still lives. The mapping outlives it (this client
        holds the pages), so a copy into a killed node's segment would "succeed" and the
        put then wait for a node that will never record it. One stat of the node's memfd
        under /proc: gone with the process (a zombie has no fds), never reused by another
        process's (another pid, or another inode)."""
        if not self.path:
            return True
        try:
            return os.stat(self.path).st_ino == self.inode
        except OSError:
            return False

    def write(self, remote_addr: int, local_addr: int, n: int) -> None:
        ctypes.memmove(self.local_addr + (remote_addr - self.base_addr), local_addr, n)

    def read(self, local_addr: int, remote_addr: int, n: int) -> None:
        ctypes.memmove(local_addr, self.local_addr + (remote_addr - self.base_addr), n)

    def contains(self, remote_addr: int, n: int) -> bool:
        return self.base_addr <= remote_addr and remote_addr + n <= self.base_addr + self.size

    def close(self) -> None:
        with contextlib.suppress(BufferError):
            self._map.close()


class LocalSegments:
    """Which segments this client can reach by memcpy, keyed by (segment, node id)."""

    def __init__(self, etcd: str | None, layout: Layout, enabled: bool = True) -> None:
        self._etcd = etcd
        self._layout = layout
        self.enabled = enabled and etcd is not None
        self._boot_id = boot_id()
        self._maps: dict[tuple[str, str], LocalSegment | None] = {}

    def get(self, segment: str, node_id: str) -> LocalSegment | None:
        if not self.enabled:
            return None
        key = (segment, node_id)
        if key not in self._maps:
            self._refresh()
            self._maps.setdefault(key, None)
        return self._maps[key]

    def forget(self, segment: str, node_id: str) -> None:
        """Stop using a mapping (after a failed check); the next lookup retries once."""
        found = self._maps.pop((segment, node_id), None)
        if found is not None:
            found.close()
        self._maps[(segment, node_id)] = None

    def _refresh(self) -> None:
        assert self._etcd is not None
        try:
            records = read_prefix_sync(self._etcd, self._layout.nodes)
        except Exception:  # etcd unreachable: stay on the Transfer Engine
            return
        for raw in records:
            try:
                node = NodeRecord.decode(raw)
            except (ValueError, TypeError):
                continue
            key = (node.segment, node.node_id)
            if self._maps.get(key) is None:
                self._maps[key] = self._open(node)

    def _open(self, node: NodeRecord) -> LocalSegment | None:
        if not node.shm_path or not node.boot_id or node.boot_id != self._boot_id:
            return None
        try:
            fd = os.open(node.shm_path, os.O_RDWR)
        except OSError:
            return None  # another host, pid namespace or user
        try:
            st = os.fstat(fd)
            if st.st_ino != node.shm_inode or st.st_size != node.size:
                return None
            seg = mmap.mmap(fd, node.size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except OSError:
            return None
        finally:
            os.close(fd)
        addr = ctypes.addressof(ctypes.c_char.from_buffer(seg))
        return LocalSegment(node.node_id, node.base_addr, node.size, addr, seg, node.shm_path,
                            node.shm_inode)

    def close(self) -> None:
        for m in self._maps.values():
            if m is not None:
                m.close()
        self._maps.clear()
