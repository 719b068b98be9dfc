"""The worker-process half of PdlinkConnector (READ and WRITE modes): one pdlink instance per vLLM worker (TP rank).

vLLM runs one worker process per TP rank, each with its own KV tensors. ``register_kv_caches`` makes
this rank's pdlink instance over those tensors in place (``local_rank`` = the TP rank, so it listens on
``base + dp_rank*tp_size + tp_rank`` like a MoRIIO rank; ``external_blocks``: vLLM's block ids are used
as they are). A rank's layers that lie one after the other (vLLM's CPU backend allocates them that
way, seen with tools/vllm/probe_connector.py) are registered as one region; layers at unrelated
addresses (vLLM's GPU runner allocates one tensor per layer) are registered one region per layer. CUDA
caches (flash-attention's or FlashInfer's layout, NHD or HND) are registered as device memory with the
cuda backend either way (docs/gpu.md).

Per step (the scheduler half's :class:`~pdlink.vllm.scheduler.StepPlan`):
  * ``start_load_kv``: releases first (they free a prefill's blocks), then the pulls (WRITE: the
    expects, which announce the blocks to the producer ranks), which run in pdlink's threads while
    vLLM computes other requests; WRITE with a host (CPU) cache: the step's pushes start, before the
    forward that computes their prompts, with no layer final yet (``Instance.push(..., layers=0)``);
  * ``save_kv_layer``: after attention layer ``i`` wrote its KV, layers ``0..i`` of those pushes are final
    (``Instance.push_layers``), so pdlink writes layer ``i`` to the decode while the forward computes the
    next ones, as MoRIIO's WRITE mode does;
  * ``wait_for_save``: the holds, after the step's forward wrote the prompt's KV; WRITE: the pushes
    started in ``start_load_kv`` get every layer final (a model whose attention layers vLLM does not
    report this way included), and with a CUDA cache the pushes are made here, whole;
  * ``get_transfer_results``: pulls or receives that finished (``finished_recving``), those that
    failed (also in ``failed_recving``: vLLM then recomputes or fails the request, it never decodes from
    a partial cache), and transfers this rank freed (``finished_sending``: the decode's releases
    arrived, the push was written, or defer_timeout passed) once vLLM has told this worker the request
    finished.

Counters: each completed transfer rewrites ``$PDLINK_VLLM_COUNTERS_DIR/<role>-dp<d>-tp<r>.json`` when that
variable is set (the e2e script reads them), and ``shutdown`` logs them.
"""
from __future__ import annotations

import contextlib
import ctypes
import json
import logging
import os
import re
import time
from typing import Any, Callable, Dict, Iterator, Mapping, Optional, Set, Tuple

from pdlink.events import Event
from pdlink.vllm.scheduler import StepPlan

log = logging.getLogger("pdlink.vllm")

_LAYER_INDEX = re.compile(r"(?:^|\.)(\d+)(?:\.|$)")


def layer_index(name: str) -> int:
    """The layer number in a vLLM layer name (``model.layers.7.self_attn.attn`` -> 7)."""
    m = _LAYER_INDEX.search(name)
    if m is None:
        raise ValueError(f"PdlinkConnector: KV cache layer name {name!r} has no layer number")
    return int(m.group(1))


def thread_cpus() -> Optional[Set[int]]:
    """The CPUs pdlink's threads may use in a vLLM worker: its parent's (vLLM's engine process, which
    vLLM does not bind, so what the user's taskset or cgroup allows) when they are more than this
    thread's, else None (nothing to widen, or no affinity calls on this platform)."""
    try:
        mine, parent = os.sched_getaffinity(0), os.sched_getaffinity(os.getppid())
    except (AttributeError, OSError):
        return None
    return set(parent) if parent > mine else None


@contextlib.contextmanager
def threads_unpinned(cpus: Optional[Set[int]]) -> Iterator[None]:
    """Run the body with this thread's CPU affinity widened to ``cpus`` (None: unchanged), then restore
    it. A thread starts with the affinity of the thread that creates it, and vLLM's CPU backend pins a
    worker's main thread -- the one calling the connector -- to its first OpenMP CPU (libgomp's binding
    under VLLM_CPU_OMP_THREADS_BIND, "auto" by default). pdlink's service, data and transfer threads
    started from it would all share that CPU with the forward passes and never move to an idle one or
    to the CPUs vLLM reserves for a KV connector (seen on a 2-vCPU VM: a prefill's data thread pinned
    so, a 256 KiB read waited 0.4-0.6 s for it)."""
    if not cpus:
        yield
        return
    mine = os.sched_getaffinity(0)
    try:
        os.sched_setaffinity(0, cpus)
    except OSError:        # a cpuset that shrank since: keep the binding rather than fail a transfer
        yield
        return
    try:
        yield
    finally:
        os.sched_setaffinity(0, mine)


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


class PdlinkWorker:
    """The worker half for TP rank ``tp_rank``. ``make_instance(config, geometry, **kw)`` builds the
    pdlink instance (``pdlink.Instance``; tests inject fakes)."""

    def __init__(self, config: Mapping[str, Any], *, tp_size: int, tp_rank: int, total_kv_heads: int,
                 dp_rank: int = 0, dp_size: int = 1,
                 make_instance: Optional[Callable[..., Any]] = None) -> None:
        self.config = dict(config)
        self.tp_size = tp_size
        self.tp_rank = tp_rank
        self.dp_rank = dp_rank
        self.dp_size = dp_size
        self.total_kv_heads = total_kv_heads
        if make_instance is None:
            import pdlink
            make_instance = pdlink.Instance
        self._make_instance = make_instance
        self.inst: Any = None
        # Threads pdlink starts (at registration, and a transfer lane at the first pull from a producer)
        # get these CPUs rather than the calling thread's OpenMP binding (threads_unpinned).
        self.thread_cpus = thread_cpus()
        self._kv_caches: Optional[Mapping[str, Any]] = None
        self._pulls: Dict[str, Any] = {}                     # request id -> pdlink Pull
        self._pull_started: Dict[str, float] = {}
        self._failed: Set[str] = set()                       # failed pulls not yet reported
        self._done: Set[str] = set()                         # finished pulls not yet reported
        self._held: Dict[str, str] = {}                      # transfer id -> request id
        self._freed: Set[str] = set()                        # request ids this rank freed
        self._finished: Set[str] = set()                     # request ids vLLM said finished
        self._dropped: Set[str] = set()                      # transfer ids dropped (DropOrder), not yet lapsed
        self._zero_tail = True                               # register_kv_caches: False for vLLM CPU's cache
        self._layer_of: Dict[str, int] = {}                  # KV cache layer name -> pdlink layer index
        self._push_by_layer = False                          # register_kv_caches: True for host caches
        # Pushes of this step started in start_load_kv: transfer id -> whether its layers are still to be
        # said final (False when it could not start, or once pdlink no longer knows it: given up).
        self._layered: Dict[str, bool] = {}
        self._dirty = False
        # Wall-clock times per transfer id (hold/freed on a prefill rank, pull issued/done on a decode
        # rank): the e2e script lines them up with its own request times to show where a request's time
        # goes. Bounded: the oldest entries are dropped.
        self.timeline: Dict[str, Dict[str, float]] = {}
        self._pull_tid: Dict[str, str] = {}
        self.stats = {"pulls": 0, "pulls_failed": 0, "holds": 0, "holds_failed": 0, "releases": 0,
                      "freed": 0, "expired": 0, "pull_seconds": 0.0}
        self.counters_path: Optional[str] = None
        d = os.environ.get("PDLINK_VLLM_COUNTERS_DIR")
        if d:
            role = self.config.get("kv_role", "kv")
            self.counters_path = os.path.join(d, f"{role}-dp{dp_rank}-tp{tp_rank}.json")

    # ---- registration ------------------------------------------------------------------------------

    def register_kv_caches(self, kv_caches: Mapping[str, Any]) -> None:
        import pdlink

        want = max(self.total_kv_heads // self.tp_size, 1)
        buf, g = kv_region(kv_caches, kv_heads=want)
        # A block's unused rows can be zeroed only where a token's row is addressable: the GPU layouts
        # keep one row per token. vLLM CPU's cache keeps, per block and head, the K of every token and
        # then the V of every token, in whatever order its ISA-specific kernels write them, so a row
        # past the prompt is not a byte range pdlink may name there; zeroing by rows destroyed valid
        # KV (vllm-e2e parity 0/3). There, scrub_freed_blocks is the way to keep earlier KV out.
        self._zero_tail = not g["fused"]
        if g["heads"] != want:
            raise ValueError(f"PdlinkConnector: rank {self.tp_rank} has {g['heads']} KV heads per layer, "
                             f"expected {want} ({self.total_kv_heads} heads over TP {self.tp_size})")
        geometry = pdlink.Geometry(num_layers=g["num_layers"], total_kv_heads=self.total_kv_heads,
                                   head_dim=g["head_dim"], block_size=g["block_size"], elem_size=g["elem_size"],
                                   order=g["order"], kv_separate=g["kv_separate"], kv_fused=g["fused"])
        self._kv_caches = kv_caches          # the buffer borrows their memory
        # pdlink's layer l is the l-th name in layer-number order, as kv_region registered them.
        self._layer_of = {n: i for i, n in enumerate(sorted(kv_caches, key=layer_index))}
        # vLLM calls save_kv_layer once a layer's attention has run on the CPU, its KV written; on a GPU it
        # calls it once the layer's kernels are queued, not done, so a CUDA cache is pushed whole, after
        # the forward (wait_for_save).
        self._push_by_layer = device_kind(next(iter(kv_caches.values()))) == "cpu"
        write = not pdlink.connector_config(self.config)["read_mode"]
        with threads_unpinned(self.thread_cpus):
            self.inst = self._make_instance(self.config, geometry, tp_size=self.tp_size,
                                            num_blocks=g["num_blocks"], dp_rank=self.dp_rank, dp_size=self.dp_size,
                                            kv_buffers=[buf], local_rank=self.tp_rank, external_blocks=True,
                                            allow_write_mode=write)
        log.info("pdlink rank %d/%d: %d layers x %d blocks of %d heads x %d tokens x 2x%d (%d bytes/elem), "
                 "%s of %d bytes", self.tp_rank, self.tp_size, g["num_layers"], g["num_blocks"],
                 g["heads"], g["block_size"], g["head_dim"], g["elem_size"],
                 "one region per layer" if isinstance(buf, list) else "one region",
                 g["layer_len"] if isinstance(buf, list) else g["layer_len"] * g["num_layers"])

    # ---- per step -----------------------------------------------------------------------------------

    def start_load_kv(self, plan: Optional[StepPlan]) -> None:
        # A step whose wait_for_save never came (its forward failed) left its pushes here: their layers
        # were not all computed, so they are never said final (they fail at transfer_timeout).
        self._layered.clear()
        if not plan:
            return
        # A push whose decode's block list came first starts its writer lane in the pushing thread.
        lanes = plan.pulls or plan.releases or plan.expects or (plan.pushes and self._push_by_layer)
        with threads_unpinned(self.thread_cpus if lanes else None):
            self._start_orders(plan)

    def _start_orders(self, plan: StepPlan) -> None:
        for rel in plan.releases:
            try:
                # WRITE: the request id carries the peer's address (vllm-router's ___*_addr_ parts).
                self.inst.abandon(rel.params, rel.request_id if rel.write else None)
                self.stats["releases"] += 1
            except Exception as e:  # the producer then frees after defer_timeout; nothing here waits on it
                log.warning("pdlink rank %d: release of request %s failed: %s", self.tp_rank, rel.request_id, e)
        for rid in plan.failed:
            self._failed.add(rid)
        for d in plan.drops:
            self._drop(d.request_id, d.transfer_id, d.reason)
        for ex in plan.expects:
            self._start_load(ex.request_id, ex.params, "receive", "expect_issued",
                             lambda ex=ex: self.inst.expect_push(ex.params, ex.block_ids, ex.request_id))
        for order in plan.pulls:
            self._start_load(order.request_id, order.params, "pull", "pull_issued",
                             lambda order=order: self.inst.pull(order.params, order.block_ids, None))
        if self._push_by_layer:
            for p in plan.pushes:
                # Started before this step's forward computes the prompt: pdlink handshakes now and
                # writes each layer once save_kv_layer says it is final.
                # One that cannot start is handled in _push and not tried again in wait_for_save.
                self._layered[p.transfer_id] = self._push(p, layers=0)
                if self._layered[p.transfer_id]:
                    self.stats["pushes_layered"] = self.stats.get("pushes_layered", 0) + 1

    def _start_load(self, rid: str, params: Mapping[str, Any], what: str, mark: str,
                    start: Callable[[], Any]) -> None:
        """Start a request's load (a pull, or a WRITE receive) and track it until get_transfer_results
        sees it done; one that cannot start is reported failed at once."""
        tid = str(params.get("transfer_id"))
        try:
            self._pulls[rid] = start()
        except Exception as e:
            log.error("pdlink rank %d: %s of request %s (transfer %s) refused: %s", self.tp_rank, what, rid, tid, e)
            self._failed.add(rid)
            return
        self._pull_started[rid] = time.monotonic()
        self._pull_tid[rid] = tid
        self._mark(tid, mark)

    def _drop(self, rid: str, tid: str, reason: str) -> None:
        """The scheduler let vLLM free a held request's blocks (pdlink.vllm.scheduler.DropOrder): forget
        the hold and end pdlink's record of it at once (Instance.drop: its grants are revoked). The
        request must not reach finished_sending (vLLM no longer knows it). A record that could not be
        dropped (a WRITE push) lapses at defer_timeout and is counted dropped_expired, not expired."""
        held = self._held.pop(tid, None) is not None
        self._freed.discard(rid)            # a hold that failed had put it there
        self._finished.discard(rid)
        if held:
            self._mark(tid, "dropped")
            try:
                self.inst.drop(tid)          # pdlink's record goes now, not at defer_timeout
            except Exception as e:  # freed meanwhile, or a WRITE push: it lapses on its own (counted)
                log.debug("pdlink rank %d: drop of %s: %s", self.tp_rank, tid, e)
                self._dropped.add(tid)
        self.stats["dropped"] = self.stats.get("dropped", 0) + 1
        key = "dropped_" + reason
        self.stats[key] = self.stats.get(key, 0) + 1
        self._dirty = True

    def save_kv_layer(self, layer_name: str) -> None:
        """vLLM's attention layer ``layer_name`` wrote its KV for this step: it and every layer before it
        are final in the pushes started in start_load_kv. A name that is no registered KV cache layer is
        ignored."""
        if not self._layered:
            return
        i = self._layer_of.get(layer_name)
        if i is None:
            return
        for tid, live in self._layered.items():
            if live:
                self._say_layers(tid, i + 1)

    def _say_layers(self, tid: str, layers: int) -> None:
        try:
            self.inst.push_layers(tid, layers)
        except Exception as e:
            # Given up already (its decode abandoned it or is gone): pdlink freed it, nothing to say.
            log.debug("pdlink rank %d: push %s: layers %d not said final: %s", self.tp_rank, tid, layers, e)
            self._layered[tid] = False

    def wait_for_save(self, plan: Optional[StepPlan]) -> None:
        if not plan:
            return
        for h in plan.holds:
            try:
                # The last block's rows past the prompt still hold an earlier request's KV: zeroed
                # first (on the GPU for CUDA caches), and nothing is held if that fails.
                self.inst.hold(h.transfer_id, h.block_ids, None,
                               num_tokens=h.num_tokens if self._zero_tail else None)
                self._held[h.transfer_id] = h.request_id
                self._mark(h.transfer_id, "held")
                self.stats["holds"] += 1
            except Exception as e:
                # Nothing is held, so a decode's pull fails and is reported there; the blocks must not
                # stay pinned on a "freed" that will never come.
                log.error("pdlink rank %d: hold of request %s (transfer %s) failed: %s", self.tp_rank,
                          h.request_id, h.transfer_id, e)
                self.stats["holds_failed"] += 1
                self._freed.add(h.request_id)
        for p in plan.pushes:
            if p.transfer_id not in self._layered:
                self._push(p)
            elif self._layered.pop(p.transfer_id):
                # Every layer is written now: also those of a model whose attention layers vLLM did not
                # report through save_kv_layer (a no-op when it did).
                self._say_layers(p.transfer_id, len(self._layer_of))
        self._layered.clear()

    def _push(self, p: Any, layers: Optional[int] = None) -> bool:
        """Push ``p`` (a PushOrder): whole (``layers`` None, after the forward) or started with ``layers``
        final. False when it could not start, which is then handled here."""
        try:
            # The last block's rows past the prompt still hold an earlier request's KV: zeroed before the
            # push starts (this step's forward writes only the prompt's rows, so before it is as good as
            # after), and nothing is pushed if that fails.
            if self._zero_tail and p.num_tokens is not None:
                self.inst.zero_tail(p.block_ids, p.num_tokens)
            if layers is None:
                self.inst.push(p.params, p.block_ids, p.request_id)
            else:
                self.inst.push(p.params, p.block_ids, p.request_id, layers=layers)
            self._held[p.transfer_id] = p.request_id
            self._mark(p.transfer_id, "pushed")
            self.stats["pushes"] = self.stats.get("pushes", 0) + 1
            return True
        except Exception as e:
            # Nothing is pushed: the decode's receive times out or is failed by the release the
            # scheduler orders; the blocks must not stay pinned on a "freed" that never comes.
            log.error("pdlink rank %d: push of request %s (transfer %s) failed: %s", self.tp_rank,
                      p.request_id, p.transfer_id, e)
            self.stats["pushes_failed"] = self.stats.get("pushes_failed", 0) + 1
            self._freed.add(p.request_id)
            return False

    def get_transfer_results(self, finished_req_ids: Set[str]) -> Tuple[Set[str], Set[str], Set[str]]:
        """(finished_sending, finished_recving, failed_recving); failed receives are in both of the
        last two sets, as vLLM's KVConnectorTransferResults wants."""
        for rid, pull in list(self._pulls.items()):
            try:
                done = pull.wait(0)
            except Exception as e:
                log.error("pdlink rank %d: pull of request %s failed: %s", self.tp_rank, rid, e)
                self._failed.add(rid)
                done = True
            if done:
                self.stats["pull_seconds"] += time.monotonic() - self._pull_started.pop(rid, time.monotonic())
                if rid not in self._failed:
                    self._done.add(rid)
                    self.stats["pulls"] += 1
                else:
                    self.stats["pulls_failed"] += 1
                pull.close()
                del self._pulls[rid]
                self._mark(self._pull_tid.pop(rid, rid), "pull_done" if rid in self._done else "pull_failed")
                self._dirty = True
        if self.inst is not None:
            for kind, tid, _rank in self.inst.events():
                if kind == Event.RANK_EXPIRED and tid in self._dropped:
                    self.stats["dropped_expired"] = self.stats.get("dropped_expired", 0) + 1
                elif kind == Event.FREED and tid in self._dropped:
                    self._dropped.discard(tid)
                elif kind == Event.RANK_EXPIRED:
                    self.stats["expired"] += 1
                    log.warning("pdlink rank %d: transfer %s expired (no decode released it before "
                                "defer_timeout)", self.tp_rank, tid)
                elif kind == Event.FREED:
                    rid = self._held.pop(tid, None)
                    if rid is not None:
                        self._mark(tid, "freed")
                        self._freed.add(rid)
                        self.stats["freed"] += 1
                        self._dirty = True
        # vLLM only accepts a finished send for a request it has already reported finished to us.
        self._finished |= finished_req_ids & (self._freed | set(self._held.values()))
        sending = self._freed & self._finished
        self._freed -= sending
        self._finished -= sending
        failed, self._failed = self._failed, set()
        recving = self._done | failed
        self._done = set()
        if self._dirty and self.counters_path:
            self.write_counters()
        self._dirty = False
        return sending, recving, failed

    def _mark(self, tid: str, what: str) -> None:
        self.timeline.setdefault(tid, {})[what] = time.time()
        while len(self.timeline) > 256:
            del self.timeline[next(iter(self.timeline))]

    # ---- counters and shutdown ----------------------------------------------------------------------

    def counters(self) -> Dict[str, Any]:
        out: Dict[str, Any] = {"tp_rank": self.tp_rank, "tp_size": self.tp_size, "dp_rank": self.dp_rank,
                               "role": self.config.get("kv_role"), "connector": dict(self.stats),
                               "held_now": len(self._held), "pulls_in_flight": len(self._pulls),
                               "timeline": self.timeline}
        if self.inst is not None:
            out["pdlink"] = self.inst.counters()
        return out

    def write_counters(self) -> None:
        assert self.counters_path is not None
        tmp = self.counters_path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(self.counters(), f, sort_keys=True)
        os.replace(tmp, self.counters_path)

    def shutdown(self) -> None:
        if self.inst is None:
            return
        c = self.counters()
        c.pop("timeline")
        log.info("pdlink rank %d counters at shutdown: %s", self.tp_rank, json.dumps(c, sort_keys=True))
        if self.counters_path:
            self.write_counters()
        for pull in self._pulls.values():
            pull.close()
        self._pulls.clear()
        self.inst.close()
        self.inst = None
