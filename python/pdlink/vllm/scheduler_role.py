"""What the scheduler half's roles share: the plan being filled for the next step, the counters, and
the two orders both roles give (a release, a drop).

:class:`SchedulerRole` is the interface :class:`pdlink.vllm.scheduler.PdlinkScheduler` calls, one
method per vLLM hook; :mod:`pdlink.vllm.scheduler_producer` and :mod:`pdlink.vllm.scheduler_consumer`
implement it, one class per role and mode. The defaults here are what a role with nothing to do in a
hook does.
"""
from __future__ import annotations

import json
import os
import re
from typing import Any, Callable, Dict, Iterable, Mapping, Optional, Sequence, Tuple

from pdlink.vllm.params import Endpoint
from pdlink.vllm.plan import DropOrder, ReleaseOrder, StepPlan

# How many transfer ids a role remembers past their requests (the consumer's pulls, the producer's
# finished holds), for the children of an n > 1 request: a sibling reaches the engine within a few steps.
SIBLING_MEMORY = 4096

_CHILD_ID = re.compile(r"^[0-9]+_(.+)$")


def sharing_key(request_id: str, transfer_id: str) -> str:
    """What the children of one ``n > 1`` request have in common: vLLM names them ``<index>_<parent id>``
    and gives each the parent's params. Two requests share a hold or a pull only when both the transfer
    id and the parent id agree, so unrelated requests that (wrongly) reuse a transfer id never read each
    other's KV: the second HOLD is refused by pdlink as before."""
    m = _CHILD_ID.match(request_id)
    return f"{transfer_id}\0{m.group(1) if m else request_id}"


class SchedulerRole:
    """The state and helpers every scheduler-side role has. ``block_ids_of(request_id)``: the request's
    current block ids (vLLM: ``kv_cache_manager.get_block_ids(id)[0]``), asked only while planning a
    step. ``stats_path``: where the counters are written (None: nowhere)."""

    def __init__(self, ep: Endpoint, *, tp_size: int, block_size: int, dp_rank: int, dp_size: int,
                 block_ids_of: Optional[Callable[[str], Sequence[int]]], stats_path: Optional[str]) -> None:
        self.ep = ep
        self.write = not ep.read_mode
        self.tp_size = tp_size
        self.block_size = block_size
        self.dp_rank = dp_rank
        self.dp_size = dp_size
        self.block_ids_of = block_ids_of
        self.plan = StepPlan()
        # What this half decided, by cause (the e2e script reads them from the counters directory):
        # producer holds dropped at once ("dropped_aborted", "dropped_stopped", "dropped_preempted"),
        # producer requests preempted before their hold ("preempted_before_hold": they re-run and hold
        # at completion); consumer releases ordered by reason ("released_unpulled", "released_aborted",
        # "released_failed"), producer children that came after their siblings had finished and shared
        # their hold ("sibling_after_finish"), consumer children that recompute rather than pull a
        # sibling's transfer ("sibling_recomputed"), loads past a local prefix hit ("local_prefix_hit")
        # and loaded requests preempted ("preempted_after_load": they recompute locally).
        self.stats: Dict[str, int] = {}
        self.stats_path = stats_path
        self._stats_dirty = False

    # ---- the vLLM hooks, as PdlinkScheduler forwards them ---------------------------------------------

    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> Tuple[int, bool]:
        return 0, False

    def update_state_after_alloc(self, request: Any, block_ids: Sequence[int], num_external_tokens: int) -> None:
        return

    def preempted(self, request_ids: Iterable[str]) -> None:
        """vLLM freed these requests' blocks in the schedule being planned."""
        return

    def scheduled(self, num_scheduled_tokens: Mapping[str, int]) -> None:
        """The step computes ``num_scheduled_tokens[id]`` tokens of each request: order what it completes."""
        return

    def request_finished(self, request: Any, length_capped: bool,
                         aborted: bool) -> Tuple[bool, Optional[Dict[str, Any]]]:
        return False, None

    @property
    def tracked_requests(self) -> int:
        """Producer requests between their allocation and request_finished (for tests and leaks)."""
        return 0

    # ---- shared by the roles -----------------------------------------------------------------------------

    def take_plan(self, idle: bool) -> StepPlan:
        """The orders given since the last call (and a fresh plan for the next step). ``idle``: the step
        computes no token; the plan says so when it orders nothing either."""
        plan, self.plan = self.plan, StepPlan()
        plan.idle = idle and not plan
        return plan

    def count(self, what: str) -> None:
        self.stats[what] = self.stats.get(what, 0) + 1
        self._stats_dirty = True

    def write_stats(self) -> None:
        """Rewrite the counters file when something was counted since the last write. Called when a
        request finishes, not while a step is planned: every counted event concerns a request that
        finishes later (or in that call), so the file is current before the request's response leaves
        the engine, which is when the e2e script reads it."""
        if not (self._stats_dirty and self.stats_path):
            return
        tmp = self.stats_path + ".tmp"
        with open(tmp, "w") as f:
            json.dump({"role": self.ep.role, "dp_rank": self.dp_rank, "scheduler": self.stats}, f,
                      sort_keys=True)
        os.replace(tmp, self.stats_path)
        self._stats_dirty = False

    def release(self, request_id: str, params: Dict[str, Any], reason: str) -> None:
        self.plan.releases.append(ReleaseOrder(request_id, params, reason, self.write))
        self.count("released_" + reason)

    def drop(self, request_id: str, transfer_id: str, reason: str) -> None:
        self.plan.drops.append(DropOrder(request_id, transfer_id, reason))
        self.count("dropped_" + reason)
