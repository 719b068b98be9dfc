"""What the worker half's roles share: this rank's pdlink instance, its counters and timeline, and the
one order several roles carry out alike (a release).

:class:`WorkerRole` is the interface :class:`pdlink.vllm.worker.PdlinkWorker` calls, one method per
vLLM worker hook; :mod:`pdlink.vllm.worker_producer` and :mod:`pdlink.vllm.worker_consumer` implement
it, one class per role and mode. The defaults here are what a role with nothing to do in a hook does.
"""
from __future__ import annotations

import time
from typing import Any, Dict, Iterable, Set, Tuple

from pdlink.vllm.log import log
from pdlink.vllm.plan import ReleaseOrder, StepPlan

# Results of one poll: (finished_sending, finished_recving, failed_recving).
Results = Tuple[Set[str], Set[str], Set[str]]


class WorkerRole:
    """The state every worker-side role has. ``inst`` is this rank's pdlink instance (set at
    registration; tests set a fake)."""

    def __init__(self, tp_rank: int) -> None:
        self.tp_rank = tp_rank
        self.inst: Any = None
        # Set from the registered KV cache (PdlinkWorker.register_kv_caches): whether a block's rows past
        # the prompt can be zeroed, pdlink's layer index of each KV cache layer name, and whether vLLM
        # reports a layer's KV written from save_kv_layer (a host cache).
        self.zero_tail = True
        self.layer_of: Dict[str, int] = {}
        self.host_cache = False
        # The counters every role's file carries, whether or not the role moves them.
        self.stats: Dict[str, Any] = {"pulls": 0, "pulls_failed": 0, "holds": 0, "holds_failed": 0,
                                      "releases": 0, "freed": 0, "expired": 0, "pull_seconds": 0.0}
        self.dirty = False                  # counters changed since the counters file was written
        # Wall-clock times per transfer id (hold/freed on a prefill rank, pull issued/done on a decode
        # rank): the e2e script lines them up with its own request times to show where a request's time
        # goes. Bounded: the oldest entries are dropped.
        self.timeline: Dict[str, Dict[str, float]] = {}

    # ---- the vLLM hooks, as PdlinkWorker forwards them ------------------------------------------------

    def step_begins(self) -> None:
        """start_load_kv of a new step, before its plan is looked at."""
        return

    def start(self, plan: StepPlan) -> None:
        """start_load_kv: the orders that go before the step's forward (pdlink may start threads here)."""
        return

    def layer_saved(self, layer_name: str) -> None:
        """save_kv_layer: vLLM's attention layer ``layer_name`` wrote its KV for this step."""
        return

    def after_forward(self, plan: StepPlan) -> None:
        """wait_for_save: the orders that need the step's KV written."""
        return

    def poll(self, finished_req_ids: Set[str]) -> Results:
        """get_transfer_results: what finished since the last poll. ``finished_req_ids``: the requests
        vLLM reports finished in this step."""
        return set(), set(), set()

    def in_flight(self) -> Dict[str, int]:
        """The counters file's gauges: ``held_now`` (transfers this rank sends and pdlink still has) and
        ``pulls_in_flight`` (loads running)."""
        return {"held_now": 0, "pulls_in_flight": 0}

    def close(self) -> None:
        """Shutdown, before the instance is closed."""
        return

    # ---- shared by the roles -----------------------------------------------------------------------------

    def bump(self, key: str, by: float = 1) -> None:
        self.stats[key] = self.stats.get(key, 0) + by

    def mark(self, tid: str, what: str) -> None:
        self.timeline.setdefault(tid, {})[what] = time.time()
        while len(self.timeline) > 256:
            del self.timeline[next(iter(self.timeline))]

    def release_all(self, releases: Iterable[ReleaseOrder]) -> None:
        """Tell each release's peer now that its transfer will not be loaded (or pushed)."""
        for rel in releases:
            try:
                # WRITE: the request id carries the peer's address (vllm-router's ___*_addr_ parts).
                self.inst.abandon(rel.params, rel.request_id if rel.write else None)
                self.stats["releases"] += 1
            except Exception as e:  # the producer then frees after defer_timeout; nothing here waits on it
                log.warning("pdlink rank %d: release of request %s failed: %s", self.tp_rank, rel.request_id, e)
