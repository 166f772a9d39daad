"""GPU buffers in the client: what the engine cannot move is refused with a sentence
before anything is registered, and GPU memory never takes the CPU's same-host copy.

No GPU here: a CUDA tensor is stood in for by an object with a tensor's surface (what
the client reads of it), and a `meta` tensor is a real tensor on a device the engine
was not initialised for.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from kvstore import devices
from kvstore.errors import InvalidArgument
from kvstore_client import buffers
from kvstore_client.buffers import DEVICE_MEMORY, DeviceMemory, buffer_address
from kvstore_client.local import LocalSegment
from tests.unit.test_client_data_path import NODE, Rig, _buffers, _slices, _values, rig

__all__ = ["rig"]  # the data-path tests' rig (a fake engine and master), as a fixture here


class _Device:
    def __init__(self, kind: str, index: int = 0) -> None:
        self.type = kind
        self.index = index

    def __str__(self) -> str:
        return f"{self.type}:{self.index}"


class FakeCudaTensor:
    def __init__(self, nbytes: int = 4096, contiguous: bool = True) -> None:
        self.device = _Device("cuda")
        self._n = nbytes
        self._contiguous = contiguous

    def data_ptr(self) -> int:
        return 0x7F0000000000

    def element_size(self) -> int:
        return 1

    def numel(self) -> int:
        return self._n

    def is_contiguous(self) -> bool:
        return self._contiguous


def _with_devices(monkeypatch: pytest.MonkeyPatch, kinds: set[str]) -> None:
    monkeypatch.setattr(buffers, "engine_devices", lambda: frozenset(kinds))


def test_a_cuda_tensor_with_the_cpu_build_is_refused_naming_the_build(
        monkeypatch: pytest.MonkeyPatch) -> None:
    _with_devices(monkeypatch, {"cpu"})
    with pytest.raises(InvalidArgument, match=r"CUDA Transfer Engine build.*te-cuda13"):
        buffer_address(FakeCudaTensor())


def test_a_cuda_tensor_with_a_cuda_build_is_addressed(monkeypatch: pytest.MonkeyPatch) -> None:
    _with_devices(monkeypatch, {"cpu", "cuda"})
    assert buffer_address(FakeCudaTensor(8192)) == (0x7F0000000000, 8192)


def test_a_non_contiguous_gpu_slice_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    _with_devices(monkeypatch, {"cpu", "cuda"})
    with pytest.raises(InvalidArgument, match="not contiguous"):
        buffer_address(FakeCudaTensor(contiguous=False))


def test_a_tensor_on_a_device_the_engine_does_not_move_is_refused() -> None:
    t = torch.empty(1024, dtype=torch.uint8, device="meta")
    with pytest.raises(InvalidArgument, match="cannot be moved by the Transfer Engine"):
        buffer_address(t)


def test_nothing_is_registered_when_a_buffer_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    from kvstore_client.state import ClientState

    _with_devices(monkeypatch, {"cpu"})
    calls: list[Any] = []

    class Transfer:
        def register(self, addr: int, n: int) -> None:
            calls.append((addr, n))

    st = ClientState.__new__(ClientState)
    st.transfer = Transfer()  # type: ignore[assignment]
    st.regions = buffers.Regions()
    with pytest.raises(InvalidArgument):
        st.register(FakeCudaTensor())
    assert calls == [] and st.regions.spans == [] and not DEVICE_MEMORY

    _with_devices(monkeypatch, {"cpu", "cuda"})
    try:
        st.register(FakeCudaTensor(4096))
        assert calls == [(0x7F0000000000, 4096)]
        assert DEVICE_MEMORY.covers(0x7F0000000000 + 100, 8)
    finally:
        st.transfer = type("T", (), {"unregister": lambda self, a: None})()  # type: ignore[assignment]
        st.unregister(FakeCudaTensor(4096))
    assert not DEVICE_MEMORY


def test_device_memory_covers_overlaps_only() -> None:
    m = DeviceMemory()
    m.add(1000, 100)
    assert m.covers(1050, 10) and m.covers(990, 20) and not m.covers(1100, 10)
    assert not m.covers(900, 100)


def test_the_build_is_read_off_the_installed_engine() -> None:
    # These machines carry the CPU build (mooncake-transfer-engine-non-cuda).
    devices.engine_devices.cache_clear()
    assert devices.engine_devices() == frozenset({"cpu"})


def test_gpu_memory_moves_through_the_engine_even_to_a_same_host_node(rig: Rig) -> None:
    """The same-host path copies with the CPU (memmove): on GPU memory that would crash
    the process, so a batch touching registered GPU memory goes through the engine."""
    node = rig.node
    rig.local.segment = LocalSegment(NODE, node.base, node.mem.nbytes, node.base, None)  # type: ignore[arg-type]
    n, size = 4, 4096
    keys = [f"g{i}".encode() for i in range(n)]
    values = _values(n, size, seed=5)
    src, dst = _buffers(rig, values, size)
    DEVICE_MEMORY.add(int(dst.ctypes.data), dst.nbytes)  # dst stands for GPU memory
    try:
        assert rig.client.put_from(keys, _slices(src, n, size)) == [None] * n
        local_puts = rig.client.stats.local_transfers
        assert local_puts >= n  # host memory: memcpy
        rig.trace.clear()
        assert rig.client.get_into(keys, _slices(dst, n, size)) == [None] * n
        assert rig.client.stats.local_transfers == local_puts  # no CPU copy into "GPU"
        assert any(e[0] == "start" for e in rig.trace) or rig.transfer.blocking_calls > 0
        assert dst.tobytes() == b"".join(values)
    finally:
        DEVICE_MEMORY.remove(int(dst.ctypes.data), dst.nbytes)
