"""A same-host copy checks that its node's process still lives (issue 32, item 5): the
segment stays mapped in the client after the node is killed, so a copy would succeed
into memory no node will ever record."""

from __future__ import annotations

import mmap
import os

from kvstore_client.local import LocalSegment


def test_alive_follows_the_nodes_memfd() -> None:
    fd = os.memfd_create("node-segment")
    os.ftruncate(fd, 4096)
    path = f"/proc/{os.getpid()}/fd/{fd}"
    inode = os.fstat(fd).st_ino
    m = mmap.mmap(fd, 4096)
    seg = LocalSegment("n0", 0, 4096, 0, m, path, inode)
    assert seg.alive()
    assert not LocalSegment("n0", 0, 4096, 0, m, path, inode + 1).alive()  # another memfd
    os.close(fd)  # what the node's death does to its fd
    assert not seg.alive()
    m.close()
