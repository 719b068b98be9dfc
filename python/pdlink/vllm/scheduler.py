"""The scheduler-process half of PdlinkConnector: pure bookkeeping, no transfer engine.

vLLM's scheduler process owns the block ids but no KV memory; the worker processes (one per TP rank)
own the memory and a pdlink instance each. This half decides, step by step, what the workers must do
and hands it to them in the step's connector metadata (a :class:`~pdlink.vllm.plan.StepPlan`).

:class:`PdlinkScheduler` is what the connector calls, one method per vLLM scheduler hook. It picks the
role once, from the config's role and mode, and forwards every hook to it:

  ================  ==============================================  ===============================================
  role              READ mode (``read_mode: true``)                 WRITE mode (``read_mode: false``)
  ================  ==============================================  ===============================================
  producer          :class:`~.scheduler_producer.ReadProducer`:     :class:`~.scheduler_producer.WriteProducer`:
                    HOLD, params returned                           PUSH into the decode's blocks
  consumer          :class:`~.scheduler_consumer.ReadConsumer`:     :class:`~.scheduler_consumer.WriteConsumer`:
                    PULL                                            EXPECT the push
  ================  ==============================================  ===============================================

What each does is described in its module; what they share (the plan being filled, the counters, the
release and drop orders) is :mod:`pdlink.vllm.scheduler_role`. ``stats`` counts what the scheduler
decided (aborts and preemptions among it); the workers count what they did (:mod:`pdlink.vllm.worker`).
"""
from __future__ import annotations

import os
from typing import Any, Callable, Dict, Iterable, Mapping, Optional, Sequence, Tuple, Type

from pdlink.vllm.params import Endpoint, parse_endpoint
from pdlink.vllm.plan import StepPlan
from pdlink.vllm.scheduler_consumer import ReadConsumer, WriteConsumer
from pdlink.vllm.scheduler_producer import ReadProducer, WriteProducer
from pdlink.vllm.scheduler_role import SchedulerRole

# (role, read_mode) -> the class that plays it.
ROLES: Dict[Tuple[str, bool], Type[SchedulerRole]] = {
    ("producer", True): ReadProducer,
    ("producer", False): WriteProducer,
    ("consumer", True): ReadConsumer,
    ("consumer", False): WriteConsumer,
}


class PdlinkScheduler:
    """The scheduler half. ``block_ids_of(request_id)`` returns the request's current block ids (vLLM:
    ``kv_cache_manager.get_block_ids(id)[0]``); it is only asked in build_connector_meta.

    Request objects are duck-typed (tests pass fakes): ``request_id``, ``kv_transfer_params`` (a dict
    or None; its ``do_remote_prefill`` is switched off once handled, as vLLM's own connectors do, so a
    re-scheduled request does not pull twice), ``num_prompt_tokens``, ``num_computed_tokens``."""

    def __init__(self, config: Mapping[str, Any], *, tp_size: int, block_size: int, dp_rank: int = 0,
                 dp_size: int = 1, block_ids_of: Optional[Callable[[str], Sequence[int]]] = None,
                 endpoint: Optional[Endpoint] = None) -> None:
        self.ep = endpoint or parse_endpoint(config)
        self.write = not self.ep.read_mode
        d = os.environ.get("PDLINK_VLLM_COUNTERS_DIR")
        stats_path = os.path.join(d, f"{config.get('kv_role', 'kv')}-dp{dp_rank}-scheduler.json") if d else None
        self.role = ROLES[(self.ep.role, self.ep.read_mode)](
            self.ep, tp_size=tp_size, block_size=block_size, dp_rank=dp_rank, dp_size=dp_size,
            block_ids_of=block_ids_of, stats_path=stats_path)

    @property
    def stats(self) -> Dict[str, int]:
        return self.role.stats

    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> Tuple[int, bool]:
        return self.role.get_num_new_matched_tokens(request, num_computed_tokens)

    def update_state_after_alloc(self, request: Any, block_ids: Sequence[int], num_external_tokens: int) -> None:
        self.role.update_state_after_alloc(request, block_ids, num_external_tokens)

    def build_connector_meta(self, num_scheduled_tokens: Mapping[str, int],
                             preempted: Iterable[str] = ()) -> StepPlan:
        """The plan of the step vLLM is about to run; ``num_scheduled_tokens`` is the step's
        ``SchedulerOutput.num_scheduled_tokens``, ``preempted`` its ``preempted_req_ids`` (requests
        whose blocks vLLM freed in this schedule). Resets the pending orders. Only plans: it neither
        waits nor writes files (an idle step is marked ``idle`` and the workers pause)."""
        self.role.preempted(preempted)
        self.role.scheduled(num_scheduled_tokens)
        return self.role.take_plan(idle=not num_scheduled_tokens)

    def request_finished(self, request: Any, block_ids: Sequence[int], length_capped: bool,
                         aborted: bool = False) -> Tuple[bool, Optional[Dict[str, Any]]]:
        """``length_capped``: vLLM's status is FINISHED_LENGTH_CAPPED (the prefill leg's max_tokens
        reached), the only case where MoRIIO's producer returns params; a request that stopped on its
        own first token needs no decode. ``aborted``: FINISHED_ABORTED (the client went away; only
        counted apart). The counters file is brought up to date here (see SchedulerRole.write_stats)."""
        out = self.role.request_finished(request, length_capped, aborted)
        self.role.write_stats()
        return out

    def shutdown(self) -> None:
        self.role.write_stats()

    @property
    def tracked_requests(self) -> int:
        """Producer requests between their allocation and request_finished (for tests and leaks)."""
        return self.role.tracked_requests
