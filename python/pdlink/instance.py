"""One serving instance (``pdl_instance_t``, ``include/pdlink/connector.h``): its ranks, KV memory and
blocks, and the calls that hold, pull, abandon, push and expect transfers."""
from __future__ import annotations

import json
from typing import Any, Dict, List, Optional, Sequence, Tuple

from pdlink._pdlink import ffi, lib
from pdlink.config import Geometry, JsonConfig, instance_config, json_text
from pdlink.counters import read_counters
from pdlink.errors import InvalidError, PdlinkError, check, new_error, raise_error
from pdlink.events import Event, EventQueue
from pdlink.memory import cuda_device, set_kv_buffers
from pdlink.transfer import Pull, Recv

__all__ = ["Instance"]


def _ids(block_ids: Sequence[int]) -> Tuple[Any, int]:
    ids = list(block_ids)
    if not ids:
        raise InvalidError(lib.PDL_ERR_INVALID, "block_ids: empty")
    return ffi.new("uint32_t[]", ids), len(ids)


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
    a full ``tp_size`` list of which only entry ``r`` is used. A producer transfer is done (``Event.FREED``) when this rank counted its releases. Calls naming another rank raise :class:`InvalidError`.

    ``external_blocks``: block ids are the caller's (vLLM's scheduler): no allocator
    (:meth:`alloc_blocks` raises, :meth:`free_blocks` does nothing, ``free_block_count`` is 0); hold,
    pull, push and expect_push take any id below ``num_blocks``; holds may overlap (prefix caching);
    nothing is freed when a hold ends -- the ``(Event.FREED, transfer_id, -1)`` event says the blocks may
    be reused.
    """

    def __init__(self, config: JsonConfig, geometry: Geometry, *, tp_size: int, num_blocks: int,
                 dp_rank: int = 0, dp_size: int = 1, kv_buffers: Optional[Sequence[Any]] = None,
                 allow_write_mode: bool = False, local_rank: Optional[int] = None,
                 external_blocks: bool = False) -> None:
        self._h: Any = None
        self._evq: Any = None
        self.geometry = geometry
        c = instance_config(config, geometry, tp_size, num_blocks, dp_rank, dp_size, allow_write_mode,
                             local_rank, external_blocks)
        self._keep: List[Any] = []
        device = None
        if kv_buffers is not None:
            device = set_kv_buffers(c, kv_buffers, geometry.num_layers, tp_size, local_rank, self._keep)
        #: "host" or "cuda": where the KV buffers live (kv_layer views exist for host memory only).
        self.mem_type = "host" if device is None else "cuda"
        self.device = device
        out = ffi.new("pdl_instance_t **")
        err = new_error()
        with cuda_device(device):
            st = lib.pdl_instance_create(c, out, err)
        if st != lib.PDL_OK and device is not None:
            msg = ffi.string(err.msg).decode(errors="replace")
            cls = InvalidError if st in (lib.PDL_ERR_INVALID, lib.PDL_ERR_PARSE) else PdlinkError
            backend = ffi.string(lib.pdl_backend_name(c.conn.backend)).decode()
            raise cls(st, f"kv_buffers on cuda:{device} (backend {backend}): {msg}")
        check(st, err)
        self._h = out[0]
        # Held-transfer events (producer) queue up in C, never waiting for the GIL on pdlink's threads;
        # events() takes them. After close, what was still queued waits in _late.
        self._late: List[Tuple[Event, str, int]] = []
        try:
            self._evq = EventQueue(self._h)
        except PdlinkError:
            lib.pdl_instance_destroy(self._h)
            self._h = None
            raise
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
            self._evq.free()
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

    # -- blocks
    def alloc_blocks(self, n: int) -> List[int]:
        """Allocate ``n`` block ids (the same on every rank). Raises on exhaustion, naming the counts;
        raises :class:`PdlinkError` (PDL_ERR_UNSUPPORTED) with ``external_blocks``."""
        out = ffi.new("uint32_t[]", max(n, 1))
        err = new_error()
        check(lib.pdl_instance_alloc_blocks(self._handle(), n, out, err), err)
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
        err = new_error()
        check(lib.pdl_instance_zero_tail(self._handle(), ids, n, num_tokens, err), err)

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
        err = new_error()
        check(lib.pdl_instance_hold_for(self._handle(), transfer_id.encode(), _opt(request_id), ids, n, err), err)

    def params(self, transfer_id: str, block_ids: Sequence[int]) -> Dict[str, Any]:
        """The kv_transfer_params this producer returns for a held transfer (READ mode), as a dict."""
        ids, n = _ids(block_ids)
        err = new_error()
        s = lib.pdlpy_params_json(self._handle(), transfer_id.encode(), ids, n, err)
        if s == ffi.NULL:
            raise_error(err.status, err)
        try:
            return json.loads(ffi.string(s).decode())
        finally:
            lib.free(s)

    def drop(self, transfer_id: str) -> None:
        """READ producer: end the hold of ``transfer_id`` now (``pdl_instance_drop``): its grants are
        revoked and the record goes, with no FREED event; for a hold whose params will never reach a
        decode. Raises :class:`PdlinkError` (NOT_FOUND) when there is no such hold."""
        err = new_error()
        check(lib.pdl_instance_drop(self._handle(), transfer_id.encode(), err), err)

    @property
    def held_transfers(self) -> int:
        """Transfers currently held (producer)."""
        return int(lib.pdl_instance_held_transfers(self._handle()))

    @property
    def held_blocks(self) -> int:
        return int(lib.pdl_instance_held_blocks(self._handle()))

    # -- consumer (READ mode)
    def pull(self, params: JsonConfig, block_ids: Sequence[int],
             request_id: Optional[str] = None) -> Pull:
        """Read the producer's transfer named by ``params`` (its kv_transfer_params) into ``block_ids``
        on every rank; each rank then releases every producer rank of its group. Asynchronous."""
        ids, n = _ids(block_ids)
        out = ffi.new("pdl_pull_t **")
        err = new_error()
        check(lib.pdlpy_pull(self._handle(), json_text(params), _opt(request_id), ids, n, out, err), err)
        return Pull(self, out[0])

    def abandon(self, params: JsonConfig, request_id: Optional[str] = None) -> None:
        """The transfer will NOT be pulled (the request failed or was cancelled): send every producer rank
        its release now (status failed), so the prefill frees the blocks at once instead of after
        defer_timeout (``pdl_instance_abandon``). Never call it for a transfer that was pulled."""
        err = new_error()
        check(lib.pdlpy_abandon(self._handle(), json_text(params), _opt(request_id), err), err)

    # -- WRITE mode
    def push(self, params: JsonConfig, block_ids: Sequence[int],
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
        err = new_error()
        check(lib.pdlpy_push(self._handle(), json_text(params), _opt(request_id), ids, n,
                              -1 if layers is None else layers, err), err)

    def push_layers(self, transfer_id: str, layers: int) -> None:
        """WRITE-mode producer: layers ``0..layers-1`` of the push ``transfer_id`` (started with
        ``push(..., layers=k)``) hold their final KV (``pdl_instance_push_layers``). A count not above
        one already given is ignored. Raises :class:`InvalidError` for a count outside
        ``[0, num_layers]``, :class:`PdlinkError` (``PDL_ERR_NOT_FOUND``) when no such push is under way
        (never started, or already written or given up)."""
        err = new_error()
        check(lib.pdl_instance_push_layers(self._handle(), transfer_id.encode(), layers, err), err)

    def expect_push(self, params: JsonConfig, block_ids: Sequence[int],
                    request_id: Optional[str] = None) -> Recv:
        """WRITE-mode consumer: announce ``block_ids`` to the producer ranks and count their write_done."""
        ids, n = _ids(block_ids)
        out = ffi.new("pdl_recv_t **")
        err = new_error()
        check(lib.pdlpy_expect_push(self._handle(), json_text(params), _opt(request_id), ids, n, out, err),
               err)
        return Recv(self, out[0])

    def events(self) -> List[Tuple[Event, str, int]]:
        """Take the held-transfer events since the last call, oldest first, as ``(event, transfer_id,
        rank)`` with ``event`` an :class:`Event`: ``RANK_REPORTED`` when a producer rank's release fan-in
        completed, ``RANK_EXPIRED`` when a rank reaped it after defer_timeout, ``(Event.FREED,
        transfer_id, -1)`` when every rank resolved it and its blocks went back to the allocator (what a
        vLLM scheduler waits for before freeing a prefill's blocks). With ``local_rank`` "every rank" is
        this one: FREED is what that rank's vLLM worker reports as ``finished_sending``; with
        ``external_blocks`` nothing went back anywhere, the event says the caller may reuse the blocks."""
        if self._evq is None:
            out, self._late = self._late, []
            return out
        return self._evq.take()

    # -- counters
    def counters(self, rank: Optional[int] = None) -> Dict[str, float]:
        """Counters of rank ``rank`` (None: summed over the ranks this object runs), keyed by their
        Prometheus names without ``pdlink_`` and ``_total`` (``kv_bytes``, ``transfers``,
        ``releases_sent``, ...); ``*_seconds`` values are floats."""
        return read_counters(self._handle(), self._local_ranks() if rank is None else [rank])

