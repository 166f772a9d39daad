"""Buffers and keys as the flows take them: addresses, flat byte views, checked keys.

What a caller hands the client (bytes, numpy arrays, CPU torch tensors, any contiguous
buffer) becomes an address and a byte view here, once, before any step is yielded; a
buffer the engine cannot address is refused with an InvalidArgument that says why.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from kvstore.errors import InvalidArgument, check_key


@dataclass(slots=True)
class Dest:
    """Where one object's bytes come from or land: registered memory."""

    addr: int
    view: memoryview


class Regions:
    """The memory registered with the engine: a buffer is zero-copy only inside it."""

    __slots__ = ("spans",)

    def __init__(self) -> None:
        self.spans: list[tuple[int, int]] = []

    def add(self, addr: int, nbytes: int) -> None:
        self.spans.append((addr, addr + nbytes))

    def remove(self, addr: int, nbytes: int) -> None:
        self.spans = [r for r in self.spans if r != (addr, addr + nbytes)]

    def dest(self, buffer: Any) -> Dest:
        addr, view = address_and_view(buffer)
        end = addr + view.nbytes
        for lo, hi in self.spans:
            if lo <= addr and end <= hi:
                return Dest(addr, view)
        raise InvalidArgument("buffer is not inside registered memory; call "
                              "client.register(buffer or the tensor it is a slice of) first")


def buffer_address(buffer: Any) -> tuple[int, int]:
    """(address, length in bytes) of a contiguous buffer or CPU torch tensor."""
    if hasattr(buffer, "data_ptr") and hasattr(buffer, "element_size"):
        if not buffer.is_contiguous():
            raise InvalidArgument("tensor is not contiguous; pass a contiguous tensor or slice")
        if buffer.device.type != "cpu":
            raise InvalidArgument(f"tensors on {buffer.device} need the CUDA Transfer Engine "
                                  "build (mooncake-transfer-engine)")
        return int(buffer.data_ptr()), int(buffer.numel() * buffer.element_size())
    addr, view = address_and_view(buffer)
    return addr, view.nbytes


def address_and_view(buffer: Any) -> tuple[int, memoryview]:
    """The address and a flat byte view of a contiguous buffer or CPU torch tensor."""
    if hasattr(buffer, "data_ptr") and hasattr(buffer, "element_size"):
        return buffer_address(buffer)[0], byte_view(buffer)
    view = byte_view(buffer)
    try:  # a writable buffer: the quick way
        return ctypes.addressof(ctypes.c_char.from_buffer(view)), view
    except (TypeError, ValueError):  # read-only or empty
        return int(np.frombuffer(view, dtype=np.uint8).ctypes.data), view


def byte_view(buffer: Any) -> memoryview:
    """A flat byte view of a buffer-protocol object or a CPU torch tensor."""
    if hasattr(buffer, "data_ptr") and hasattr(buffer, "numpy"):
        import torch

        buffer = buffer.detach().reshape(-1).view(torch.uint8).numpy()
    try:
        view = memoryview(buffer)
    except TypeError as exc:
        raise InvalidArgument(f"{type(buffer).__name__} is not a buffer") from exc
    if not view.contiguous:
        raise InvalidArgument("buffer is not contiguous")
    return view.cast("B") if view.format != "B" or view.ndim != 1 else view


def checked_keys(keys: Sequence[bytes]) -> list[bytes]:
    """The keys as bytes (bytearray and memoryview converted), each checked."""
    out = [bytes(k) if isinstance(k, (bytearray, memoryview)) else k for k in keys]
    for k in out:
        check_key(k)
    return out
