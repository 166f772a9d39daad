"""Buffers and keys as the flows take them: addresses, flat byte views, checked keys.

What a caller hands the client (bytes, numpy arrays, torch tensors, any contiguous
buffer) becomes an address and a byte view here, once, before any step is yielded; a
buffer the engine cannot address is refused with an InvalidArgument that says why.

A tensor on a GPU (with a CUDA build of the Transfer Engine) has no host view: its
"view" is the flat uint8 tensor itself, which supports what the flows ask of a view
(`nbytes`, slicing) and is checksummed on the GPU (kvstore.checksum). Its address range
is remembered in `DEVICE_MEMORY`, so that the same-host path, which copies with the
CPU, never takes it.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from kvstore.devices import cuda_build_hint, engine_devices
from kvstore.errors import MAX_KEY_BYTES, InvalidArgument, check_key


class DeviceMemory:
    """Address ranges of registered GPU memory, process-wide (addresses are)."""

    __slots__ = ("spans",)

    def __init__(self) -> None:
        self.spans: list[tuple[int, int]] = []

    def __bool__(self) -> bool:
        return bool(self.spans)

    def add(self, addr: int, nbytes: int) -> None:
        self.spans.append((addr, addr + nbytes))

    def remove(self, addr: int, nbytes: int) -> None:
        self.spans = [r for r in self.spans if r != (addr, addr + nbytes)]

    def covers(self, addr: int, nbytes: int) -> bool:
        return any(lo < addr + nbytes and addr < hi for lo, hi in self.spans)


DEVICE_MEMORY = DeviceMemory()


@dataclass(slots=True)
class Dest:
    """Where one object's bytes come from or land: registered memory."""

    addr: int
    view: memoryview
    # Bytes after the view that are the caller's to write (registered, unused): a put's
    # record goes there, so that it moves with the value as one transfer.
    tail: int = 0


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


def is_tensor(buffer: Any) -> bool:
    return hasattr(buffer, "data_ptr") and hasattr(buffer, "element_size")


def on_device(buffer: Any) -> bool:
    """Whether `buffer` is a tensor outside host memory."""
    return is_tensor(buffer) and buffer.device.type != "cpu"


def buffer_address(buffer: Any) -> tuple[int, int]:
    """(address, length in bytes) of a contiguous buffer or torch tensor the engine can
    move (a GPU tensor only with a CUDA build of the engine)."""
    if is_tensor(buffer):
        if not buffer.is_contiguous():
            raise InvalidArgument("tensor is not contiguous; pass a contiguous tensor or slice")
        kind = buffer.device.type
        if kind not in engine_devices():
            if kind == "cuda":
                raise InvalidArgument(f"tensors on {buffer.device} need the CUDA Transfer "
                                      f"Engine build: {cuda_build_hint()}")
            raise InvalidArgument(f"tensors on {buffer.device} cannot be moved by the Transfer "
                                  "Engine (it moves host and CUDA memory); copy the tensor "
                                  "to the CPU or a CUDA device first")
        return int(buffer.data_ptr()), int(buffer.numel() * buffer.element_size())
    addr, view = address_and_view(buffer)
    return addr, view.nbytes


def address_and_view(buffer: Any) -> tuple[int, memoryview]:
    """The address and a flat byte view of a contiguous buffer or tensor (for a GPU
    tensor, the flat uint8 tensor: see the module's docstring)."""
    if is_tensor(buffer):
        return buffer_address(buffer)[0], byte_view(buffer)
    view = byte_view(buffer)
    try:  # a writable buffer: the quick way
        return ctypes.addressof(ctypes.c_char.from_buffer(view)), view
    except (TypeError, ValueError):  # read-only or empty
        return int(np.frombuffer(view, dtype=np.uint8).ctypes.data), view


def byte_view(buffer: Any) -> memoryview:
    """A flat byte view of a buffer-protocol object or a torch tensor."""
    if type(buffer) is bytes:  # the usual value: flat, contiguous, format "B"
        return memoryview(buffer)
    if hasattr(buffer, "data_ptr") and hasattr(buffer, "numpy"):
        import torch

        flat = buffer.detach().reshape(-1).view(torch.uint8)
        if flat.device.type != "cpu":
            dev: Any = flat  # the device view (module docstring)
            return dev
        buffer = flat.numpy()
    try:
        view = memoryview(buffer)
    except TypeError as exc:
        raise InvalidArgument(f"{type(buffer).__name__} is not a buffer") from exc
    if not view.contiguous:
        raise InvalidArgument("buffer is not contiguous")
    return view.cast("B") if view.format != "B" or view.ndim != 1 else view


def checked_keys(keys: Sequence[bytes]) -> list[bytes]:
    """The keys as bytes (bytearray and memoryview converted), each checked."""
    out = list(keys)
    # The usual batch, bytes of usable lengths, in one pass (check_key says why not).
    if all(type(k) is bytes and 0 < len(k) <= MAX_KEY_BYTES for k in out):
        return out
    out = [bytes(k) if isinstance(k, (bytearray, memoryview)) else k for k in out]
    for k in out:
        check_key(k)
    return out
