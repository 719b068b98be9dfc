"""The worker half of a consumer (the decode, one per TP rank): loads a prompt's KV into vLLM's blocks,
:class:`ReadConsumer` by pulling the prefill's held blocks, :class:`WriteConsumer` by announcing its
blocks to the prefill ranks and counting their ``write_done``.

Each request's load is one :class:`Load` record, from the step that orders it to the poll that
reports it:

  ordered (start_load_kv) --> running --wait(0) true--> done ----> reported in finished_recving
        |                        |
        | refused                | raised
        v                        v
      failed <-------------------+  ---------------------------> reported in finished_recving
                                                                  and failed_recving

A request the plan lists as ``failed`` (params that do not cover its blocks) starts as failed. Failed
loads are in both sets, as vLLM's KVConnectorTransferResults wants: vLLM then recomputes or fails the
request, it never decodes from a partial cache. Loads run in pdlink's threads while vLLM computes other
requests.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Set

from pdlink.vllm.log import log
from pdlink.vllm.plan import StepPlan
from pdlink.vllm.worker_role import Results, WorkerRole


@dataclass
class Load:
    """One request's pull (READ) or receive (WRITE) on this rank."""
    transfer_id: Optional[str]
    handle: Any = None                   # the pdlink Pull or receive while it runs
    started: float = 0.0                 # time.monotonic() when it started
    outcome: Optional[str] = None        # "done" or "failed" once known, until reported


class Consumer(WorkerRole):
    """What READ and WRITE consumers do alike; :meth:`_orders` and :meth:`_begin` are the mode's."""

    what = "load"            # the load's name in log lines
    issued = "load_issued"   # its timeline mark

    def __init__(self, tp_rank: int) -> None:
        super().__init__(tp_rank)
        self.loads: Dict[str, Load] = {}          # by request id

    def start(self, plan: StepPlan) -> None:
        self.release_all(plan.releases)
        for rid in plan.failed:
            self.loads[rid] = Load(None, outcome="failed")
        for order in self._orders(plan):
            self._start(order)

    def _start(self, order: Any) -> None:
        """Start a request's load and track it until poll sees it done; one that cannot start is
        reported failed at once."""
        rid = order.request_id
        tid = str(order.params.get("transfer_id"))
        try:
            handle = self._begin(order)
        except Exception as e:
            log.error("pdlink rank %d: %s of request %s (transfer %s) refused: %s", self.tp_rank, self.what,
                      rid, tid, e)
            self.loads[rid] = Load(tid, outcome="failed")
            return
        self.loads[rid] = Load(tid, handle, time.monotonic())
        self.mark(tid, self.issued)

    def poll(self, finished_req_ids: Set[str]) -> Results:
        for rid, ld in self.loads.items():
            if ld.handle is not None:
                self._check(rid, ld)
        recving = {rid for rid, ld in self.loads.items() if ld.outcome is not None}
        failed = {rid for rid in recving if self.loads[rid].outcome == "failed"}
        for rid in recving:
            del self.loads[rid]
        return set(), recving, failed

    def _check(self, rid: str, ld: Load) -> None:
        try:
            done = ld.handle.wait(0)
        except Exception as e:
            log.error("pdlink rank %d: pull of request %s failed: %s", self.tp_rank, rid, e)
            ld.outcome = "failed"
            done = True
        if not done:
            return
        self.stats["pull_seconds"] += time.monotonic() - ld.started
        if ld.outcome is None:
            ld.outcome = "done"
            self.stats["pulls"] += 1
        else:
            self.stats["pulls_failed"] += 1
        ld.handle.close()
        ld.handle = None
        self.mark(str(ld.transfer_id), "pull_done" if ld.outcome == "done" else "pull_failed")
        self.dirty = True

    def in_flight(self) -> Dict[str, int]:
        return {"held_now": 0, "pulls_in_flight": sum(ld.handle is not None for ld in self.loads.values())}

    def close(self) -> None:
        for ld in self.loads.values():
            if ld.handle is not None:
                ld.handle.close()
                ld.handle = None

    # ---- the mode's part -----------------------------------------------------------------------------

    def _orders(self, plan: StepPlan) -> List[Any]:
        """The plan's loads for this mode."""
        raise NotImplementedError

    def _begin(self, order: Any) -> Any:
        """Start ``order``'s load; return its handle (``wait(timeout)``, ``close()``)."""
        raise NotImplementedError


class ReadConsumer(Consumer):
    """READ: pull the prefill's held blocks (PullOrder)."""

    what, issued = "pull", "pull_issued"

    def _orders(self, plan: StepPlan) -> List[Any]:
        return plan.pulls

    def _begin(self, order: Any) -> Any:
        return self.inst.pull(order.params, order.block_ids, None)


class WriteConsumer(Consumer):
    """WRITE: announce the blocks the prefill writes into and count its write_done (ExpectOrder)."""

    what, issued = "receive", "expect_issued"

    def _orders(self, plan: StepPlan) -> List[Any]:
        return plan.expects

    def _begin(self, order: Any) -> Any:
        return self.inst.expect_push(order.params, order.block_ids, order.request_id)
