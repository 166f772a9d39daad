"""The object checksums: XXH3-64 over the object's bytes, or the page sum for bytes that
live on a GPU.

XXH3-64 is chosen for speed (tens of GB/s, so verifying every read costs far less than
moving the bytes) rather than cryptographic strength: it guards against torn, stale and
misplaced bytes, not against an attacker who can already write into a segment.

A GPU page cannot be hashed with XXH3 without copying it to the host first, which is the
copy the GPU data path exists to avoid. So an object written from GPU memory carries a
*page sum* instead: two sums of the object's little-endian 32-bit words modulo a prime
just above 2**32 (one plain, one weighted by the word's position), folded with the
length into 56 bits and tagged in the top byte. Integer arithmetic only, so torch on a
GPU, torch on the CPU and numpy compute the same value; it catches every change of one
word, every swap of two words and torn or stale bytes with the odds of a 56-bit hash.

Which function made a checksum is read off the value: `matches` tries XXH3 first and the
page sum only when the tag is there (an XXH3 value that happens to carry the tag costs a
second sum, never a false miss). Every verification goes through `matches` (or
`Verifier` for data read in pieces).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import xxhash
from typing_extensions import Buffer

PAGE_SUM_TAG = 0xC5  # the top byte of every page sum
_TAG_SHIFT = 56
_LOW56 = (1 << _TAG_SHIFT) - 1
_PRIME = 4294967311  # 2**32 + 15: above every 32-bit word, so no word is congruent to another
# Position weights stay below 2**31 and sums below 2**63 (int64) up to this many words.
MAX_PAGE_SUM_BYTES = 4 << 30


def checksum(data: Any) -> int:
    """The checksum a writer records: XXH3-64 of host bytes, the page sum of a tensor on
    a GPU (a flat uint8 tensor, as the client's buffers give them)."""
    if _on_gpu(data):
        return page_sum_tensor(data)
    return xxhash.xxh3_64_intdigest(data)


def matches(data: Any, expected: int) -> bool:
    """Whether `data` (host bytes or a GPU tensor) is the object `expected` describes."""
    if _on_gpu(data):
        if is_page_sum(expected):
            return page_sum_tensor(data) == expected
        # Written from the host with XXH3: only the host can check it.
        return xxhash.xxh3_64_intdigest(data.cpu().numpy()) == expected
    if xxhash.xxh3_64_intdigest(data) == expected:
        return True
    return is_page_sum(expected) and page_sum(data) == expected


def is_page_sum(value: int) -> bool:
    return value >> _TAG_SHIFT == PAGE_SUM_TAG


def _on_gpu(data: Any) -> bool:
    device = getattr(data, "device", None)
    return device is not None and getattr(device, "type", "cpu") != "cpu"


def _fold(s0: int, s1: int, length: int) -> int:
    """The two sums and the length as one tagged 56-bit value (a 64-bit finaliser mixes
    them so that nearby sums do not give nearby checksums)."""
    x = ((s0 << 33) ^ s1 ^ (length * 0x9E3779B97F4A7C15)) & 0xFFFFFFFFFFFFFFFF
    x ^= x >> 33
    x = (x * 0xFF51AFD7ED558CCD) & 0xFFFFFFFFFFFFFFFF
    x ^= x >> 33
    x = (x * 0xC4CEB9FE1A85EC53) & 0xFFFFFFFFFFFFFFFF
    x ^= x >> 33
    return (PAGE_SUM_TAG << _TAG_SHIFT) | (x & _LOW56)


def _check_length(n: int) -> None:
    if n > MAX_PAGE_SUM_BYTES:
        raise ValueError(f"a page sum covers at most {MAX_PAGE_SUM_BYTES} bytes, not {n}")


def _words_np(data: Buffer) -> np.ndarray:
    raw = np.frombuffer(memoryview(data).cast("B"), dtype=np.uint8)
    pad = -len(raw) % 4
    if pad:
        raw = np.concatenate([raw, np.zeros(pad, dtype=np.uint8)])
    return raw.view("<u4").astype(np.int64)


class PageHasher:
    """The page sum over data fed in pieces (an SSD file read in chunks)."""

    __slots__ = ("_carry", "_n", "_s0", "_s1")

    def __init__(self) -> None:
        self._s0 = 0
        self._s1 = 0
        self._n = 0  # bytes taken
        self._carry = b""  # a word split between two pieces

    def update(self, data: Buffer) -> None:
        raw = self._carry + bytes(data) if self._carry else memoryview(data).cast("B")
        whole = len(raw) - len(raw) % 4
        self._carry = bytes(raw[whole:])
        self._add(raw[:whole])

    def _add(self, raw: Buffer) -> None:
        words = _words_np(raw)
        if len(words) == 0:
            return
        first = self._n // 4 + 1
        pos = np.arange(first, first + len(words), dtype=np.int64)
        self._s0 = (self._s0 + int(words.sum() % _PRIME)) % _PRIME
        self._s1 = (self._s1 + int(((words * pos) % _PRIME).sum() % _PRIME)) % _PRIME
        self._n += len(words) * 4

    def intdigest(self) -> int:
        length = self._n + len(self._carry)
        _check_length(length)
        s0, s1 = self._s0, self._s1
        if self._carry:
            w = int.from_bytes(self._carry.ljust(4, b"\0"), "little")
            pos = self._n // 4 + 1
            s0, s1 = (s0 + w) % _PRIME, (s1 + w * pos) % _PRIME
        return _fold(s0, s1, length)


def page_sum(data: Buffer) -> int:
    """The page sum of host bytes (numpy)."""
    h = PageHasher()
    h.update(data)
    return h.intdigest()


def page_sum_tensor(t: Any) -> int:
    """The page sum of a tensor's bytes, computed where the tensor lives (torch ops: a
    few elementwise kernels and two reductions on a GPU)."""
    import torch

    flat = t.reshape(-1).view(torch.uint8)
    n = flat.numel()
    _check_length(n)
    pad = -n % 4
    if pad:
        flat = torch.cat([flat, torch.zeros(pad, dtype=torch.uint8, device=flat.device)])
    b = flat.reshape(-1, 4).to(torch.int64)
    words = b[:, 0] | (b[:, 1] << 8) | (b[:, 2] << 16) | (b[:, 3] << 24)
    pos = torch.arange(1, words.numel() + 1, dtype=torch.int64, device=flat.device)
    s0 = int(words.sum().item()) % _PRIME
    s1 = int(((words * pos) % _PRIME).sum().item()) % _PRIME
    return _fold(s0, s1, n)


class Verifier:
    """Checks data read in pieces against its recorded checksum, whichever function
    wrote it (the page sum is computed only when the value carries its tag)."""

    __slots__ = ("_expected", "_page", "_xxh")

    def __init__(self, expected: int) -> None:
        self._expected = expected
        self._xxh = xxhash.xxh3_64()
        self._page = PageHasher() if is_page_sum(expected) else None

    def update(self, data: Buffer) -> None:
        self._xxh.update(data)
        if self._page is not None:
            self._page.update(data)

    def ok(self) -> bool:
        if self._xxh.intdigest() == self._expected:
            return True
        return self._page is not None and self._page.intdigest() == self._expected
