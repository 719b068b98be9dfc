"""``pdlink.Instance(kv_buffers=[CUDA tensors])`` with backend ``tcp``: device KV staged through pinned host
memory, on a host without a GPU. ``PDLINK_TEST_CUDA_FAKE=1`` gives the engines the test CUDA driver
(src/engine/cudadrv_fake.c), whose device memory is a PROT_NONE mapping between two read-only guard pages
and whose copies go through /proc/self/mem; the tensors here are such mappings behind the attributes
pdlink reads of a torch CUDA tensor, so a CPU access by pdlink kills this process. A producer and a
consumer in this process, KV on the device on both sides (one region per rank, or one per layer), move
held blocks P2/D2, P1/D2 and P2/D1 (head splits); every element of every pulled block is read back
through /proc/self/mem and compared, and the blocks nobody pulled keep the sentinel.

The package is the one ``pip install`` put into the build tree (pypi.pdlink_pip_install).
"""
from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass
from typing import Any, List, Optional, Tuple

import numpy as np
import pytest

os.environ["PDLINK_TEST_CUDA_FAKE"] = "1"  # read when each engine is created

import pdlink  # noqa: E402

# The per-layer test's geometry and config (backend tcp): the same cache, here in device memory.
from test_pdlink_layer_buffers import (BS, HD, HEADS, L, NBLK, NUM_BLOCKS, SENTINEL, cfg, geometry,  # noqa: E402
                                       heads_of, pattern)
PAGE = os.sysconf("SC_PAGE_SIZE")

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
PROT_NONE, PROT_READ, MAP_PRIVATE, MAP_ANONYMOUS = 0, 1, 0x02, 0x20


@dataclass
class Dev:
    type: str = "cuda"
    index: Optional[int] = 0

    def __str__(self) -> str:
        return f"{self.type}:{self.index}"


class DeviceMemory:
    """A test-driver allocation (the layout cuMemAlloc has in cudadrv_fake.c): PROT_NONE between two
    read-only guard pages, so it is one mapping of its own; read and written through /proc/self/mem."""

    def __init__(self, nbytes: int) -> None:
        self.size = (nbytes + PAGE - 1) // PAGE * PAGE
        base = _libc.mmap(None, self.size + 2 * PAGE, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0)
        assert base not in (None, ctypes.c_void_p(-1).value), f"mmap: errno {ctypes.get_errno()}"
        self._base = base
        self.addr = base + PAGE
        assert _libc.mprotect(self.addr, self.size, PROT_NONE) == 0

    def free(self) -> None:
        _libc.munmap(self._base, self.size + 2 * PAGE)


class FakeCudaTensor:
    """What pdlink reads of a contiguous torch CUDA tensor of uint16: data_ptr(), nbytes, device; the
    test reads and writes it as a numpy array of `shape` through /proc/self/mem."""

    def __init__(self, addr: int, shape: Tuple[int, ...], mem: "_Mem") -> None:
        self._addr = addr
        self.shape = shape
        self.nbytes = int(np.prod(shape)) * 2
        self.device = Dev()
        self._mem = mem

    def data_ptr(self) -> int:
        return self._addr

    def is_contiguous(self) -> bool:
        return True

    def get(self) -> np.ndarray:
        return np.frombuffer(os.pread(self._mem.fd, self.nbytes, self._addr), dtype=np.uint16).reshape(self.shape)

    def put(self, a: np.ndarray) -> None:
        assert os.pwrite(self._mem.fd, np.ascontiguousarray(a, dtype=np.uint16).tobytes(), self._addr) == self.nbytes


class _Mem:
    def __init__(self) -> None:
        self.fd = os.open("/proc/self/mem", os.O_RDWR)
        self.allocs: List[DeviceMemory] = []

    def alloc(self, nbytes: int) -> DeviceMemory:
        m = DeviceMemory(nbytes)
        self.allocs.append(m)
        return m

    def close(self) -> None:
        for m in self.allocs:
            m.free()
        os.close(self.fd)



def device_layers(mem: _Mem, tp: int, per_layer: bool) -> List[List[FakeCudaTensor]]:
    """Per rank, L tensors [2 (K, V), blocks, heads of the rank, BS, HD] of uint16 on the device, each
    filled with the sentinel: one allocation per layer, or one per rank holding its layers in order."""
    shape = (2, NUM_BLOCKS, HEADS // tp, BS, HD)
    layer_len = int(np.prod(shape)) * 2
    out = []
    for r in range(tp):
        assert pdlink.kv_region_len(geometry(), tp, NUM_BLOCKS, r) == L * layer_len
        region = None if per_layer else mem.alloc(L * layer_len)
        per = []
        for layer in range(L):
            addr = mem.alloc(layer_len).addr if per_layer else region.addr + layer * layer_len
            t = FakeCudaTensor(addr, shape, mem)
            t.put(np.full(shape, SENTINEL, dtype=np.uint16))
            per.append(t)
        out.append(per)
    return out


class RankRegion(FakeCudaTensor):
    """A rank's whole region (its layers one after the other), as kv_buffers takes one buffer per rank."""

    def __init__(self, layers: List[FakeCudaTensor], mem: _Mem) -> None:
        super().__init__(layers[0].data_ptr(), (len(layers),) + layers[0].shape, mem)


def make(mem: _Mem, role: str, tp: int, per_layer: bool) -> Tuple[pdlink.Instance, List[List[FakeCudaTensor]]]:
    layers = device_layers(mem, tp, per_layer)
    bufs: List[Any] = layers if per_layer else [RankRegion(per, mem) for per in layers]
    inst = pdlink.Instance(cfg(role, tp), geometry(), tp_size=tp, num_blocks=NUM_BLOCKS, kv_buffers=bufs)
    assert (inst.backend, inst.mem_type, inst.device) == ("tcp", "cuda", 0)
    return inst, layers


@pytest.mark.parametrize("per_layer", [False, True], ids=["region", "layers"])
@pytest.mark.parametrize("P,D", [(2, 2), (1, 2), (2, 1)], ids=["P2-D2", "P1-D2", "P2-D1"])
def test_cuda_tensors_over_tcp_pull(P: int, D: int, per_layer: bool) -> None:
    mem = _Mem()
    p, parr = make(mem, "kv_producer", P, per_layer)
    c, carr = make(mem, "kv_consumer", D, per_layer)
    try:
        ids = p.alloc_blocks(NBLK)
        for r in range(P):
            for layer in range(L):
                a = parr[r][layer].get().copy()
                for kv in range(2):
                    a[kv, ids] = pattern(layer, kv, heads_of(P, r))
                parr[r][layer].put(a)
        p.hold("tx-py-staged", ids)
        skip = c.alloc_blocks(2)
        cids = c.alloc_blocks(NBLK)
        with c.pull(p.params("tx-py-staged", ids), cids) as pull:
            assert pull.wait(60) is True
            moved = pull.bytes
        checked = 0
        for r in range(D):
            for layer in range(L):
                a = carr[r][layer].get()
                for kv in range(2):
                    got = a[kv, cids]
                    bad = int(np.count_nonzero(got != pattern(layer, kv, heads_of(D, r))))
                    assert bad == 0, f"rank {r} layer {layer} kv {kv}: {bad} elements differ"
                    checked += got.nbytes
                others = [b for b in range(NUM_BLOCKS) if b not in cids]
                assert np.all(a[:, others] == SENTINEL), f"rank {r} layer {layer}: another block changed"
        assert checked == moved
        c.free_blocks(skip)
    finally:
        c.close()
        p.close()
        mem.close()
