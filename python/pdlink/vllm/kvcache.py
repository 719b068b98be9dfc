"""vLLM's per-layer KV cache tensors as what a pdlink instance registers: one region (layers one after the
other, as vLLM's CPU backend allocates them, seen with tools/vllm/probe_connector.py) or one region per
layer (layers at unrelated addresses, as vLLM's GPU runner allocates them), and the geometry pdlink
reads from their shape and strides. CPU caches are vLLM CPU's fused layout; CUDA caches are
flash-attention's or FlashInfer's, NHD or HND, registered as device memory with the cuda backend
(docs/gpu.md). Pure functions over duck-typed tensors (tests pass numpy-backed fakes)."""
from __future__ import annotations

import ctypes
import os
import re
from typing import Any, Dict, Mapping, Optional, Tuple

_LAYER_INDEX = re.compile(r"(?:^|\.)(\d+)(?:\.|$)")


def layer_index(name: str) -> int:
    """The layer number in a vLLM layer name (``model.layers.7.self_attn.attn`` -> 7)."""
    m = _LAYER_INDEX.search(name)
    if m is None:
        raise ValueError(f"PdlinkConnector: KV cache layer name {name!r} has no layer number")
    return int(m.group(1))


# vLLM's GPU attention backends, per layer: flash-attention's (2, num_blocks, block_size, kv_heads,
# head_dim) and FlashInfer's (num_blocks, 2, block_size, kv_heads, head_dim), both NHD; with
# VLLM_KV_CACHE_LAYOUT=HND the same logical shape over memory ordered (.., kv_heads, block_size, ..),
# i.e. a permuted view. The physical order of the dims maps onto pdlink's geometry: K/V outermost is
# kv_separate (all K blocks, then all V blocks), blocks outermost alternates K and V per block; heads
# before tokens is HND.
_GPU_ORDERS = {
    ("kv", "blk", "tok", "head", "dim"): (True, "nhd"),
    ("kv", "blk", "head", "tok", "dim"): (True, "hnd"),
    ("blk", "kv", "tok", "head", "dim"): (False, "nhd"),
    ("blk", "kv", "head", "tok", "dim"): (False, "hnd"),
}


def gpu_layout(shape: Tuple[int, ...], stride: Tuple[int, ...], kv_heads: int,
               kv_first: Optional[bool] = None) -> Dict[str, Any]:
    """pdlink's geometry of one layer of vLLM's GPU KV cache from the tensor's shape and strides (in
    elements): ``num_blocks``, ``block_size``, ``heads``, ``head_dim``, ``kv_separate``, ``order``.
    ``kv_heads``: this rank's KV heads, which tells the heads dim from the tokens dim when the logical
    shape alone cannot; ``kv_first``: True for flash-attention's ``(2, num_blocks, ...)``, False for
    FlashInfer's ``(num_blocks, 2, ...)``, None to tell from the shape (refused when both dims are 2).
    Raises ValueError naming what does not fit."""
    if len(shape) != 5:
        raise ValueError(f"shape {shape}: expected vLLM's GPU layout, 5 dims (2, num_blocks, block_size, "
                         "kv_heads, head_dim) or (num_blocks, 2, block_size, kv_heads, head_dim)")
    if kv_first is None:
        if shape[0] == 2 and shape[1] == 2:
            raise ValueError(f"shape {shape}: K/V dim ambiguous (num_blocks 2); pass kv_first")
        kv_first = shape[0] == 2
    if shape[0 if kv_first else 1] != 2:
        raise ValueError(f"shape {shape}: no K/V dim of size 2 where the backend puts it")
    names = ("kv", "blk", "tok", "head", "dim") if kv_first else ("blk", "kv", "tok", "head", "dim")
    if shape[3] != kv_heads:
        raise ValueError(f"shape {shape}: {shape[3]} KV heads, expected {kv_heads} for this rank")
    # Physical order: the dims by decreasing stride; a dim of size 1 (one head per rank) has no
    # meaningful stride and takes the place the known layouts give it.
    big = sorted((i for i in range(5) if shape[i] > 1), key=lambda i: -stride[i])
    expect = 1
    for i in reversed(big):
        if stride[i] != expect:
            raise ValueError(f"shape {shape} strides {stride}: not one dense region (a sliced or padded view)")
        expect *= shape[i]
    order_big = [names[i] for i in big]
    # With one head per rank NHD and HND are the same bytes; the name must still match the peer's
    # (handshakes compare layouts), so take vLLM's own setting.
    prefer = "hnd" if os.environ.get("VLLM_KV_CACHE_LAYOUT", "").upper() == "HND" else "nhd"
    cands = sorted(_GPU_ORDERS, key=lambda c: _GPU_ORDERS[c][1] != prefer)
    phys = next((cand for cand in cands if [n for n in cand if shape[names.index(n)] > 1] == order_big),
                tuple(order_big))
    got = _GPU_ORDERS.get(phys)
    if got is None:
        raise ValueError(f"shape {shape} strides {stride}: memory order {phys} is none of vLLM's NHD/HND layouts")
    kv_separate, order = got
    return {"num_blocks": shape[names.index("blk")], "block_size": shape[2], "heads": shape[3],
            "head_dim": shape[4], "kv_separate": kv_separate, "order": order}


def device_kind(t: Any) -> str:
    """A tensor's device type ("cpu", "cuda", ...), from a torch device or its text form ("cuda:0")."""
    return getattr(t.device, "type", None) or str(t.device).partition(":")[0]


def kv_region(kv_caches: Mapping[str, Any], kv_heads: Optional[int] = None) -> Tuple[Any, Dict[str, Any]]:
    """Check that vLLM's per-layer KV tensors are all alike; return what to register and the geometry.
    Layers in order and adjacent give one region (a writable buffer over it for CPU tensors -- it borrows
    the tensors' memory: keep them alive --, for CUDA tensors a device pointer holder); otherwise a list
    of such regions, one per layer in layer order (``Instance(kv_buffers=[[...]])``). CPU: vLLM CPU's fused shape ``(num_blocks, kv_heads, block_size,
    2*head_dim)``. CUDA: flash-attention's or FlashInfer's layout, NHD or HND (:func:`gpu_layout`;
    ``kv_heads``, this rank's heads, is needed). Raises ValueError naming the first layer that breaks
    the model."""
    if not kv_caches:
        raise ValueError("PdlinkConnector: vLLM registered no KV cache tensors")
    layers = sorted(kv_caches.items(), key=lambda kv: layer_index(kv[0]))
    first_name, first = layers[0]
    shape = tuple(first.shape)
    device = device_kind(first)
    if device == "cuda":
        try:
            stride = tuple(first.stride()) if hasattr(first, "stride") else ()
            g = gpu_layout(shape, stride, kv_heads if kv_heads is not None else shape[-2])
        except ValueError as e:
            raise ValueError(f"PdlinkConnector: layer {first_name}: {e}") from None
        g["fused"] = False
    elif device == "cpu":
        if len(shape) != 4 or shape[3] % 2:
            raise ValueError(f"PdlinkConnector: layer {first_name} has shape {shape}; expected vLLM CPU's "
                             "(num_blocks, kv_heads, block_size, 2*head_dim) with K and V fused per token")
        g = {"num_blocks": shape[0], "heads": shape[1], "block_size": shape[2], "head_dim": shape[3] // 2,
             "kv_separate": True, "order": "hnd", "fused": True}
    else:
        raise ValueError(f"PdlinkConnector: layer {first_name} is on {first.device}; pdlink moves CPU and CUDA "
                         "memory")
    base = first.data_ptr()
    layer_len = first.numel() * first.element_size()
    adjacent = True
    for i, (name, t) in enumerate(layers):
        if str(t.device) != str(first.device):
            raise ValueError(f"PdlinkConnector: layer {name} is on {t.device}, layer {first_name} on "
                             f"{first.device}")
        dense = t.is_contiguous() if device == "cpu" else tuple(t.stride()) == tuple(first.stride())
        if tuple(t.shape) != shape or t.dtype != first.dtype or not dense:
            raise ValueError(f"PdlinkConnector: layer {name} is {tuple(t.shape)} {t.dtype} contiguous="
                             f"{t.is_contiguous()}, layer {first_name} {shape} {first.dtype}: pdlink needs "
                             "every layer alike and contiguous")
        adjacent = adjacent and t.data_ptr() == base + i * layer_len
    g.update(num_layers=len(layers), elem_size=first.element_size(), layer_len=layer_len)
    if not adjacent:
        if device == "cuda":
            return [_DeviceRegion(t.data_ptr(), layer_len, t.device) for _, t in layers], g
        return [(ctypes.c_char * layer_len).from_address(t.data_ptr()) for _, t in layers], g
    total = layer_len * len(layers)
    if device == "cuda":
        return _DeviceRegion(base, total, first.device), g
    return (ctypes.c_char * total).from_address(base), g


class _DeviceRegion:
    """The whole region of a rank's CUDA layers (or one layer's), shaped like what pdlink.Instance takes from a torch
    CUDA tensor (``data_ptr``, ``nbytes``, ``device``, ``is_contiguous``); it borrows the tensors'
    memory, which the worker keeps alive."""

    def __init__(self, ptr: int, nbytes: int, device: Any) -> None:
        self._ptr = ptr
        self.nbytes = nbytes
        self.device = device

    def data_ptr(self) -> int:
        return self._ptr

    def is_contiguous(self) -> bool:
        return True
