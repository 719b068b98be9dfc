"""pdlink from Python: move the KV cache of a prompt from a prefill instance to a decode instance.

pdlink is a C library speaking vLLM's MoRIIO connector protocol (ZeroMQ + msgpack handshake,
releases, discovery pings) with heterogeneous tensor parallelism. This package wraps its connector
API (``include/pdlink/connector.h``) through a cffi extension compiled against the repository's
libpdlink. One :class:`Instance` is one serving instance (one ``vllm serve``) with ``tp_size`` ranks.

READ mode (the seed's flow)::

    prefill = pdlink.Instance(cfg_producer, geometry, tp_size=4, num_blocks=64)
    ids = prefill.alloc_blocks(3); ...write the KV into prefill.kv_layer(rank, layer)...
    prefill.hold("req-1", ids)
    params = prefill.params("req-1", ids)          # kv_transfer_params, a dict for the router
    decode = pdlink.Instance(cfg_consumer, geometry, tp_size=8, num_blocks=64)
    local = decode.alloc_blocks(3)
    with decode.pull(params, local) as pull:        # every decode rank reads its heads, then releases
        pull.wait()

KV memory is either the instance's own (``kv_layer`` gives writable views) or the caller's: pass
``kv_buffers``, one writable C-contiguous buffer per rank (numpy arrays, ``bytearray``, torch CPU
tensors) of at least :func:`kv_region_len` bytes; pdlink then moves KV straight into and out of them.
Contiguous torch CUDA tensors (one GPU per instance) are registered as device memory with the
``cuda`` backend (GPUs of one host, CUDA IPC) unless the config names a backend: ``ucx`` is kept, and
``tcp`` moves them between any two hosts through pinned host staging windows (where the CUDA driver
loads); ``shm`` is refused. The CPU never touches them.

Inside vLLM (one worker process per TP rank, block ids owned by vLLM's scheduler, the CPU cache's
K and V concatenated per token): ``Instance(..., local_rank=rank, external_blocks=True,
kv_buffers=[that rank's cache])`` with ``Geometry(..., kv_fused=True)``; the producer reports a
transfer finished when :meth:`Instance.events` yields ``("freed", transfer_id, -1)``.

Errors raise :class:`PdlinkError` (or a subclass) carrying pdlink's own message.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from pdlink._pdlink import ffi, lib

__all__ = [
    "PdlinkError", "InvalidError", "TimeoutError_", "Geometry", "Instance", "Pull", "Recv", "plan",
    "kv_region_len", "counter_names", "set_log_level", "connector_config",
]
__version__ = "0.1.0"

JsonConfig = Union[str, Mapping[str, Any]]


# ---- errors ----------------------------------------------------------------------------------------

class PdlinkError(Exception):
    """A pdlink call failed. ``status`` is the C status code (negative), ``status_name`` its name
    (``"PDL_ERR_INVALID"``), and ``str(e)`` pdlink's message naming the key, rank or peer at fault."""

    def __init__(self, status: int, message: str) -> None:
        self.status = status
        self.status_name = ffi.string(lib.pdl_status_name(status)).decode()
        self.message = message
        super().__init__(f"{message} ({self.status_name})")


class InvalidError(PdlinkError, ValueError):
    """PDL_ERR_INVALID / PDL_ERR_PARSE: the arguments or the configuration are wrong."""


class TimeoutError_(PdlinkError, TimeoutError):
    """PDL_ERR_TIMEOUT past the transfer's own deadline (a failed transfer, not a wait that ran out)."""


def _raise(st: int, err: Any) -> None:
    msg = ffi.string(err.msg).decode(errors="replace") or ffi.string(lib.pdl_status_string(st)).decode()
    cls = {lib.PDL_ERR_INVALID: InvalidError, lib.PDL_ERR_PARSE: InvalidError,
           lib.PDL_ERR_TIMEOUT: TimeoutError_}.get(st, PdlinkError)
    raise cls(st, msg)


def _check(st: int, err: Any) -> None:
    if st != lib.PDL_OK:
        _raise(st, err)


def _err() -> Any:
    e = ffi.new("pdl_error_t *")
    return e


def set_log_level(level: str) -> None:
    """Set libpdlink's log level: ``error``, ``warn``, ``info``, ``debug`` or ``trace`` (logs go to
    stderr; the ``PDLINK_LOG_LEVEL`` environment variable sets it at load time)."""
    lvl = lib.pdl_log_level_parse(level.encode())
    if lvl < 0:
        raise InvalidError(lib.PDL_ERR_INVALID, f"log level {level!r}: expected error|warn|info|debug|trace")
    lib.pdlpy_log_set_level(lvl)


# ---- geometry and configuration --------------------------------------------------------------------

@dataclass(frozen=True)
class Geometry:
    """The model's KV geometry as a whole instance sees it (per-rank heads follow from the TP size).

    ``order`` is ``"hnd"`` (vLLM's CPU/flash layout: heads, then tokens, inside a block) or ``"nhd"``;
    ``kv_separate`` puts all K blocks before all V blocks of a layer (vLLM's ``[2, num_blocks, ...]``),
    otherwise K and V alternate per block. ``kv_fused``: vLLM's CPU cache, one tensor per layer of
    shape ``(num_blocks, heads, block_size, 2 * head_dim)`` -- K then V in each token's row (with
    ``order="hnd"``; ``kv_separate`` is then ignored). ``elem_size`` is bytes per element (2 for
    bf16/fp16, 4 for float32)."""

    num_layers: int
    total_kv_heads: int
    head_dim: int
    block_size: int
    elem_size: int = 2
    is_mla: bool = False
    order: str = "hnd"
    kv_separate: bool = True
    kv_fused: bool = False


def _config_text(config: JsonConfig) -> bytes:
    if isinstance(config, str):
        return config.encode()
    return json.dumps(dict(config)).encode()


def connector_config(config: JsonConfig) -> Dict[str, Any]:
    """Parse a whole ``--kv-transfer-config`` (a dict or JSON text) with libpdlink's own parser and return
    what it settled on, defaults filled in: ``role`` ("producer"/"consumer"), ``host_ip``, ``proxy_ip``,
    ``proxy_ping_port``, ``http_port``, ``handshake_port``, ``notify_port`` (the bases), ``read_mode``
    and ``backend`` (after "rdma" was mapped). For a process that needs the values without creating an
    instance (vLLM's scheduler). Raises :class:`InvalidError` naming a bad key or value."""
    c = ffi.new("pdl_connector_config_t *")
    err = _err()
    _check(lib.pdl_connector_config_parse(_config_text(config), c, err), err)
    return {
        "role": "producer" if c.role == lib.PDL_ROLE_PRODUCER else "consumer",
        "host_ip": ffi.string(c.host_ip).decode(),
        "proxy_ip": ffi.string(c.proxy_ip).decode(),
        "proxy_ping_port": int(c.proxy_ping_port),
        "http_port": int(c.http_port),
        "handshake_port": int(c.handshake_port),
        "notify_port": int(c.notify_port),
        "read_mode": bool(c.read_mode),
        "backend": ffi.string(lib.pdl_backend_name(c.backend)).decode(),
    }


def _instance_config(config: JsonConfig, geometry: Geometry, tp_size: int, num_blocks: int, dp_rank: int,
                     dp_size: int, allow_write_mode: bool, local_rank: Optional[int] = None,
                     external_blocks: bool = False) -> Any:
    c = ffi.new("pdl_instance_config_t *")
    lib.pdl_instance_config_defaults(c)  # local_rank -1: a zeroed config would run rank 0 only
    err = _err()
    _check(lib.pdl_connector_config_parse(_config_text(config), ffi.addressof(c, "conn"), err), err)
    if geometry.order not in ("hnd", "nhd"):
        raise InvalidError(lib.PDL_ERR_INVALID, f"geometry.order {geometry.order!r}: expected 'hnd' or 'nhd'")
    m = c.model
    m.num_layers = geometry.num_layers
    m.total_kv_heads = geometry.total_kv_heads
    m.head_dim = geometry.head_dim
    m.elem_size = geometry.elem_size
    m.block_size = geometry.block_size
    m.is_mla = geometry.is_mla
    m.order = lib.PDL_KV_HND if geometry.order == "hnd" else lib.PDL_KV_NHD
    m.kv_separate = geometry.kv_separate
    m.kv_fused = geometry.kv_fused
    c.tp_size = tp_size
    c.dp_rank = dp_rank
    c.dp_size = dp_size
    if not 0 < num_blocks < 2**32:
        raise InvalidError(lib.PDL_ERR_INVALID, f"num_blocks {num_blocks}: expected 1 .. 2^32-1")
    c.num_blocks = num_blocks
    c.allow_write_mode = allow_write_mode
    if local_rank is not None and not (isinstance(local_rank, int) and 0 <= local_rank < tp_size):
        raise InvalidError(lib.PDL_ERR_INVALID, f"local_rank {local_rank!r}: expected None or 0 .. {tp_size - 1}")
    c.local_rank = -1 if local_rank is None else local_rank
    c.external_blocks = external_blocks
    return c


def kv_region_len(geometry: Geometry, tp_size: int, num_blocks: int, rank: int) -> int:
    """Bytes of rank ``rank``'s KV region (every layer, one after the other): the size of the buffer to
    pass for that rank in ``Instance(kv_buffers=...)``. Raises :class:`InvalidError` for a bad rank or
    geometry."""
    c = _instance_config('{"kv_role": "kv_consumer"}', geometry, tp_size, num_blocks, 0, 1, True)
    out = ffi.new("uint64_t *")
    err = _err()
    _check(lib.pdl_instance_kv_region_len(c, rank, out, err), err)
    return int(out[0])


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


@dataclass
class _Region:
    """One rank's KV buffer as pdlink registers it."""
    ptr: Any                   # char * (cffi)
    nbytes: int
    mem_type: str              # "host" or "cuda"
    device: Optional[int]      # the CUDA device index (cuda only)


def _buffer_of(obj: Any, rank: int, layer: Optional[int] = None) -> _Region:
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
            return _Region(ffi.cast("char *", obj.data_ptr()), _nbytes(obj), "cuda", 0 if index is None else index)
        return _Region(ffi.cast("char *", obj.data_ptr()), _nbytes(obj), "host", None)
    try:
        buf = ffi.from_buffer("char[]", obj, require_writable=True)
    except (TypeError, BufferError, ValueError) as e:
        raise InvalidError(lib.PDL_ERR_INVALID,
                           f"{where}: needs a writable C-contiguous buffer ({e})") from None
    return _Region(buf, len(buf), "host", None)


def _use_device_memory(c: Any, regions: Mapping[int, _Region]) -> Optional[int]:
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


def _cuda_device(index: Optional[int]) -> Any:
    """A context manager making CUDA device ``index`` current while the instance is created (the cuda
    engine uses the calling thread's current context, which is torch's device): torch's own when torch
    is loaded, else nothing."""
    import contextlib
    import sys
    torch = sys.modules.get("torch")
    if index is None or torch is None or not hasattr(torch, "cuda"):
        return contextlib.nullcontext()
    try:
        return torch.cuda.device(index)
    except Exception:        # no usable torch.cuda: the engine picks device 0's context and says so
        return contextlib.nullcontext()


# ---- the instance ----------------------------------------------------------------------------------

class Pull:
    """A READ-mode pull in flight (:meth:`Instance.pull`). Wait with :meth:`wait`; close it (or use
    ``with``) when done. The local blocks must not be freed or written before it finished."""

    def __init__(self, inst: "Instance", handle: Any) -> None:
        self._inst = inst
        self._h = handle

    def wait(self, timeout: Optional[float] = None) -> bool:
        """Wait up to ``timeout`` seconds (None: until finished). True when every rank read its plan;
        False when ranks are still reading (call again). Raises :class:`PdlinkError` with the first
        failing rank's message when the pull failed (the blocks then hold garbage)."""
        if self._h is None:
            raise PdlinkError(lib.PDL_ERR_BAD_STATE, "pull: already closed")
        err = _err()
        ms = -1 if timeout is None else max(0, int(timeout * 1000))
        st = lib.pdl_pull_wait(self._h, ms, err)
        if st == lib.PDL_ERR_TIMEOUT and b"still reading" in ffi.string(err.msg):
            return False  # the wait ran out; the pull goes on
        _check(st, err)
        return True

    @property
    def bytes(self) -> int:
        """KV bytes read by every rank (final once finished)."""
        return int(lib.pdl_pull_bytes(self._h)) if self._h is not None else 0

    @property
    def descriptors(self) -> int:
        """Transfer descriptors posted by every rank."""
        return int(lib.pdl_pull_descriptors(self._h)) if self._h is not None else 0

    def close(self) -> None:
        """Release the handle (never waits: ranks still reading keep their own reference)."""
        if self._h is not None:
            lib.pdl_pull_free(self._h)
            self._h = None

    def __enter__(self) -> "Pull":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class Recv:
    """A WRITE-mode receive (:meth:`Instance.expect_push`): the decode waits for the prefill's pushes."""

    def __init__(self, inst: "Instance", handle: Any) -> None:
        self._inst = inst
        self._h = handle

    def wait(self, timeout: Optional[float] = None) -> bool:
        """True when every rank counted all its write_done with status ok; False when ranks still wait
        (only with a timeout); raises :class:`PdlinkError` for a failed push."""
        if self._h is None:
            raise PdlinkError(lib.PDL_ERR_BAD_STATE, "recv: already closed")
        err = _err()
        ms = -1 if timeout is None else max(0, int(timeout * 1000))
        st = lib.pdl_recv_wait(self._h, ms, err)
        if st == lib.PDL_ERR_TIMEOUT and b"still waiting" in ffi.string(err.msg):
            return False  # the wait ran out; the receive goes on
        _check(st, err)
        return True

    def write_done(self, rank: int) -> int:
        """write_done messages consumer rank ``rank`` counted."""
        return int(lib.pdl_recv_write_done(self._h, rank))

    def close(self) -> None:
        if self._h is not None:
            lib.pdl_recv_free(self._h)
            self._h = None

    def __enter__(self) -> "Recv":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _ids(block_ids: Sequence[int]) -> Any:
    ids = list(block_ids)
    if not ids:
        raise InvalidError(lib.PDL_ERR_INVALID, "block_ids: empty")
    return ffi.new("uint32_t[]", ids), len(ids)


def _params_text(params: Union[str, Mapping[str, Any]]) -> bytes:
    return params.encode() if isinstance(params, str) else json.dumps(dict(params)).encode()


def _opt(s: Optional[str]) -> Any:
    return ffi.NULL if s is None else s.encode()


class Instance:
    """One serving instance: ``tp_size`` ranks, each with its transfer engine, KV region, handshake and
    notify ports (``base + dp_rank*tp_size + rank``), and one block allocator shared by the ranks.

    ``config`` is the whole ``--kv-transfer-config`` (a dict or JSON text: ``kv_role`` and MoRIIO's
    ``kv_connector_extra_config`` keys: host_ip, proxy_ip, proxy_ping_port, http_port, handshake_port,
    notify_port, read_mode, backend, ...). ``kv_buffers``: None (pdlink allocates), or one writable
    C-contiguous buffer per rank of at least :func:`kv_region_len` bytes that pdlink reads and writes
    in place; they must stay alive until :meth:`close` (the instance keeps a reference). An entry may
    instead be a list of ``num_layers`` buffers, one per layer of ``layer_len`` bytes
    (:meth:`rank_geometry`) at any addresses, as vLLM's GPU runner allocates them: each layer is then
    registered on its own (every rank given must use the same form). Contiguous
    torch CUDA tensors, all on one GPU, are registered as CUDA memory (``mem_type`` "cuda", ``device``
    the index) with the ``cuda`` backend unless the config names one (``tcp``: staged through pinned host
    memory, between any hosts; ``ucx``); where the CUDA driver is missing the instance is refused with
    :class:`PdlinkError` (PDL_ERR_UNSUPPORTED) saying so.

    ``local_rank``: None runs every rank in this object; an int ``r`` runs rank ``r`` only (vLLM's
    worker process of rank ``r``: its engine, region, ports and counters), the other ranks being other
    processes' instances with the same config. ``kv_buffers`` may then be ``[that rank's buffer]`` or
    a full ``tp_size`` list of which only entry ``r`` is used. A producer transfer is done (``"freed"``
    event) when this rank counted its releases. Calls naming another rank raise :class:`InvalidError`.

    ``external_blocks``: block ids are the caller's (vLLM's scheduler): no allocator
    (:meth:`alloc_blocks` raises, :meth:`free_blocks` does nothing, ``free_block_count`` is 0); hold,
    pull, push and expect_push take any id below ``num_blocks``; holds may overlap (prefix caching);
    nothing is freed when a hold ends -- the ``("freed", transfer_id, -1)`` event says the blocks may
    be reused.
    """

    def __init__(self, config: JsonConfig, geometry: Geometry, *, tp_size: int, num_blocks: int,
                 dp_rank: int = 0, dp_size: int = 1, kv_buffers: Optional[Sequence[Any]] = None,
                 allow_write_mode: bool = False, local_rank: Optional[int] = None,
                 external_blocks: bool = False) -> None:
        self._h: Any = None
        self._evq: Any = None
        self.geometry = geometry
        c = _instance_config(config, geometry, tp_size, num_blocks, dp_rank, dp_size, allow_write_mode,
                             local_rank, external_blocks)
        self._keep: List[Any] = []
        if kv_buffers is not None:
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
                device = self._layer_buffers(c, given, layered, geometry, tp_size)
            else:
                regions = ffi.new("void *[]", tp_size)
                lens = ffi.new("size_t[]", tp_size)
                taken = {r: _buffer_of(obj, r) for r, obj in given.items()}
                for r, reg in taken.items():
                    regions[r] = reg.ptr
                    lens[r] = reg.nbytes
                    self._keep += [reg.ptr, given[r]]
                self._keep += [regions, lens]
                c.kv_regions = regions
                c.kv_region_lens = lens
                device = _use_device_memory(c, taken)
        else:
            device = None
        #: "host" or "cuda": where the KV buffers live (kv_layer views exist for host memory only).
        self.mem_type = "host" if device is None else "cuda"
        self.device = device
        out = ffi.new("pdl_instance_t **")
        err = _err()
        with _cuda_device(device):
            st = lib.pdl_instance_create(c, out, err)
        if st != lib.PDL_OK and device is not None:
            msg = ffi.string(err.msg).decode(errors="replace")
            cls = InvalidError if st in (lib.PDL_ERR_INVALID, lib.PDL_ERR_PARSE) else PdlinkError
            backend = ffi.string(lib.pdl_backend_name(c.conn.backend)).decode()
            raise cls(st, f"kv_buffers on cuda:{device} (backend {backend}): {msg}")
        _check(st, err)
        self._h = out[0]
        # Held-transfer events (producer) queue up in C, never waiting for the GIL on pdlink's threads;
        # events() takes them. After close, what was still queued waits in _late.
        self._late: List[Tuple[str, str, int]] = []
        self._evq = lib.pdlpy_events_attach(self._h)
        if self._evq == ffi.NULL:
            lib.pdl_instance_destroy(self._h)
            self._h = None
            raise PdlinkError(lib.PDL_ERR_NOMEM, "instance: out of memory for the event queue")
        self.tp_size = tp_size
        #: The rank this object runs (None: every rank).
        self.local_rank: Optional[int] = local_rank
        self.external_blocks = external_blocks
        self.read_mode = bool(c.conn.read_mode)
        self.role = "producer" if c.conn.role == lib.PDL_ROLE_PRODUCER else "consumer"
        self.backend = ffi.string(lib.pdl_backend_name(c.conn.backend)).decode()

    # -- lifetime
    def close(self) -> None:
        """Stop every thread and close every socket; held blocks are freed. Close pulls first."""
        if self._h is not None:
            lib.pdl_instance_destroy(self._h)
            self._h = None
            self._keep = []
            self._late = self.events()
            lib.pdlpy_events_free(self._evq)
            self._evq = None

    def __enter__(self) -> "Instance":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    def _handle(self) -> Any:
        if self._h is None:
            raise PdlinkError(lib.PDL_ERR_BAD_STATE, "instance: closed")
        return self._h

    # -- identity
    @property
    def engine_id(self) -> str:
        """``host:handshake_base``, the engine_id MoRIIO advertises."""
        return ffi.string(lib.pdl_instance_engine_id(self._handle())).decode()

    @property
    def zmq_address(self) -> str:
        """``host:IP,handshake:PORT,notify:PORT``, for discovery and request ids."""
        return ffi.string(lib.pdl_instance_zmq_address(self._handle())).decode()

    def handshake_port(self, rank: int) -> int:
        """The port rank ``rank``'s handshake ROUTER listens on (a rank this object runs)."""
        port = int(lib.pdl_instance_handshake_port(self._handle(), rank))
        if port < 0:
            raise InvalidError(lib.PDL_ERR_INVALID, f"handshake_port: {self._rank_error(rank)}")
        return port

    def notify_port(self, rank: int) -> int:
        """The port rank ``rank``'s notify ROUTER listens on (a rank this object runs)."""
        port = int(lib.pdl_instance_notify_port(self._handle(), rank))
        if port < 0:
            raise InvalidError(lib.PDL_ERR_INVALID, f"notify_port: {self._rank_error(rank)}")
        return port

    # -- memory
    def rank_geometry(self, rank: int) -> Dict[str, Any]:
        """Rank ``rank``'s per-layer geometry: num_blocks, block_size, num_heads (this rank's), head_dim,
        elem_size, order, kv_separate, block_len (bytes of one half-block) and layer_len (bytes)."""
        g = lib.pdl_instance_geometry(self._handle(), rank)
        if g == ffi.NULL:
            raise InvalidError(lib.PDL_ERR_INVALID, self._rank_error(rank))
        return {"num_blocks": g.num_blocks, "block_size": g.block_size, "num_heads": g.num_heads,
                "head_dim": g.head_dim, "elem_size": g.elem_size, "is_mla": bool(g.is_mla),
                "order": "hnd" if g.order == lib.PDL_KV_HND else "nhd", "kv_separate": bool(g.kv_separate),
                "kv_fused": bool(g.kv_fused),
                "block_len": int(lib.pdl_layout_block_len(g)), "layer_len": int(lib.pdl_layout_region_len(g))}

    def _rank_error(self, rank: int) -> str:
        if not 0 <= rank < self.tp_size:
            return f"rank {rank} not in [0, {self.tp_size})"
        return f"rank {rank} is not run by this instance (local_rank {self.local_rank}: its process has it)"

    def _local_ranks(self) -> range:
        return range(self.tp_size) if self.local_rank is None else range(self.local_rank, self.local_rank + 1)

    def kv_layer(self, rank: int, layer: int) -> memoryview:
        """A writable view of rank ``rank``'s layer ``layer`` (``layer_len`` bytes; the caller's buffer
        when kv_buffers were given). ``numpy.frombuffer(view, dtype)`` makes an array of it."""
        if self.mem_type != "host":
            raise PdlinkError(lib.PDL_ERR_UNSUPPORTED,
                              f"kv_layer({rank}, {layer}): the KV buffers are on cuda:{self.device}; a CPU view of "
                              "device memory would fault: use the tensors themselves")
        p = lib.pdl_instance_kv_layer(self._handle(), rank, layer)
        if p == ffi.NULL:
            why = self._rank_error(rank) if lib.pdl_instance_geometry(self._handle(), rank) == ffi.NULL else \
                f"layer {layer} not in [0, {self.geometry.num_layers})"
            raise InvalidError(lib.PDL_ERR_INVALID, f"kv_layer({rank}, {layer}): {why}")
        n = self.rank_geometry(rank)["layer_len"]
        return memoryview(ffi.buffer(p, n))

    def _layer_buffers(self, c: Any, given: Mapping[int, Any], layered: Mapping[int, bool], geometry: Geometry,
                       tp_size: int) -> Optional[int]:
        """kv_buffers given per layer (a list of ``num_layers`` buffers per rank, as vLLM's GPU runner
        allocates one tensor per layer): set the config's kv_layer_regions; returns the CUDA device or
        None, as :func:`_use_device_memory`."""
        if not all(layered.values()):
            which = ", ".join(f"{r}: {'per layer' if v else 'one buffer'}" for r, v in sorted(layered.items()))
            raise InvalidError(lib.PDL_ERR_INVALID, f"kv_buffers: per-layer lists and single buffers mixed ({which}); "
                                                    "give every rank the same form")
        L = geometry.num_layers
        rows = ffi.new("void **[]", tp_size)
        lrows = ffi.new("size_t *[]", tp_size)
        taken = {}
        for r, layers in given.items():
            if len(layers) != L:
                raise InvalidError(lib.PDL_ERR_INVALID,
                                   f"kv_buffers[{r}]: {len(layers)} layer buffers for {L} layers (one per layer)")
            ptrs = ffi.new("void *[]", L)
            lens = ffi.new("size_t[]", L)
            for l, obj in enumerate(layers):
                reg = _buffer_of(obj, r, l)
                taken[(r, l)] = reg
                ptrs[l] = reg.ptr
                lens[l] = reg.nbytes
                self._keep += [reg.ptr, obj]
            rows[r] = ptrs
            lrows[r] = lens
            self._keep += [ptrs, lens]
        self._keep += [rows, lrows]
        c.kv_layer_regions = rows
        c.kv_layer_region_lens = lrows
        return _use_device_memory(c, taken)

    # -- blocks
    def alloc_blocks(self, n: int) -> List[int]:
        """Allocate ``n`` block ids (the same on every rank). Raises on exhaustion, naming the counts;
        raises :class:`PdlinkError` (PDL_ERR_UNSUPPORTED) with ``external_blocks``."""
        out = ffi.new("uint32_t[]", max(n, 1))
        err = _err()
        _check(lib.pdl_instance_alloc_blocks(self._handle(), n, out, err), err)
        return [int(out[i]) for i in range(n)]

    def free_blocks(self, block_ids: Sequence[int]) -> None:
        """Give back blocks the caller owns."""
        ids, n = _ids(block_ids)
        lib.pdl_instance_free_blocks(self._handle(), ids, n)

    @property
    def free_block_count(self) -> int:
        return int(lib.pdl_instance_free_block_count(self._handle()))

    # -- producer (READ mode)
    def zero_tail(self, block_ids: Sequence[int], num_tokens: int) -> None:
        """Zero the rows of the last of ``block_ids`` past a prompt of ``num_tokens`` tokens, on every
        rank this object runs, every layer and K/V (``pdl_instance_zero_tail``; on the GPU for CUDA
        buffers): the consumer reads whole blocks, and those rows still hold an earlier request's KV.
        ``num_tokens`` must need exactly ``len(block_ids)`` blocks."""
        ids, n = _ids(block_ids)
        err = _err()
        _check(lib.pdl_instance_zero_tail(self._handle(), ids, n, num_tokens, err), err)

    def hold(self, transfer_id: str, block_ids: Sequence[int], request_id: Optional[str] = None,
             num_tokens: Optional[int] = None) -> None:
        """Hold ``block_ids`` under ``transfer_id`` until every rank counted its releases (then they are
        freed) or defer_timeout passes. The KV must be final before the call. With ``request_id``
        (MoRIIO's ``___prefill_addr_..___decode_addr_..`` id) the holds of a consumer that is gone are
        freed early. With ``num_tokens`` (the prompt's length) the last block's rows past the prompt
        are zeroed first (:meth:`zero_tail`), so the consumer never reads what an earlier request left
        there; nothing is held when that fails. The blocks then belong to the instance."""
        if num_tokens is not None:
            self.zero_tail(block_ids, num_tokens)
        ids, n = _ids(block_ids)
        err = _err()
        _check(lib.pdl_instance_hold_for(self._handle(), transfer_id.encode(), _opt(request_id), ids, n, err), err)

    def params(self, transfer_id: str, block_ids: Sequence[int]) -> Dict[str, Any]:
        """The kv_transfer_params this producer returns for a held transfer (READ mode), as a dict."""
        ids, n = _ids(block_ids)
        err = _err()
        s = lib.pdlpy_params_json(self._handle(), transfer_id.encode(), ids, n, err)
        if s == ffi.NULL:
            _raise(err.status, err)
        try:
            return json.loads(ffi.string(s).decode())
        finally:
            lib.free(s)

    def drop(self, transfer_id: str) -> None:
        """READ producer: end the hold of ``transfer_id`` now (``pdl_instance_drop``): its grants are
        revoked and the record goes, with no "freed" event; for a hold whose params will never reach a
        decode. Raises :class:`PdlinkError` (NOT_FOUND) when there is no such hold."""
        err = _err()
        _check(lib.pdl_instance_drop(self._handle(), transfer_id.encode(), err), err)

    @property
    def held_transfers(self) -> int:
        """Transfers currently held (producer)."""
        return int(lib.pdl_instance_held_transfers(self._handle()))

    @property
    def held_blocks(self) -> int:
        return int(lib.pdl_instance_held_blocks(self._handle()))

    # -- consumer (READ mode)
    def pull(self, params: Union[str, Mapping[str, Any]], block_ids: Sequence[int],
             request_id: Optional[str] = None) -> Pull:
        """Read the producer's transfer named by ``params`` (its kv_transfer_params) into ``block_ids``
        on every rank; each rank then releases every producer rank of its group. Asynchronous."""
        ids, n = _ids(block_ids)
        out = ffi.new("pdl_pull_t **")
        err = _err()
        _check(lib.pdlpy_pull(self._handle(), _params_text(params), _opt(request_id), ids, n, out, err), err)
        return Pull(self, out[0])

    def release(self, params: Union[str, Mapping[str, Any]], request_id: Optional[str] = None) -> None:
        """The transfer will NOT be pulled (the request failed or was cancelled): send every producer rank
        its release now (status failed), so the prefill frees the blocks at once instead of after
        defer_timeout (``pdl_instance_abandon``). Never call it for a transfer that was pulled."""
        err = _err()
        _check(lib.pdlpy_abandon(self._handle(), _params_text(params), _opt(request_id), err), err)

    # -- WRITE mode
    def push(self, params: Union[str, Mapping[str, Any]], block_ids: Sequence[int],
             request_id: Optional[str] = None, *, layers: Optional[int] = None) -> None:
        """WRITE-mode producer: write the blocks' KV to the consumer named by ``params``/``request_id``
        once its remote_blocks arrive, then send write_done. The blocks then belong to the instance.

        ``layers=None``: every layer's KV is final now (``pdl_instance_push``). An int ``k``: the push
        starts before its KV is final (``pdl_instance_push_start``) with layers ``0..k-1`` final (``0``:
        none yet); say more with :meth:`push_layers` as the forward finishes them. Each rank writes a
        layer once it is final and sends write_done after the last; a push whose layers are not all
        final within transfer_timeout fails (the decode gets a failed write_done)."""
        if layers is not None and not 0 <= layers <= self.geometry.num_layers:
            raise InvalidError(lib.PDL_ERR_INVALID, f"push: layers={layers} outside [0, "
                               f"{self.geometry.num_layers}] (num_layers)")
        ids, n = _ids(block_ids)
        err = _err()
        _check(lib.pdlpy_push(self._handle(), _params_text(params), _opt(request_id), ids, n,
                              -1 if layers is None else layers, err), err)

    def push_layers(self, transfer_id: str, layers: int) -> None:
        """WRITE-mode producer: layers ``0..layers-1`` of the push ``transfer_id`` (started with
        ``push(..., layers=k)``) hold their final KV (``pdl_instance_push_layers``). A count not above
        one already given is ignored. Raises :class:`InvalidError` for a count outside
        ``[0, num_layers]``, :class:`PdlinkError` (``PDL_ERR_NOT_FOUND``) when no such push is under way
        (never started, or already written or given up)."""
        err = _err()
        _check(lib.pdl_instance_push_layers(self._handle(), transfer_id.encode(), layers, err), err)

    def expect_push(self, params: Union[str, Mapping[str, Any]], block_ids: Sequence[int],
                    request_id: Optional[str] = None) -> Recv:
        """WRITE-mode consumer: announce ``block_ids`` to the producer ranks and count their write_done."""
        ids, n = _ids(block_ids)
        out = ffi.new("pdl_recv_t **")
        err = _err()
        _check(lib.pdlpy_expect_push(self._handle(), _params_text(params), _opt(request_id), ids, n, out, err),
               err)
        return Recv(self, out[0])

    def events(self) -> List[Tuple[str, str, int]]:
        """Take the held-transfer events since the last call, oldest first: ``("reported", transfer_id,
        rank)`` when a producer rank's release fan-in completed, ``("expired", ...)`` when a rank reaped
        it after defer_timeout, ``("freed", transfer_id, -1)`` when every rank resolved it and its blocks
        went back to the allocator (what a vLLM scheduler waits for before freeing a prefill's blocks).
        With ``local_rank`` "every rank" is this one: the freed event is what that rank's vLLM worker
        reports as ``finished_sending``; with ``external_blocks`` nothing went back anywhere, the event
        says the caller may reuse the blocks."""
        if self._evq is None:
            out, self._late = self._late, []
            return out
        out = []
        ev, rank = ffi.new("int *"), ffi.new("int *")
        tid = ffi.new("char[]", 1024)
        while lib.pdlpy_events_take(self._evq, ev, rank, tid, len(tid)):
            name = _EVENT_NAMES.get(ev[0], str(ev[0]))
            out.append((name, ffi.string(tid).decode(errors="replace"), -1 if name == "freed" else int(rank[0])))
        return out

    # -- counters
    def counters(self, rank: Optional[int] = None) -> Dict[str, float]:
        """Counters of rank ``rank`` (None: summed over the ranks this object runs), keyed by their
        Prometheus names without ``pdlink_`` and ``_total`` (``kv_bytes``, ``transfers``,
        ``releases_sent``, ...); ``*_seconds`` values are floats."""
        ranks = self._local_ranks() if rank is None else [rank]
        out: Dict[str, float] = {}
        c = ffi.new("pdl_rank_counters_t *")
        base = ffi.cast("char *", c)
        for r in ranks:
            err = _err()
            _check(lib.pdl_instance_counters(self._handle(), r, c, err), err)
            for name, kind, off in _counter_rows():
                v = ffi.cast("uint64_t *", base + off)[0]
                out[name] = out.get(name, 0) + (v / 1e9 if kind == lib.PDL_COUNTER_NS else int(v))
        return out


_EVENT_NAMES = {1: "reported", 2: "expired", 3: "freed"}


_ROWS: Optional[List[Any]] = None


def _counter_rows() -> List[Any]:
    global _ROWS
    if _ROWS is None:
        n = ffi.new("size_t *")
        t = lib.pdl_rank_counters_table(n)
        rows = []
        for i in range(n[0]):
            name = ffi.string(t[i].name).decode()
            short = name[len("pdlink_"):] if name.startswith("pdlink_") else name
            short = short[:-len("_total")] if short.endswith("_total") else short
            rows.append((short, t[i].kind, t[i].offset))
        _ROWS = rows
    return _ROWS


def counter_names() -> List[str]:
    """The keys of :meth:`Instance.counters`, in the C table's order."""
    return [r[0] for r in _counter_rows()]


# ---- plan ------------------------------------------------------------------------------------------

def plan(prefill_tp: int, decode_tp: int, total_kv_heads: int, is_mla: bool = False) -> Dict[str, Any]:
    """What pdlink does for a P/D TP pair (``pdlink plan``'s data, from the same C functions):
    ``expected_acks`` (releases a producer rank counts), ``expected_write_done``, and per consumer
    rank its group, heads and read pieces; per producer rank its heads, write targets and notify set.
    Raises :class:`InvalidError` for an impossible triple (heads not splittable, TP out of range)."""
    err = _err()
    acks = ffi.new("int *")
    wd = ffi.new("int *")
    _check(lib.pdl_topo_expected_acks(prefill_tp, decode_tp, acks, err), err)
    _check(lib.pdl_topo_expected_write_done(prefill_tp, decode_tp, wd, err), err)

    def piece(p: Any) -> Dict[str, int]:
        return {"producer_rank": p.producer_rank, "first_head": p.first_head, "num_heads": p.num_heads,
                "src_head": p.src_head, "dst_head": p.dst_head}

    consumers = []
    rp = ffi.new("pdl_read_plan_t *")
    for d in range(decode_tp):
        _check(lib.pdl_topo_read_plan(prefill_tp, decode_tp, total_kv_heads, is_mla, d, rp, err), err)
        consumers.append({"rank": d,
                          "group": list(range(rp.group_first, rp.group_first + rp.group_count)),
                          "heads": list(range(rp.local_first_head, rp.local_first_head + rp.local_num_heads)),
                          "reads": [piece(rp.pieces[i]) for i in range(rp.num_pieces)]})
    producers = []
    wp = ffi.new("pdl_write_plan_t *")
    first = ffi.new("int *")
    count = ffi.new("int *")
    for p in range(prefill_tp):
        _check(lib.pdl_topo_write_plan(prefill_tp, decode_tp, total_kv_heads, is_mla, p, wp, err), err)
        _check(lib.pdl_topo_heads(prefill_tp, total_kv_heads, is_mla, p, first, count, err), err)
        producers.append({"rank": p, "heads": list(range(first[0], first[0] + count[0])),
                          "notify": list(range(wp.notify_first, wp.notify_first + wp.notify_count)),
                          "writes": [{"consumer_rank": t.consumer_rank, **piece(t.piece)}
                                     for t in (wp.targets[i] for i in range(wp.num_targets))]})
    return {"prefill_tp": prefill_tp, "decode_tp": decode_tp, "total_kv_heads": total_kv_heads,
            "is_mla": is_mla, "expected_acks": acks[0], "expected_write_done": wd[0],
            "consumers": consumers, "producers": producers}


if os.environ.get("PDLINK_LOG_LEVEL"):
    try:
        set_log_level(os.environ["PDLINK_LOG_LEVEL"])
    except InvalidError:
        pass
