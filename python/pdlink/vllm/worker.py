"""The worker-process half of PdlinkConnector: one pdlink instance per vLLM worker (TP rank).

vLLM runs one worker process per TP rank, each with its own KV tensors. ``register_kv_caches`` makes
this rank's pdlink instance over those tensors in place (``local_rank`` = the TP rank, so it listens on
``base + dp_rank*tp_size + tp_rank`` like a MoRIIO rank; ``external_blocks``: vLLM's block ids are used
as they are), registered as :mod:`pdlink.vllm.kvcache` describes.

:class:`PdlinkWorker` is what the connector calls, one method per vLLM worker hook. It picks the role
once, from the config's role and mode, and forwards each step's plan (the scheduler half's
:class:`~pdlink.vllm.plan.StepPlan`) to it:

  ================  ===========================================  ===========================================
  role              READ mode                                    WRITE mode
  ================  ===========================================  ===========================================
  producer          :class:`~.worker_producer.ReadProducer`:     :class:`~.worker_producer.WriteProducer`:
                    holds after the forward                      pushes (layer by layer with a host cache)
  consumer          :class:`~.worker_consumer.ReadConsumer`:     :class:`~.worker_consumer.WriteConsumer`:
                    pulls                                        expects (receives)
  ================  ===========================================  ===========================================

Per step:
  * ``start_load_kv``: releases first (they free a prefill's blocks), then the drops, then the loads
    (pulls or expects), which run in pdlink's threads while vLLM computes other requests; WRITE with a
    host (CPU) cache: the step's pushes start, before the forward that computes their prompts, with no
    layer final yet (``Instance.push(..., layers=0)``);
  * ``save_kv_layer``: after attention layer ``i`` wrote its KV, layers ``0..i`` of those pushes are final
    (``Instance.push_layers``), so pdlink writes layer ``i`` to the decode while the forward computes the
    next ones, as MoRIIO's WRITE mode does;
  * ``wait_for_save``: the holds, after the step's forward wrote the prompt's KV; WRITE: the pushes
    started in ``start_load_kv`` get every layer final (a model whose attention layers vLLM does not
    report this way included), and with a CUDA cache the pushes are made here, whole;
  * ``get_transfer_results``: loads that finished (``finished_recving``), those that failed (also in
    ``failed_recving``), and transfers this rank freed (``finished_sending``) once vLLM has told this
    worker the request finished; then, in a step the scheduler marked idle, a pause (``idle_step_s``).

Counters: each completed transfer rewrites ``$PDLINK_VLLM_COUNTERS_DIR/<role>-dp<d>-tp<r>.json`` when that
variable is set (the e2e script reads them), and ``shutdown`` logs them.
"""
from __future__ import annotations

import json
import os
import time
from typing import Any, Callable, Dict, Mapping, Optional, Set, Tuple, Type

from pdlink.vllm.affinity import thread_cpus, threads_unpinned
from pdlink.vllm.kvcache import device_kind, kv_region, layer_index
from pdlink.vllm import stats
from pdlink.vllm.log import log
from pdlink.vllm.plan import StepPlan
from pdlink.vllm.worker_consumer import ReadConsumer, WriteConsumer
from pdlink.vllm.worker_producer import ReadProducer, WriteProducer
from pdlink.vllm.worker_role import Results, WorkerRole

# (role, read_mode) -> the class that plays it.
ROLES: Dict[Tuple[str, bool], Type[WorkerRole]] = {
    ("producer", True): ReadProducer,
    ("producer", False): WriteProducer,
    ("consumer", True): ReadConsumer,
    ("consumer", False): WriteConsumer,
}


class PdlinkWorker:
    """The worker half for TP rank ``tp_rank``. ``make_instance(config, geometry, **kw)`` builds the
    pdlink instance (``pdlink.Instance``; tests inject fakes, or set ``inst``)."""

    def __init__(self, config: Mapping[str, Any], *, tp_size: int, tp_rank: int, total_kv_heads: int,
                 dp_rank: int = 0, dp_size: int = 1,
                 make_instance: Optional[Callable[..., Any]] = None) -> None:
        import pdlink

        self.config = dict(config)
        self.tp_size = tp_size
        self.tp_rank = tp_rank
        self.dp_rank = dp_rank
        self.dp_size = dp_size
        self.total_kv_heads = total_kv_heads
        self._make_instance = make_instance or pdlink.Instance
        # Strict, as the scheduler's (params.parse_endpoint): vLLM creates the workers' connectors first, so
        # an unknown key must stop here rather than become a default in every rank.
        c = pdlink.connector_config(self.config, strict=True)
        self.read_mode = bool(c["read_mode"])
        self.role = ROLES[(c["role"], self.read_mode)](tp_rank)
        # Threads pdlink starts (at registration, and a transfer lane at the first pull from a producer)
        # get these CPUs rather than the calling thread's OpenMP binding (threads_unpinned).
        self.thread_cpus = thread_cpus()
        self._kv_caches: Optional[Mapping[str, Any]] = None
        # Seconds to pause at the end of an idle step (StepPlan.idle: one vLLM runs only to poll the
        # workers for transfers: a prefill's held blocks waiting for the decode's releases, a decode
        # waiting for its pull). vLLM steps back to back then, its engine and every worker spinning; on
        # a small CPU machine that starves the very processes that must finish the transfer (measured on
        # this 2-vCPU VM: a TP2 prefill spinning while it waited made the decode's pull start only when
        # defer_timeout freed the hold, 60 s later). The pause is the worker's, after it polled, so that
        # planning a step never waits. PDLINK_VLLM_IDLE_STEP_MS overrides; 0 disables.
        self.idle_step_s = float(os.environ.get("PDLINK_VLLM_IDLE_STEP_MS", "10")) / 1000.0
        self.reported: Dict[str, float] = {}  # the figures get_kv_connector_stats last reported (stats.py)
        self.counters_path: Optional[str] = None
        d = os.environ.get("PDLINK_VLLM_COUNTERS_DIR")
        if d:
            role = self.config.get("kv_role", "kv")
            self.counters_path = os.path.join(d, f"{role}-dp{dp_rank}-tp{tp_rank}.json")

    @property
    def inst(self) -> Any:
        """This rank's pdlink instance (None before register_kv_caches and after shutdown)."""
        return self.role.inst

    @inst.setter
    def inst(self, inst: Any) -> None:
        self.role.inst = inst

    @property
    def stats(self) -> Dict[str, Any]:
        return self.role.stats

    @property
    def timeline(self) -> Dict[str, Dict[str, float]]:
        return self.role.timeline

    # ---- registration ------------------------------------------------------------------------------

    def register_kv_caches(self, kv_caches: Mapping[str, Any]) -> None:
        import pdlink

        want = max(self.total_kv_heads // self.tp_size, 1)
        buf, g = kv_region(kv_caches, kv_heads=want)
        if g["heads"] != want:
            raise ValueError(f"PdlinkConnector: rank {self.tp_rank} has {g['heads']} KV heads per layer, "
                             f"expected {want} ({self.total_kv_heads} heads over TP {self.tp_size})")
        geometry = pdlink.Geometry(num_layers=g["num_layers"], total_kv_heads=self.total_kv_heads,
                                   head_dim=g["head_dim"], block_size=g["block_size"], elem_size=g["elem_size"],
                                   order=g["order"], kv_separate=g["kv_separate"], kv_fused=g["fused"])
        self._kv_caches = kv_caches          # the buffer borrows their memory
        # A block's unused rows can be zeroed only where a token's row is addressable: the GPU layouts
        # keep one row per token. vLLM CPU's cache keeps, per block and head, the K of every token and
        # then the V of every token, in whatever order its ISA-specific kernels write them, so a row
        # past the prompt is not a byte range pdlink may name there; zeroing by rows destroyed valid
        # KV (vllm-e2e parity 0/3). There, scrub_freed_blocks is the way to keep earlier KV out.
        self.role.zero_tail = not g["fused"]
        # pdlink's layer l is the l-th name in layer-number order, as kv_region registered them.
        self.role.layer_of = {n: i for i, n in enumerate(sorted(kv_caches, key=layer_index))}
        # vLLM calls save_kv_layer once a layer's attention has run on the CPU, its KV written; on a GPU it
        # calls it once the layer's kernels are queued, not done, so a CUDA cache is pushed whole, after
        # the forward (wait_for_save).
        self.role.host_cache = device_kind(next(iter(kv_caches.values()))) == "cpu"
        with threads_unpinned(self.thread_cpus):
            self.inst = self._make_instance(self.config, geometry, tp_size=self.tp_size,
                                            num_blocks=g["num_blocks"], dp_rank=self.dp_rank, dp_size=self.dp_size,
                                            kv_buffers=[buf], local_rank=self.tp_rank, external_blocks=True,
                                            allow_write_mode=not self.read_mode)
        log.info("pdlink rank %d/%d: %d layers x %d blocks of %d heads x %d tokens x 2x%d (%d bytes/elem), "
                 "%s of %d bytes", self.tp_rank, self.tp_size, g["num_layers"], g["num_blocks"],
                 g["heads"], g["block_size"], g["head_dim"], g["elem_size"],
                 "one region per layer" if isinstance(buf, list) else "one region",
                 g["layer_len"] if isinstance(buf, list) else g["layer_len"] * g["num_layers"])

    # ---- per step -----------------------------------------------------------------------------------

    def start_load_kv(self, plan: Optional[StepPlan]) -> None:
        self.role.step_begins()
        if not plan:
            return
        # pdlink may start a thread: a transfer lane for a pull, release or expect, and a push whose
        # decode's block list came first starts its writer lane in the pushing thread.
        lanes = plan.pulls or plan.releases or plan.expects or (plan.pushes and self.role.host_cache)
        with threads_unpinned(self.thread_cpus if lanes else None):
            self.role.start(plan)

    def save_kv_layer(self, layer_name: str) -> None:
        """vLLM's attention layer ``layer_name`` wrote its KV for this step."""
        self.role.layer_saved(layer_name)

    def wait_for_save(self, plan: Optional[StepPlan]) -> None:
        if plan:
            self.role.after_forward(plan)

    def get_transfer_results(self, finished_req_ids: Set[str], plan: Optional[StepPlan] = None) -> Results:
        """(finished_sending, finished_recving, failed_recving); failed receives are in both of the
        last two sets, as vLLM's KVConnectorTransferResults wants. ``plan``: the step's, whose ``idle``
        mark makes this call pause ``idle_step_s`` before it returns."""
        out = self.role.poll(finished_req_ids)
        if self.role.dirty and self.counters_path:
            self.write_counters()
        self.role.dirty = False
        if plan is not None and plan.idle and self.idle_step_s > 0:
            time.sleep(self.idle_step_s)
        return out

    # ---- counters and shutdown ----------------------------------------------------------------------

    def counters(self) -> Dict[str, Any]:
        out: Dict[str, Any] = {"tp_rank": self.tp_rank, "tp_size": self.tp_size, "dp_rank": self.dp_rank,
                               "role": self.config.get("kv_role"), "connector": dict(self.stats),
                               **self.role.in_flight(), "timeline": self.timeline}
        if self.inst is not None:
            out["pdlink"] = self.inst.counters()
        return out

    def transfer_stats(self) -> Dict[str, float]:
        """What this rank moved since the last call, as vLLM's connector stats report it (the figures of
        :data:`pdlink.vllm.stats.METRICS`); ``{}`` when nothing changed, so an idle step sends nothing."""
        now = stats.totals(self.stats, self.inst.counters() if self.inst is not None else {})
        d = stats.delta(now, self.reported)
        self.reported = now
        return {} if stats.is_empty(d) else d

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
        self.role.close()
        self.inst.close()
        self.inst = None
