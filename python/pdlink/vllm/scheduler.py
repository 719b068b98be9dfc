"""The scheduler-process half of PdlinkConnector (READ mode): pure bookkeeping, no transfer engine.

vLLM's scheduler process owns the block ids but no KV memory; the worker processes (one per TP rank)
own the memory and a pdlink instance each. This half decides, step by step, what the workers must do
and hands it to them in the step's connector metadata (a :class:`StepPlan`):

Producer (``kv_role: kv_producer``), for a request whose kv_transfer_params carry ``do_remote_decode``:
  * ``update_state_after_alloc`` starts tracking it under its transfer id (the router's ``transfer_id``);
  * ``build_connector_meta`` of the step that computes its last prompt token orders every worker to
    HOLD the prompt's blocks (the workers do it in ``wait_for_save``, after that step's forward wrote
    the KV). The hold therefore exists before the step's output -- and so the response carrying the
    params -- leaves the engine: a decode's pull can never reach a block that is not held yet;
  * ``request_finished`` returns ``(True, params)``: the blocks stay allocated until every worker
    reports the transfer freed (pdlink's release fan-in, or defer_timeout), and the params are the ones
    pdlink's own ``Instance.params`` returns, so vllm-router's MoRIIO mode forwards them unchanged;
  * a held request that ends any other way (aborted by its client, stopped on its own first token) or
    is preempted gives its params to nobody, so no decode can ever pull it: ``request_finished``
    returns ``(False, None)`` (vLLM frees the blocks at once, as NixlConnector's producer does) and the
    next plan orders the workers to DROP the hold from their books (see :class:`DropOrder`).

Consumer (``kv_role: kv_consumer``), for a request with ``do_remote_prefill``:
  * ``get_num_new_matched_tokens`` offers the prompt minus its last token (vLLM recomputes the last
    token locally to sample the first output, as MoRIIO's and NIXL's READ modes do) as loaded
    asynchronously: the request waits in WAITING_FOR_REMOTE_KVS until the pull is done;
  * ``update_state_after_alloc`` pairs the local blocks with the remote ones by token position (a
    prefix the decode already had cached is not pulled) and queues a PULL;
  * a request that ends up pulling nothing (a one-token prompt, a full local prefix hit, an abort
    before allocation) queues a RELEASE instead, so the prefill frees its blocks at once rather than
    after defer_timeout. A request aborted while its pull runs needs nothing here: vLLM keeps its blocks
    until the worker reports the pull finished (``finish_requests`` delays the free of a request in
    WAITING_FOR_REMOTE_KVS), and the pull's own releases free the prefill's blocks. A decode request
    preempted after its load recomputes locally (its ``do_remote_prefill`` is off by then).

``stats`` counts what the scheduler decided (aborts and preemptions among it); the workers count what
they did (pdlink.vllm.worker).
"""
from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

log = logging.getLogger("pdlink.vllm")


@dataclass
class PullOrder:
    """Read ``params``' transfer into ``block_ids`` (this instance's ids, paired one to one with
    ``params["remote_block_ids"]``)."""
    request_id: str
    params: Dict[str, Any]
    block_ids: List[int]


@dataclass
class HoldOrder:
    """Hold ``block_ids`` under ``transfer_id`` (after this step's forward wrote their KV). ``num_tokens``:
    the prompt's length, so the workers zero the last block's rows past it before the hold."""
    request_id: str
    transfer_id: str
    block_ids: List[int]
    num_tokens: Optional[int] = None


@dataclass
class ReleaseOrder:
    """The transfer named by ``params`` will not be pulled: tell the producer to free it now (a failed
    release). ``reason``: "unpulled" (nothing left to pull), "aborted" (the request finished before its
    pull was ordered) or "failed" (params that do not cover the blocks)."""
    request_id: str
    params: Dict[str, Any]
    reason: str = "unpulled"


@dataclass
class DropOrder:
    """Producer: the request held ``transfer_id`` but finished without params (``reason``: "aborted",
    "stopped") or was preempted ("preempted"), and vLLM has freed or is freeing its blocks now. The
    workers forget the hold: they must never report the request in ``finished_sending`` (vLLM has
    forgotten it) nor count its end as a defer_timeout expiry. pdlink's own record of the hold names
    vLLM's blocks (``external_blocks``) and lapses at defer_timeout; no decode can reach it before, since
    only the params -- never given out for it -- name its blocks."""
    request_id: str
    transfer_id: str
    reason: str


@dataclass
class StepPlan:
    """What every worker does in one engine step. Plain data: vLLM pickles it to the workers."""
    pulls: List[PullOrder] = field(default_factory=list)
    holds: List[HoldOrder] = field(default_factory=list)
    releases: List[ReleaseOrder] = field(default_factory=list)
    drops: List[DropOrder] = field(default_factory=list)
    # Requests told to wait for a load that cannot be made (params that do not cover the blocks): every
    # worker reports them as failed receives, and vLLM recomputes them (or fails them, per its policy).
    failed: List[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.pulls or self.holds or self.releases or self.failed or self.drops)


@dataclass(frozen=True)
class Endpoint:
    """Where this instance's rank 0 listens, as the params name it (ranks add their offsets)."""
    host: str
    handshake_port: int
    notify_port: int
    role: str            # "producer" or "consumer"
    read_mode: bool


def parse_endpoint(config: Mapping[str, Any]) -> Endpoint:
    """Validate the whole --kv-transfer-config with libpdlink's own parser (so a bad key fails here, in
    the scheduler, with pdlink's message naming it) and return what the params need. Raises
    :class:`pdlink.InvalidError`."""
    import pdlink

    c = pdlink.connector_config(config)
    return Endpoint(host=c["host_ip"], handshake_port=c["handshake_port"], notify_port=c["notify_port"],
                    role=c["role"], read_mode=c["read_mode"])


def transfer_params(ep: Endpoint, *, transfer_id: str, block_ids: Sequence[int], tp_size: int, dp_rank: int,
                    dp_size: int) -> Dict[str, Any]:
    """The kv_transfer_params a READ-mode prefill returns: the same keys and values as pdlink's
    ``Instance.params`` (``pdl_instance_params`` + ``pdl_kv_params_to_json``), computed from the config
    alone because the scheduler process has no instance. ``remote_engine_id`` is ``host:handshake_base``,
    the id each producer rank's handshake answers with (a consumer refuses a mismatch)."""
    return {
        "do_remote_prefill": True,
        "do_remote_decode": False,
        "remote_block_ids": [int(b) for b in block_ids],
        "remote_engine_id": f"{ep.host}:{ep.handshake_port}",
        "remote_host": ep.host,
        "remote_handshake_port": ep.handshake_port,
        "remote_notify_port": ep.notify_port,
        "remote_dp_size": max(dp_size, 1),
        "tp_size": tp_size,
        "transfer_id": transfer_id,
        "remote_dp_rank": dp_rank,
    }


@dataclass
class _Produced:
    transfer_id: str
    request: Any
    held_ids: Optional[List[int]] = None      # set once the hold was ordered
    dropped: bool = False                     # preempted after its hold: it will never give params


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
        if not self.ep.read_mode:
            raise ValueError("PdlinkConnector: kv_connector_extra_config.read_mode is false, but only READ "
                             "mode is implemented in vLLM (set \"read_mode\": true)")
        self.is_producer = self.ep.role == "producer"
        self.tp_size = tp_size
        self.dp_rank = dp_rank
        self.dp_size = dp_size
        self.block_size = block_size
        self._block_ids_of = block_ids_of
        # Seconds to pause in an empty step (one vLLM runs only to poll the workers for transfers: a
        # prefill's held blocks waiting for the decode's releases, a decode waiting for its pull). vLLM
        # steps back to back then, its engine and every worker spinning; on a small CPU machine that
        # starves the very processes that must finish the transfer (measured on this 2-vCPU VM: a TP2
        # prefill spinning while it waited made the decode's pull start only when defer_timeout freed
        # the hold, 60 s later). PDLINK_VLLM_IDLE_STEP_MS overrides; 0 disables.
        self.idle_step_s = float(os.environ.get("PDLINK_VLLM_IDLE_STEP_MS", "10")) / 1000.0
        self._produced: Dict[str, _Produced] = {}
        self._local_hit: Dict[str, int] = {}        # consumer: tokens the decode had cached itself
        self._plan = StepPlan()
        # What this half decided, by cause (the e2e script reads them from the counters directory):
        # producer holds dropped at once ("dropped_aborted", "dropped_stopped", "dropped_preempted"),
        # producer requests preempted before their hold ("preempted_before_hold": they re-run and hold
        # at completion); consumer releases ordered by reason ("released_unpulled", "released_aborted",
        # "released_failed").
        self.stats: Dict[str, int] = {}
        d = os.environ.get("PDLINK_VLLM_COUNTERS_DIR")
        self.stats_path = (os.path.join(d, f"{config.get('kv_role', 'kv')}-dp{dp_rank}-scheduler.json")
                           if d else None)

    def _count(self, what: str) -> None:
        self.stats[what] = self.stats.get(what, 0) + 1
        if self.stats_path:
            # Rare events (aborts, preemptions, unpulled transfers): the whole file each time.
            tmp = self.stats_path + ".tmp"
            with open(tmp, "w") as f:
                json.dump({"role": self.ep.role, "dp_rank": self.dp_rank, "scheduler": self.stats}, f,
                          sort_keys=True)
            os.replace(tmp, self.stats_path)

    def _release(self, rid: str, params: Dict[str, Any], reason: str) -> None:
        self._plan.releases.append(ReleaseOrder(rid, params, reason))
        self._count("released_" + reason)

    def _drop(self, rid: str, pr: _Produced, reason: str) -> None:
        self._plan.drops.append(DropOrder(rid, pr.transfer_id, reason))
        self._count("dropped_" + reason)

    # ---- both roles -------------------------------------------------------------------------------

    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> Tuple[int, bool]:
        if self.is_producer:
            return 0, False
        params = request.kv_transfer_params
        if not params or not params.get("do_remote_prefill") or not params.get("remote_block_ids"):
            return 0, False
        self._local_hit[request.request_id] = num_computed_tokens
        n = request.num_prompt_tokens - 1 - num_computed_tokens
        # vLLM requires False whenever the count is 0; update_state_after_alloc then queues the release.
        return (n, True) if n > 0 else (0, False)

    def update_state_after_alloc(self, request: Any, block_ids: Sequence[int], num_external_tokens: int) -> None:
        params = request.kv_transfer_params
        if not params:
            return
        rid = request.request_id
        if self.is_producer:
            if params.get("do_remote_decode") and rid not in self._produced:
                tid = params.get("transfer_id") or f"pdl-{rid}"
                self._produced[rid] = _Produced(str(tid), request)
            return
        if not params.get("do_remote_prefill"):
            return
        params["do_remote_prefill"] = False
        local_hit = self._local_hit.pop(rid, 0)
        snapshot = dict(params, do_remote_prefill=True)
        if num_external_tokens <= 0:
            self._release(rid, snapshot, "unpulled")
            return
        bs = self.block_size
        first = local_hit // bs      # vLLM's local prefix hits are whole blocks
        end = -(-(local_hit + num_external_tokens) // bs)
        local = [int(b) for b in block_ids[first:end]]
        remote = [int(b) for b in (params.get("remote_block_ids") or [])]
        if remote and isinstance(remote[0], list):    # MoRIIO's per-group form: one group here
            remote = remote[0]
        if len(local) != end - first or len(remote) < end:
            log.error("request %s: blocks %d..%d to pull, but %d local and %d remote blocks; reporting "
                      "its load as failed", rid, first, end - 1, len(block_ids), len(remote))
            self._release(rid, snapshot, "failed")
            self._plan.failed.append(rid)
            return
        snapshot["remote_block_ids"] = remote[first:end]
        self._plan.pulls.append(PullOrder(rid, snapshot, local))

    def build_connector_meta(self, num_scheduled_tokens: Mapping[str, int],
                             preempted: Iterable[str] = ()) -> StepPlan:
        """The plan of the step vLLM is about to run; ``num_scheduled_tokens`` is the step's
        ``SchedulerOutput.num_scheduled_tokens``, ``preempted`` its ``preempted_req_ids`` (requests
        whose blocks vLLM freed in this schedule). Resets the pending orders. An empty step with nothing
        to order pauses ``idle_step_s`` first (see __init__)."""
        if self.is_producer:
            for rid in preempted:
                pr = self._produced.get(rid)
                if pr is None or pr.dropped:
                    continue
                if pr.held_ids is None:
                    # Nothing held yet (a chunked prefill cut short): it re-runs from its first token,
                    # update_state_after_alloc sees it again, and it holds when it completes.
                    self._count("preempted_before_hold")
                else:
                    # Its blocks are free in vLLM already and may be reused: the hold must go now, and
                    # the request must never give params (its recomputed blocks are not the held ones).
                    pr.dropped = True
                    self._drop(rid, pr, "preempted")
        if not num_scheduled_tokens and not self._plan and self.idle_step_s > 0:
            time.sleep(self.idle_step_s)
        if self.is_producer:
            for rid, pr in self._produced.items():
                n = num_scheduled_tokens.get(rid, 0)
                req = pr.request
                # Called before vLLM advances num_computed_tokens: this step computes the last prompt
                # token iff computed + scheduled reaches the prompt length.
                if (pr.held_ids is None and not pr.dropped and n > 0
                        and req.num_computed_tokens + n >= req.num_prompt_tokens):
                    ids = list(self._block_ids_of(rid)) if self._block_ids_of else []
                    ids = ids[:-(-req.num_prompt_tokens // self.block_size)]
                    pr.held_ids = [int(b) for b in ids]
                    self._plan.holds.append(HoldOrder(rid, pr.transfer_id, pr.held_ids,
                                                      int(req.num_prompt_tokens)))
        plan, self._plan = self._plan, StepPlan()
        return plan

    def request_finished(self, request: Any, block_ids: Sequence[int], length_capped: bool,
                         aborted: bool = False) -> Tuple[bool, Optional[Dict[str, Any]]]:
        """``length_capped``: vLLM's status is FINISHED_LENGTH_CAPPED (the prefill leg's max_tokens
        reached), the only case where MoRIIO's producer returns params; a request that stopped on its
        own first token needs no decode. ``aborted``: FINISHED_ABORTED (the client went away; only
        counted apart)."""
        rid = request.request_id
        params = request.kv_transfer_params
        if not self.is_producer:
            self._local_hit.pop(rid, None)
            if params and params.get("do_remote_prefill"):
                # Finished (aborted) before any block was allocated: the prefill still holds its blocks.
                params["do_remote_prefill"] = False
                self._release(rid, dict(params, do_remote_prefill=True), "aborted")
            return False, None
        pr = self._produced.pop(rid, None)
        if pr is None or pr.held_ids is None or pr.dropped:
            return False, None
        if not length_capped:
            # Held, but no params leave the engine, so no decode will ever pull or release it: free the
            # blocks now rather than at defer_timeout.
            self._drop(rid, pr, "aborted" if aborted else "stopped")
            return False, None
        # Held and advertised: the workers own the blocks until they report the transfer freed (the
        # decode's releases, or defer_timeout when no decode comes).
        if not pr.held_ids:
            return True, None
        return True, transfer_params(self.ep, transfer_id=pr.transfer_id, block_ids=pr.held_ids,
                                     tp_size=self.tp_size, dp_rank=self.dp_rank, dp_size=self.dp_size)

    @property
    def tracked_requests(self) -> int:
        """Producer requests between their allocation and request_finished (for tests and leaks)."""
        return len(self._produced)
