"""KV memory the caller gives an instance (``kv_buffers``): host buffers (the buffer protocol, torch CPU
tensors) or torch CUDA tensors, one region per rank or one per layer, set into
``pdl_instance_config_t.kv_regions`` / ``kv_layer_regions`` and ``kv_mem_type``."""
from __future__ import annotations

import contextlib
import sys
from dataclasses import dataclass
from typing import Any, List, Mapping, Optional, Sequence, Tuple

from pdlink._pdlink import ffi, lib
from pdlink.errors import InvalidError


@dataclass
class Region:
    """One rank's KV buffer (or one layer's) as pdlink registers it."""
    ptr: Any                   # char * (cffi)
    nbytes: int
    mem_type: str              # "host" or "cuda"
    device: Optional[int]      # the CUDA device index (cuda only)


def _device_of(obj: Any) -> Optional[Tuple[str, Optional[int]]]:
    """``(type, index)`` of a torch tensor's (or a look-alike's) device, e.g. ``("cuda", 0)``; None for
    objects without one (numpy arrays, bytearray, memoryview, mmap: host memory)."""
    if not (hasattr(obj, "data_ptr") and hasattr(obj, "device")):
        return None
    dev = obj.device
    kind = getattr(dev, "type", None)
    if kind is None:                           # a device given as text: "cpu", "cuda:1"
        kind, _, idx = str(dev).partition(":")
        return kind, int(idx) if idx.isdigit() else None
    index = getattr(dev, "index", None)
    return str(kind), None if index is None else int(index)


def _nbytes(obj: Any) -> int:
    n = getattr(obj, "nbytes", None)
    return int(n) if n is not None else int(obj.numel()) * int(obj.element_size())


def buffer_of(obj: Any, rank: int, layer: Optional[int] = None) -> Region:
    """A rank's KV buffer (or, with ``layer``, one layer's): the buffer protocol (numpy, bytearray,
    memoryview, mmap), a torch CPU tensor (through data_ptr; torch tensors lack the buffer protocol) or a
    torch CUDA tensor (``data_ptr()``, ``nbytes``, ``device.index``: registered as device memory, never
    touched by the CPU)."""
    where = f"kv_buffers[{rank}]" if layer is None else f"kv_buffers[{rank}][{layer}]"
    dev = _device_of(obj)
    if dev is not None:
        kind, index = dev
        if kind not in ("cpu", "cuda"):
            raise InvalidError(lib.PDL_ERR_INVALID,
                               f"{where}: a tensor on {obj.device}; pdlink moves host (cpu) and CUDA "
                               "memory only")
        if not obj.is_contiguous():
            raise InvalidError(lib.PDL_ERR_INVALID, f"{where}: tensor is not contiguous")
        if kind == "cuda":
            return Region(ffi.cast("char *", obj.data_ptr()), _nbytes(obj), "cuda", 0 if index is None else index)
        return Region(ffi.cast("char *", obj.data_ptr()), _nbytes(obj), "host", None)
    try:
        buf = ffi.from_buffer("char[]", obj, require_writable=True)
    except (TypeError, BufferError, ValueError) as e:
        raise InvalidError(lib.PDL_ERR_INVALID,
                           f"{where}: needs a writable C-contiguous buffer ({e})") from None
    return Region(buf, len(buf), "host", None)


def _use_device_memory(c: Any, regions: Mapping[Any, Region]) -> Optional[int]:
    """Set the config's memory type from the buffers; for CUDA buffers pick the cuda backend unless the
    config chose one itself (``ucx`` and ``tcp``, which may move CUDA memory, are kept: the C library
    says so when this host's engine cannot; ``shm`` is left for it to refuse). Returns the CUDA device
    index, or None for host memory. Raises :class:`InvalidError` for a mix of host and device buffers or
    several GPUs."""
    kinds = {r.mem_type for r in regions.values()}
    # per-layer buffers are keyed (rank, layer): name them as kv_buffers[rank][layer]
    label = {k: (f"{k[0]}/{k[1]}" if isinstance(k, tuple) else str(k)) for k in regions}
    if kinds == {"host"} or not kinds:
        return None
    if len(kinds) > 1:
        which = ", ".join(f"{label[k]}: {r.mem_type}" for k, r in sorted(regions.items()))
        raise InvalidError(lib.PDL_ERR_INVALID, f"kv_buffers: host and CUDA buffers mixed ({which}); one instance "
                                                "moves one kind of memory")
    devices = sorted({r.device for r in regions.values()})
    if len(devices) > 1:
        raise InvalidError(lib.PDL_ERR_INVALID,
                           f"kv_buffers: on CUDA devices {devices}; one instance drives one GPU (run one instance "
                           "per rank with local_rank, as vLLM's workers do)")
    c.kv_mem_type = lib.PDL_MEM_TYPE_CUDA
    # backend_mapped_from_rdma: no backend key, "rdma" or "xgmi" (upstream's intra-node GPU path).
    if c.conn.backend_mapped_from_rdma:
        c.conn.backend = lib.pdl_backend_parse(b"cuda")
    return devices[0]


def _layer_buffers(c: Any, given: Mapping[int, Any], layered: Mapping[int, bool], num_layers: int,
                   tp_size: int, keep: List[Any]) -> Optional[int]:
    """kv_buffers given per layer (a list of ``num_layers`` buffers per rank, as vLLM's GPU runner
    allocates one tensor per layer): set the config's kv_layer_regions; returns the CUDA device or
    None, as :func:`_use_device_memory`."""
    if not all(layered.values()):
        which = ", ".join(f"{r}: {'per layer' if v else 'one buffer'}" for r, v in sorted(layered.items()))
        raise InvalidError(lib.PDL_ERR_INVALID, f"kv_buffers: per-layer lists and single buffers mixed ({which}); "
                                                "give every rank the same form")
    rows = ffi.new("void **[]", tp_size)
    lrows = ffi.new("size_t *[]", tp_size)
    taken = {}
    for r, layers in given.items():
        if len(layers) != num_layers:
            raise InvalidError(lib.PDL_ERR_INVALID,
                               f"kv_buffers[{r}]: {len(layers)} layer buffers for {num_layers} layers (one per layer)")
        ptrs = ffi.new("void *[]", num_layers)
        lens = ffi.new("size_t[]", num_layers)
        for l, obj in enumerate(layers):
            reg = buffer_of(obj, r, l)
            taken[(r, l)] = reg
            ptrs[l] = reg.ptr
            lens[l] = reg.nbytes
            keep += [reg.ptr, obj]
        rows[r] = ptrs
        lrows[r] = lens
        keep += [ptrs, lens]
    keep += [rows, lrows]
    c.kv_layer_regions = rows
    c.kv_layer_region_lens = lrows
    return _use_device_memory(c, taken)


def set_kv_buffers(c: Any, kv_buffers: Sequence[Any], num_layers: int, tp_size: int, local_rank: Optional[int],
                   keep: List[Any]) -> Optional[int]:
    """Register ``kv_buffers`` in config ``c`` (see :class:`pdlink.Instance`): one buffer per rank, or per
    rank a list of ``num_layers`` buffers; with ``local_rank`` also ``[that rank's buffer]``. Appends to
    ``keep`` what must outlive the instance (the buffers and the C arrays naming them). Returns the CUDA
    device index, or None for host memory. Raises :class:`InvalidError` naming the entry at fault."""
    if local_rank is not None and len(kv_buffers) == 1:
        given = {local_rank: kv_buffers[0]}  # that rank's buffer only
    elif len(kv_buffers) == tp_size:
        given = {r: b for r, b in enumerate(kv_buffers) if local_rank is None or r == local_rank}
    else:
        want = f"{tp_size}" if local_rank is None else f"1 (rank {local_rank}'s) or {tp_size}"
        raise InvalidError(lib.PDL_ERR_INVALID,
                           f"kv_buffers: {len(kv_buffers)} buffers for tp_size {tp_size}; expected {want}")
    layered = {r: isinstance(b, (list, tuple)) for r, b in given.items()}
    if any(layered.values()):
        return _layer_buffers(c, given, layered, num_layers, tp_size, keep)
    regions = ffi.new("void *[]", tp_size)
    lens = ffi.new("size_t[]", tp_size)
    taken = {r: buffer_of(obj, r) for r, obj in given.items()}
    for r, reg in taken.items():
        regions[r] = reg.ptr
        lens[r] = reg.nbytes
        keep += [reg.ptr, given[r]]
    keep += [regions, lens]
    c.kv_regions = regions
    c.kv_region_lens = lens
    return _use_device_memory(c, taken)


def cuda_device(index: Optional[int]) -> Any:
    """A context manager making CUDA device ``index`` current while the instance is created (the cuda
    engine uses the calling thread's current context, which is torch's device): torch's own when torch
    is loaded, else nothing."""
    torch = sys.modules.get("torch")
    if index is None or torch is None or not hasattr(torch, "cuda"):
        return contextlib.nullcontext()
    try:
        return torch.cuda.device(index)
    except Exception:        # no usable torch.cuda: the engine picks device 0's context and says so
        return contextlib.nullcontext()
