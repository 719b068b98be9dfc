"""``pdlink.Instance(kv_buffers=[[layer 0, layer 1, ...], ...])``: one buffer per layer per rank, each its
own numpy allocation (as vLLM's GPU runner allocates one tensor per layer), registered one region per
layer. A producer and a consumer in this process (tcp) move held blocks P2/D2 and P1/D2 (head split);
every element of every pulled block is compared, and the blocks nobody pulled keep the sentinel. The
refusals name the rank and layer; CUDA tensors given per layer ask for the cuda backend as one region
per rank does.

The package is the one ``pip install`` put into the build tree (pypi.pdlink_pip_install).
"""
from __future__ import annotations

import os
import sys
from typing import Any, List, Tuple

import numpy as np
import pytest

import pdlink

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools"))
from free_ports import free_range  # noqa: E402

L, BS, HD, NUM_BLOCKS, NBLK, HEADS = 3, 4, 8, 8, 3, 4
SENTINEL = 0xBEEF


def geometry() -> pdlink.Geometry:
    return pdlink.Geometry(num_layers=L, total_kv_heads=HEADS, head_dim=HD, block_size=BS, elem_size=2)


def cfg(role: str, tp: int) -> dict:
    base = free_range(2 * tp)
    return {"kv_connector": "PdlinkConnector", "kv_role": role,
            "kv_connector_extra_config": {"host_ip": "127.0.0.1", "handshake_port": base, "notify_port": base + tp,
                                          "read_mode": True, "backend": "tcp", "defer_timeout": 60,
                                          "transfer_timeout": 30}}


def layer_arrays(tp: int) -> List[List[np.ndarray]]:
    """Per rank, L arrays [2 (K, V), blocks, heads of the rank, BS, HD] of uint16, each allocated apart."""
    geo = geometry()
    out = []
    for r in range(tp):
        layer_len = pdlink.kv_region_len(geo, tp, NUM_BLOCKS, r) // L
        per = []
        for _ in range(L):
            a = np.full((2, NUM_BLOCKS, HEADS // tp, BS, HD), SENTINEL, dtype=np.uint16)
            assert a.nbytes == layer_len
            per.append(a)
            np.zeros(1000, dtype=np.uint8)  # keep the next layer's allocation from following this one
        out.append(per)
    return out


def make(role: str, tp: int) -> Tuple[pdlink.Instance, List[List[np.ndarray]]]:
    arrays = layer_arrays(tp)
    inst = pdlink.Instance(cfg(role, tp), geometry(), tp_size=tp, num_blocks=NUM_BLOCKS, kv_buffers=arrays)
    return inst, arrays


def pattern(layer: int, kv: int, heads: np.ndarray) -> np.ndarray:
    b = np.arange(NBLK, dtype=np.uint32)[:, None, None, None]
    h = heads.astype(np.uint32)[None, :, None, None]
    t = np.arange(BS, dtype=np.uint32)[None, None, :, None]
    d = np.arange(HD, dtype=np.uint32)[None, None, None, :]
    lk = np.uint32((((layer + 1) * 0x85EBCA77) ^ (kv * 0xC2B2AE3D)) & 0xFFFFFFFF)  # Python ints: no overflow warning
    x = lk ^ (h * np.uint32(0x27D4EB2F)) ^ ((b * BS + t) * np.uint32(0x165667B1)) ^ (d * np.uint32(0xD3A2646C))
    x ^= x >> np.uint32(15)
    v = (x & np.uint32(0xFFFF)).astype(np.uint16)
    v[v == SENTINEL] = 0
    return v


def heads_of(tp: int, r: int) -> np.ndarray:
    n = HEADS // tp
    return np.arange(r * n, (r + 1) * n)


@pytest.mark.parametrize("P,D", [(2, 2), (1, 2), (2, 1)], ids=["P2-D2", "P1-D2", "P2-D1"])
def test_per_layer_host_buffers_pull(P: int, D: int) -> None:
    p, parr = make("kv_producer", P)
    c, carr = make("kv_consumer", D)
    try:
        # The instance's layers are the caller's arrays, not copies.
        for r in range(D):
            for layer in range(L):
                view = np.frombuffer(c.kv_layer(r, layer), dtype=np.uint16)
                assert view.ctypes.data == carr[r][layer].ctypes.data
        ids = p.alloc_blocks(NBLK)
        for r in range(P):
            for layer in range(L):
                for kv in range(2):
                    parr[r][layer][kv, ids] = pattern(layer, kv, heads_of(P, r))
        p.hold("tx-py-layers", ids)
        skip = c.alloc_blocks(2)
        cids = c.alloc_blocks(NBLK)
        with c.pull(p.params("tx-py-layers", ids), cids) as pull:
            assert pull.wait(60) is True
            moved = pull.bytes
        checked = 0
        for r in range(D):
            for layer in range(L):
                for kv in range(2):
                    got = carr[r][layer][kv, cids]
                    bad = int(np.count_nonzero(got != pattern(layer, kv, heads_of(D, r))))
                    assert bad == 0, f"rank {r} layer {layer} kv {kv}: {bad} elements differ"
                    checked += got.nbytes
                others = [b for b in range(NUM_BLOCKS) if b not in cids]
                assert np.all(carr[r][layer][:, others] == SENTINEL), f"rank {r} layer {layer}: another block changed"
        assert checked == moved
        c.free_blocks(skip)
    finally:
        c.close()
        p.close()


def test_per_layer_refusals() -> None:
    arrays = layer_arrays(2)
    with pytest.raises(pdlink.InvalidError, match=r"kv_buffers\[1\]: 2 layer buffers for 3 layers"):
        pdlink.Instance(cfg("kv_producer", 2), geometry(), tp_size=2, num_blocks=NUM_BLOCKS,
                        kv_buffers=[arrays[0], arrays[1][:2]])
    with pytest.raises(pdlink.InvalidError, match=r"per-layer lists and single buffers mixed"):
        pdlink.Instance(cfg("kv_producer", 2), geometry(), tp_size=2, num_blocks=NUM_BLOCKS,
                        kv_buffers=[arrays[0], arrays[1][0]])
    short = list(arrays[1])
    short[2] = short[2][:, :NUM_BLOCKS - 1]
    with pytest.raises(pdlink.InvalidError, match=r"kv_buffers\[1\]\[2\]: needs a writable C-contiguous"):
        pdlink.Instance(cfg("kv_producer", 2), geometry(), tp_size=2, num_blocks=NUM_BLOCKS,
                        kv_buffers=[arrays[0], arrays[1][:2] + [arrays[1][2][:, :, :, :, :4]]])
    short[2] = np.ascontiguousarray(short[2])
    with pytest.raises(pdlink.InvalidError, match=r"instance rank 1 layer 2: caller KV region .* bytes, but a layer "
                                                 r"needs"):
        pdlink.Instance(cfg("kv_producer", 2), geometry(), tp_size=2, num_blocks=NUM_BLOCKS,
                        kv_buffers=[arrays[0], short])


class FakeCudaLayer:
    def __init__(self, ptr: int, nbytes: int) -> None:
        self._ptr, self.nbytes = ptr, nbytes
        self.device = type("Dev", (), {"type": "cuda", "index": 0})()

    def data_ptr(self) -> int:
        return self._ptr

    def is_contiguous(self) -> bool:
        return True


def test_per_layer_cuda_tensors_ask_for_the_cuda_backend() -> None:
    n = pdlink.kv_region_len(geometry(), 2, NUM_BLOCKS, 0) // L
    bufs = [[FakeCudaLayer(0x7f0000000000 + (r * 8 + 3 * l) * (1 << 24), n) for l in range(L)] for r in range(2)]
    c = cfg("kv_producer", 2)
    del c["kv_connector_extra_config"]["backend"]  # no backend named: CUDA buffers pick cuda
    with pytest.raises(pdlink.PdlinkError) as ei:
        pdlink.Instance(c, geometry(), tp_size=2, num_blocks=NUM_BLOCKS, kv_buffers=bufs)
    assert ei.value.status_name == "PDL_ERR_UNSUPPORTED"
    assert str(ei.value).startswith("kv_buffers on cuda:0 (backend cuda): ")
    assert "no CUDA driver" in str(ei.value)
