"""The page sum (GPU-computable object checksum): torch and numpy agree, the value is
tagged, every verifier takes both functions, and damage is caught."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import xxhash

from kvstore.checksum import (
    PAGE_SUM_TAG,
    PageHasher,
    Verifier,
    checksum,
    is_page_sum,
    matches,
    page_sum,
    page_sum_tensor,
)

SIZES = [0, 1, 3, 4, 5, 4095, 64 << 10, (1 << 20) + 7]


@pytest.mark.parametrize("n", SIZES)
def test_torch_and_numpy_give_the_same_page_sum(n: int) -> None:
    rng = np.random.default_rng(n)
    data = rng.integers(0, 256, n, dtype=np.uint8)
    expected = page_sum(data.tobytes())
    assert page_sum_tensor(torch.from_numpy(data.copy())) == expected
    # a strided source (what the connector's pages can be) as its contiguous copy
    assert page_sum_tensor(torch.from_numpy(data.copy()).view(torch.uint8).reshape(-1)) == expected
    assert is_page_sum(expected) and expected >> 56 == PAGE_SUM_TAG


def test_pieces_give_the_same_sum_whatever_the_cut() -> None:
    data = np.random.default_rng(1).integers(0, 256, 10_001, dtype=np.uint8).tobytes()
    whole = page_sum(data)
    for cut in (1, 3, 4, 4097, 9999):
        h = PageHasher()
        for lo in range(0, len(data), cut):
            h.update(data[lo:lo + cut])
        assert h.intdigest() == whole


def test_every_single_word_change_and_swap_is_caught() -> None:
    base = bytearray(np.random.default_rng(2).integers(0, 256, 4096, dtype=np.uint8).tobytes())
    ref = page_sum(bytes(base))
    for pos in range(0, 4096, 97):
        changed = bytearray(base)
        changed[pos] ^= 0x01
        assert page_sum(bytes(changed)) != ref
    swapped = bytearray(base)
    swapped[0:4], swapped[8:12] = base[8:12], base[0:4]
    if base[0:4] != base[8:12]:
        assert page_sum(bytes(swapped)) != ref
    # a word congruent to another modulo 2**32 - 1 (what a smaller prime would miss)
    zeros, ones = bytes(8), b"\xff\xff\xff\x7f" + bytes(4)
    assert page_sum(zeros) != page_sum(ones)
    # the same words, one longer (trailing zero bytes): the length is in the sum
    assert page_sum(b"abcd") != page_sum(b"abcd\0")


def test_matches_takes_either_function_and_refuses_damage() -> None:
    data = np.random.default_rng(3).integers(0, 256, 8192, dtype=np.uint8).tobytes()
    assert matches(data, xxhash.xxh3_64_intdigest(data))
    assert matches(data, page_sum(data))
    assert not matches(data, page_sum(data[:-1] + b"x"))
    assert not matches(data, xxhash.xxh3_64_intdigest(data) ^ 1)
    # a host buffer is still hashed with XXH3 by the writer
    assert checksum(data) == xxhash.xxh3_64_intdigest(data)


def test_verifier_in_pieces_takes_either_function() -> None:
    data = np.random.default_rng(4).integers(0, 256, 5000, dtype=np.uint8).tobytes()
    for expected, good in ((page_sum(data), True), (xxhash.xxh3_64_intdigest(data), True),
                           (page_sum(data) ^ 2, False)):
        v = Verifier(expected)
        for lo in range(0, len(data), 1024):
            v.update(data[lo:lo + 1024])
        assert v.ok() is good


class _FakeDevice:
    type = "cuda"


class _OnDevice:
    """A CPU tensor dressed as a GPU one: the GPU branch of `checksum`/`matches` runs
    torch ops on whatever device the tensor is on, so this checks its dispatch here (no
    GPU on these machines; bench/gpu_check.py runs it on a real one)."""

    def __init__(self, t: torch.Tensor) -> None:
        self.t = t
        self.device = _FakeDevice()

    def reshape(self, *shape: int) -> torch.Tensor:
        return self.t.reshape(*shape)

    def cpu(self) -> torch.Tensor:
        return self.t


def test_a_gpu_tensor_is_summed_where_it_lives_and_xxh3_objects_still_verify() -> None:
    t = torch.randint(0, 256, (4096,), dtype=torch.uint8)
    dev = _OnDevice(t)
    assert checksum(dev) == page_sum(t.numpy().tobytes())
    assert matches(dev, page_sum(t.numpy().tobytes()))
    # written from the host with XXH3, read into a GPU: verified on the host
    assert matches(dev, xxhash.xxh3_64_intdigest(t.numpy()))
    assert not matches(dev, xxhash.xxh3_64_intdigest(t.numpy()) ^ 4)
