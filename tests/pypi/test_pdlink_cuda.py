"""pdlink with CUDA tensors where there is no GPU (this machine, CI): the type dispatch of
``pdlink.Instance(kv_buffers=...)`` (a tensor-like object whose ``device.type`` is "cuda" is registered
as CUDA memory on the cuda backend, which then fails with the driver-missing message; host buffers are
unchanged), the refusals, and ``pdlink.vllm``'s reading of vLLM's GPU KV layouts. Nothing here
dereferences the fake device pointers: creation stops at the engine or at the memory-type check. The
real transfer runs in tools/gpu-check's Python stage on a GPU."""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import pytest

import pdlink
from pdlink.vllm.kvcache import gpu_layout, kv_region

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools"))
from free_ports import free_range  # noqa: E402 (the tests' one port rule: outside the ephemeral range)

# The engine loads the CUDA driver at run time; point it at nothing so the refusal is the same on a
# host that has a driver but no GPU.
os.environ["PDLINK_LIBCUDA"] = "/nonexistent/libcuda.so.1"

GEO = pdlink.Geometry(num_layers=2, total_kv_heads=4, head_dim=8, block_size=4, elem_size=2, order="nhd")


@dataclass
class Dev:
    type: str
    index: Optional[int] = 0

    def __str__(self) -> str:
        return self.type if self.index is None else f"{self.type}:{self.index}"


class FakeCudaTensor:
    """What pdlink reads of a torch CUDA tensor: data_ptr(), nbytes, device.type/.index, is_contiguous(),
    shape and stride() (elements). The address is never dereferenced."""

    def __init__(self, ptr: int, shape: Tuple[int, ...], stride: Optional[Tuple[int, ...]] = None,
                 elem: int = 2, device: Any = None) -> None:
        self._ptr = ptr
        self.shape = shape
        self._stride = stride or tuple(int(np.prod(shape[i + 1:])) for i in range(len(shape)))
        self._elem = elem
        self.device = device if device is not None else Dev("cuda", 0)
        self.dtype = "float16"
        self.nbytes = int(np.prod(shape)) * elem

    def data_ptr(self) -> int:
        return self._ptr

    def numel(self) -> int:
        return int(np.prod(self.shape))

    def element_size(self) -> int:
        return self._elem

    def stride(self) -> Tuple[int, ...]:
        return self._stride

    def is_contiguous(self) -> bool:
        return self._stride == tuple(int(np.prod(self.shape[i + 1:])) for i in range(len(self.shape)))


def cfg(backend: Optional[str] = None, base: int = 0) -> Dict[str, Any]:
    e: Dict[str, Any] = {"host_ip": "127.0.0.1", "handshake_port": base or free_range(16), "read_mode": True}
    e["notify_port"] = e["handshake_port"] + 8
    if backend is not None:
        e["backend"] = backend
    return {"kv_connector": "PdlinkConnector", "kv_role": "kv_producer", "kv_connector_extra_config": e}


def device_buffers(tp: int = 2, device: Any = None) -> List[FakeCudaTensor]:
    n = pdlink.kv_region_len(GEO, tp, 8, 0)
    return [FakeCudaTensor(0x7f0000000000 + r * (1 << 30), (n // 2,), device=device) for r in range(tp)]


def test_cuda_tensors_ask_for_the_cuda_backend_and_say_the_driver_is_missing() -> None:
    with pytest.raises(pdlink.PdlinkError) as ei:
        pdlink.Instance(cfg(), GEO, tp_size=2, num_blocks=8, kv_buffers=device_buffers())
    e = ei.value
    assert e.status_name == "PDL_ERR_UNSUPPORTED"
    assert not isinstance(e, pdlink.InvalidError)
    msg = str(e)
    assert msg.startswith("kv_buffers on cuda:0 (backend cuda): instance rank 0: engine producer:127.0.0.1:")
    assert "backend cuda: no CUDA driver: dlopen(/nonexistent/libcuda.so.1)" in msg
    assert "needs an NVIDIA GPU and its driver" in msg
    assert msg.endswith("(PDL_ERR_UNSUPPORTED)")


@pytest.mark.parametrize("backend", ["rdma", "xgmi", "cuda"])
def test_backends_that_mean_the_gpu_path(backend: str) -> None:
    with pytest.raises(pdlink.PdlinkError, match=r"\(backend cuda\): .*no CUDA driver"):
        pdlink.Instance(cfg(backend), GEO, tp_size=2, num_blocks=8, kv_buffers=device_buffers())


def test_shm_named_for_device_memory_is_refused() -> None:
    with pytest.raises(pdlink.PdlinkError) as ei:
        pdlink.Instance(cfg("shm"), GEO, tp_size=2, num_blocks=8, kv_buffers=device_buffers())
    assert ei.value.status_name == "PDL_ERR_UNSUPPORTED"
    assert "the KV cache is CUDA memory (kv_mem_type), but kv_connector_extra_config.backend shm moves host " \
           "memory only" in str(ei.value)


def test_tcp_named_for_device_memory_needs_the_driver() -> None:
    """tcp stages CUDA memory through host memory where the driver loads (test_pdlink_staged.py moves it
    with the test driver); here it does not, and the refusal says which key and why."""
    with pytest.raises(pdlink.PdlinkError) as ei:
        pdlink.Instance(cfg("tcp"), GEO, tp_size=2, num_blocks=8, kv_buffers=device_buffers())
    assert ei.value.status_name == "PDL_ERR_UNSUPPORTED"
    msg = str(ei.value)
    assert msg.startswith("kv_buffers on cuda:0 (backend tcp): instance rank 0: kv_mem_type CUDA with "
                          "kv_connector_extra_config.backend tcp: tcp stages CUDA memory through the CUDA driver, "
                          "which did not load")
    assert "install the NVIDIA driver, or keep the KV cache in host memory" in msg


def test_ucx_is_kept_and_refuses_cuda_it_cannot_register() -> None:
    try:
        pdlink.Instance(cfg("ucx"), GEO, tp_size=1, num_blocks=8, kv_buffers=device_buffers(1))
    except pdlink.PdlinkError as e:
        assert e.status_name == "PDL_ERR_UNSUPPORTED", str(e)
        assert "(backend ucx)" in str(e)
    else:
        pytest.fail("a ucx engine without CUDA support registered a CUDA region")


def test_cuda_without_kv_buffers_or_with_host_buffers_is_refused() -> None:
    with pytest.raises(pdlink.PdlinkError, match='backend "cuda" moves GPU memory only, but the KV cache is host '
                                                 r"memory \(the instance's own"):
        pdlink.Instance(cfg("cuda"), GEO, tp_size=1, num_blocks=8)
    host = [np.zeros(pdlink.kv_region_len(GEO, 1, 8, 0), dtype=np.uint8)]
    with pytest.raises(pdlink.PdlinkError, match='backend "cuda" moves GPU memory only, but the KV cache is host '
                                                 'memory; use "tcp" or "shm"'):
        pdlink.Instance(cfg("cuda"), GEO, tp_size=1, num_blocks=8, kv_buffers=host)


def test_mixed_devices_and_other_device_types_are_refused() -> None:
    n = pdlink.kv_region_len(GEO, 2, 8, 0)
    mixed = [np.zeros(n, dtype=np.uint8), device_buffers()[1]]
    with pytest.raises(pdlink.InvalidError, match=r"host and CUDA buffers mixed \(0: host, 1: cuda\)"):
        pdlink.Instance(cfg(), GEO, tp_size=2, num_blocks=8, kv_buffers=mixed)
    two = [device_buffers(device=Dev("cuda", 0))[0], device_buffers(device=Dev("cuda", 1))[1]]
    with pytest.raises(pdlink.InvalidError, match=r"on CUDA devices \[0, 1\]; one instance drives one GPU"):
        pdlink.Instance(cfg(), GEO, tp_size=2, num_blocks=8, kv_buffers=two)
    with pytest.raises(pdlink.InvalidError, match=r"kv_buffers\[0\]: a tensor on xpu:0; pdlink moves host"):
        pdlink.Instance(cfg(), GEO, tp_size=2, num_blocks=8, kv_buffers=device_buffers(device=Dev("xpu", 0)))
    strided = device_buffers()
    strided[1]._stride = (2,)
    with pytest.raises(pdlink.InvalidError, match=r"kv_buffers\[1\]: tensor is not contiguous"):
        pdlink.Instance(cfg(), GEO, tp_size=2, num_blocks=8, kv_buffers=strided)


def test_host_buffers_unchanged() -> None:
    """numpy buffers still take the host path with the configured backend (a full transfer is in
    test_pdlink_package.py); kv_layer views work, and the instance says host."""
    n = pdlink.kv_region_len(GEO, 1, 8, 0)
    buf = np.zeros(n, dtype=np.uint8)
    with pdlink.Instance(cfg("tcp"), GEO, tp_size=1, num_blocks=8, kv_buffers=[buf]) as inst:
        assert (inst.mem_type, inst.device, inst.backend) == ("host", None, "tcp")
        view = np.frombuffer(inst.kv_layer(0, 1), dtype=np.uint8)
        view[:4] = 7
        assert buf[n // 2: n // 2 + 4].tolist() == [7, 7, 7, 7]
        ids = inst.alloc_blocks(2)
        buf[:] = 0xAB
        inst.hold("t-tail", ids, num_tokens=5)       # zero_tail first: 3 of the 2nd block's 4 rows
        assert inst.held_transfers == 1
        g = inst.rank_geometry(0)
        row = g["num_heads"] * g["head_dim"] * g["elem_size"]
        blk = g["block_len"]
        for layer in range(2):
            for half in range(2):      # kv_separate: all K blocks, then all V blocks
                off = layer * g["layer_len"] + half * 8 * blk + ids[1] * blk
                assert (buf[off:off + row] == 0xAB).all()              # the prompt's 5th token stays
                assert (buf[off + row:off + blk] == 0).all()           # rows past the prompt are zeroed
        with pytest.raises(pdlink.InvalidError, match="zero_tail: 9 tokens do not fill 2 blocks of 4"):
            inst.zero_tail(ids, 9)


# ---- vLLM's GPU layouts --------------------------------------------------------------------------

NB, BSZ, H, D = 6, 16, 2, 8


def strides(shape: Tuple[int, ...], perm: Tuple[int, ...]) -> Tuple[int, ...]:
    """Strides of a logical `shape` over memory ordered by `perm` (outermost first)."""
    out = [0] * len(shape)
    s = 1
    for i in reversed(perm):
        out[i] = s
        s *= shape[i]
    return tuple(out)


@pytest.mark.parametrize("name,shape,perm,kv_separate,order", [
    ("flash-attn NHD", (2, NB, BSZ, H, D), (0, 1, 2, 3, 4), True, "nhd"),
    ("flash-attn HND", (2, NB, BSZ, H, D), (0, 1, 3, 2, 4), True, "hnd"),
    ("FlashInfer NHD", (NB, 2, BSZ, H, D), (0, 1, 2, 3, 4), False, "nhd"),
    ("FlashInfer HND", (NB, 2, BSZ, H, D), (0, 1, 3, 2, 4), False, "hnd"),
])
def test_gpu_layouts_map_to_pdlink_geometry(name: str, shape: Tuple[int, ...], perm: Tuple[int, ...],
                                            kv_separate: bool, order: str) -> None:
    g = gpu_layout(shape, strides(shape, perm), kv_heads=H)
    assert g == {"num_blocks": NB, "block_size": BSZ, "heads": H, "head_dim": D, "kv_separate": kv_separate,
                 "order": order}, name


def test_gpu_layout_refusals_and_one_head(monkeypatch: Any) -> None:
    with pytest.raises(ValueError, match="K/V dim ambiguous"):
        gpu_layout((2, 2, BSZ, H, D), strides((2, 2, BSZ, H, D), (0, 1, 2, 3, 4)), kv_heads=H)
    assert gpu_layout((2, 2, BSZ, H, D), strides((2, 2, BSZ, H, D), (0, 1, 2, 3, 4)), kv_heads=H,
                      kv_first=False)["kv_separate"] is False
    with pytest.raises(ValueError, match="not one dense region"):
        gpu_layout((2, NB, BSZ, H, D), (2 * NB * BSZ * H * D * 2, BSZ * H * D * 2, H * D, D, 1), kv_heads=H)
    for bad in ((0, 2, 1, 3, 4), (0, 1, 2, 4, 3)):      # tokens outside blocks; head_dim not innermost
        with pytest.raises(ValueError, match="is none of vLLM's NHD/HND layouts"):
            gpu_layout((2, NB, BSZ, H, D), strides((2, NB, BSZ, H, D), bad), kv_heads=H)
    # K/V inside the blocks of a (2, num_blocks, ...) view is FlashInfer's memory order: block-first.
    assert gpu_layout((2, NB, BSZ, H, D), strides((2, NB, BSZ, H, D), (1, 0, 2, 3, 4)), kv_heads=H) == \
        {"num_blocks": NB, "block_size": BSZ, "heads": H, "head_dim": D, "kv_separate": False, "order": "nhd"}
    with pytest.raises(ValueError, match="3 KV heads, expected 2"):
        gpu_layout((2, NB, BSZ, 3, D), strides((2, NB, BSZ, 3, D), (0, 1, 2, 3, 4)), kv_heads=2)
    one = (2, NB, BSZ, 1, D)     # one head per rank: NHD and HND are the same bytes; vLLM's setting names it
    assert gpu_layout(one, strides(one, (0, 1, 2, 3, 4)), kv_heads=1)["order"] == "nhd"
    monkeypatch.setenv("VLLM_KV_CACHE_LAYOUT", "HND")
    assert gpu_layout(one, strides(one, (0, 1, 2, 3, 4)), kv_heads=1)["order"] == "hnd"


def test_kv_region_of_cuda_layers() -> None:
    shape = (2, NB, BSZ, H, D)
    layer_len = int(np.prod(shape)) * 2
    base = 0x7e0000000000
    caches = {f"model.layers.{i}.self_attn.attn": FakeCudaTensor(base + i * layer_len, shape) for i in range(3)}
    region, g = kv_region(caches, kv_heads=H)
    assert (region.data_ptr(), region.nbytes, str(region.device), region.is_contiguous()) == \
        (base, 3 * layer_len, "cuda:0", True)
    assert g == {"num_blocks": NB, "block_size": BSZ, "heads": H, "head_dim": D, "kv_separate": True,
                 "order": "nhd", "fused": False, "num_layers": 3, "elem_size": 2, "layer_len": layer_len}
    # One allocation per layer (vLLM's GPU runner): one device region per layer, in layer order.
    caches["model.layers.1.self_attn.attn"] = FakeCudaTensor(base + 16 * layer_len, shape)
    regions, g2 = kv_region(caches, kv_heads=H)
    assert g2 == g
    assert [(r.data_ptr(), r.nbytes, str(r.device)) for r in regions] == \
        [(base, layer_len, "cuda:0"), (base + 16 * layer_len, layer_len, "cuda:0"), (base + 2 * layer_len, layer_len, "cuda:0")]
