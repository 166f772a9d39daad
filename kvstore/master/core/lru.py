"""The LRU list of evictable objects: COMPLETE and pinned by no lease.

Why exact LRU, and why it is cheap here. Redis samples a few keys and evicts the oldest
of the sample (evict.c), because an exact LRU costs two pointers per key on top of a
tiny record, and its eviction must visit keys that cannot be evicted. Our records are
larger and our unevictable objects are kept off the list, so an exact list costs 8 bytes
per object (two int32 columns indexed by slot) and evicting k objects costs O(k):

  * an object joins the list at the most-recent end when it becomes evictable: on
    `put_end`, and when the last lease pinning it lets go;
  * it leaves the list when it stops being evictable: pinned by a lookup or a read
    (which is also what "touch" means — a pinned object returns at the recent end when
    unpinned), removed, or lost with its node;
  * PENDING objects never join.

So the oldest entry is always the best victim and there is never anything to skip.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable

_OFF = -1  # not on the list
_HEAD = 0  # sentinel slot: next[0] is the oldest, prev[0] the most recent


class LruList:
    __slots__ = ("_len", "next", "prev")

    def __init__(self) -> None:
        self.prev = array("i", [_HEAD])
        self.next = array("i", [_HEAD])
        self._len = 0

    def __len__(self) -> int:
        return self._len

    def grow(self, slots: int) -> None:
        """Make room for slots [0, slots)."""
        extra = slots - len(self.prev)
        if extra > 0:
            self.prev.extend([_OFF] * extra)
            self.next.extend([_OFF] * extra)

    def push(self, s: int) -> None:
        """Append at the most-recent end."""
        prev = self.prev
        last = prev[_HEAD]
        prev[s] = last
        self.next[s] = _HEAD
        self.next[last] = s
        prev[_HEAD] = s
        self._len += 1

    def push_all(self, slots: Iterable[int]) -> None:
        """push() for many slots, in order: releasing a lease unpins in bulk."""
        prev = self.prev
        nxt = self.next
        last = prev[_HEAD]
        n = 0
        for s in slots:
            prev[s] = last
            nxt[last] = s
            last = s
            n += 1
        nxt[last] = _HEAD
        prev[_HEAD] = last
        self._len += n

    def unlink(self, s: int) -> None:
        nxt = self.next
        n = nxt[s]
        if n == _OFF:
            return
        p = self.prev[s]
        nxt[p] = n
        self.prev[n] = p
        nxt[s] = _OFF
        self.prev[s] = _OFF
        self._len -= 1

    def touch(self, s: int) -> None:
        """Move a slot on the list to the most-recent end (one off the list stays off)."""
        if self.next[s] == _OFF:
            return
        self.unlink(s)
        self.push(s)

    def unlink_all(self, slots: Iterable[int]) -> None:
        """unlink() for many slots, all on the list: the lookup path pins in bulk."""
        prev = self.prev
        nxt = self.next
        n = 0
        for s in slots:
            a = prev[s]
            b = nxt[s]
            nxt[a] = b
            prev[b] = a
            nxt[s] = _OFF
            prev[s] = _OFF
            n += 1
        self._len -= n

    def oldest(self) -> int:
        """The least recently used slot, or 0 when the list is empty."""
        return self.next[_HEAD]
