"""The scheduler-process half of PdlinkConnector (READ and WRITE modes): pure bookkeeping, no transfer engine.

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

Consumer (``kv_role: kv_consumer``), for a request with ``do_remote_prefill`` (READ mode):
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

WRITE mode (``read_mode: false``; vllm-router sends both legs at once, each with the transfer id):
  * consumer: ``get_num_new_matched_tokens`` offers the prompt minus its last token as loaded
    asynchronously, as in READ mode; ``update_state_after_alloc`` queues an EXPECT of the allocated
    blocks: every worker sends them to its producer ranks (``remote_blocks``) and counts their
    ``write_done``. With a local prefix hit only the blocks past it are announced, and the producer
    writes the last that many of its pushed blocks into them (the same token positions). A request that
    will not receive (a full local hit, a one-token prompt, an abort before allocation) queues a RELEASE
    (a failed one: the prefill frees its push at once);
  * producer: the step that computes the last prompt token orders every worker to PUSH the blocks
    holding the prompt minus its last token (the decode recomputes that one) after the forward; the
    blocks stay allocated until the push is freed (written, or given up) -- ``request_finished``
    returns ``(True, None)`` whatever the finish status, since the decode waits for the push. A request
    that finishes before its push was ordered queues a RELEASE, which sends the decode a failed
    ``write_done`` so it stops waiting at once.

Parallel sampling (``n > 1``): vLLM runs a request as ``n`` child requests (``0_<id>``, ``1_<id>``, ...),
each carrying the router's one ``transfer_id``, and answers with the params of the child that finishes
last. Their prompts -- so their prompt KV -- are the same. The producer holds once per transfer id: the
first child to complete its prompt orders the HOLD, the others share it (they free their own blocks at
once and return the same params), so whichever child's params vLLM forwards name the one hold. The
consumer pulls once per transfer id: the first child pulls, its siblings recompute the prompt locally
(``sibling_recomputed``) rather than pull a transfer that the first pull's releases free.

``stats`` counts what the scheduler decided (aborts and preemptions among it); the workers count what
they did (pdlink.vllm.worker).
"""
from __future__ import annotations

import json
import logging
import os
import re
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

log = logging.getLogger("pdlink.vllm")

# How many transfer ids a consumer remembers as being pulled (siblings of an n > 1 request recompute).
_PULLING_CAP = 4096

_CHILD_ID = re.compile(r"^[0-9]+_(.+)$")


def _sharing_key(request_id: str, transfer_id: str) -> str:
    """What the children of one ``n > 1`` request have in common: vLLM names them ``<index>_<parent id>``
    and gives each the parent's params. Two requests share a hold or a pull only when both the transfer
    id and the parent id agree, so unrelated requests that (wrongly) reuse a transfer id never read each
    other's KV: the second HOLD is refused by pdlink as before."""
    m = _CHILD_ID.match(request_id)
    return f"{transfer_id}\0{m.group(1) if m else request_id}"


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
    """The transfer named by ``params`` will not be pulled (WRITE: received, or pushed): tell the peer now
    (a failed release; WRITE producer: a failed write_done). ``reason``: "unpulled" (nothing left to
    pull), "aborted" (the request finished before its pull, receive or push was ordered) or "failed"
    (params that do not cover the blocks)."""
    request_id: str
    params: Dict[str, Any]
    reason: str = "unpulled"
    write: bool = False          # a WRITE transfer: the request id names the peer's address


@dataclass
class DropOrder:
    """Producer: the request held ``transfer_id`` but finished without params (``reason``: "aborted",
    "stopped") or was preempted ("preempted"), and vLLM has freed or is freeing its blocks now. The
    workers forget the hold and end pdlink's record of it at once (``Instance.drop``: its grants are
    revoked, so no peer can read the blocks vLLM reuses); they must never report the request in
    ``finished_sending`` (vLLM has forgotten it)."""
    request_id: str
    transfer_id: str
    reason: str


@dataclass
class PushOrder:
    """WRITE producer: write ``block_ids`` (after this step's forward) to the decode that ``params`` and
    ``request_id`` (vllm-router's ``___decode_addr_`` part) name. ``num_tokens``: the prompt's length when
    the last pushed block is the prompt's last (the workers zero its rows past the prompt first); None
    when every pushed block is full."""
    request_id: str
    transfer_id: str
    params: Dict[str, Any]
    block_ids: List[int]
    num_tokens: Optional[int] = None


@dataclass
class ExpectOrder:
    """WRITE consumer: announce ``block_ids`` to the producer ranks and count their write_done."""
    request_id: str
    params: Dict[str, Any]
    block_ids: List[int]


@dataclass
class StepPlan:
    """What every worker does in one engine step. Plain data: vLLM pickles it to the workers."""
    pulls: List[PullOrder] = field(default_factory=list)
    holds: List[HoldOrder] = field(default_factory=list)
    releases: List[ReleaseOrder] = field(default_factory=list)
    drops: List[DropOrder] = field(default_factory=list)
    pushes: List[PushOrder] = field(default_factory=list)
    expects: List[ExpectOrder] = field(default_factory=list)
    # Requests told to wait for a load that cannot be made (params that do not cover the blocks): every
    # worker reports them as failed receives, and vLLM recomputes them (or fails them, per its policy).
    failed: List[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.pulls or self.holds or self.releases or self.failed or self.drops or self.pushes
                    or self.expects)


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


def dp_of(pc: Any) -> Tuple[int, int]:
    """This engine's DP rank and a DP size covering it. vLLM runs the DP ranks of a dense (non-MoE) model
    as independent engines, each reconfigured to data_parallel_rank 0 of size 1; its original rank stays
    in data_parallel_index. pdlink's ports are base + dp_rank * tp + rank, so the rank must be the
    original one, or every DP engine binds DP 0's ports. The original size is not kept: the size is at
    least rank + 1, which the params' remote_dp_rank needs; vLLM's front end then balances requests
    over its engines itself."""
    rank = int(getattr(pc, "data_parallel_index", pc.data_parallel_rank))
    return rank, max(int(pc.data_parallel_size), rank + 1)


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
class _Hold:
    """Producer: the one hold of a transfer id, shared by the children of an ``n > 1`` request."""
    users: int = 0                            # tracked requests naming the transfer id
    holder: Optional[str] = None              # the request that ordered the HOLD (its blocks are held)
    block_ids: List[int] = field(default_factory=list)
    dropped: bool = False                     # the HOLD was dropped: nobody may advertise it


@dataclass
class _Produced:
    transfer_id: str
    request: Any
    hold_key: str                             # its entry in _holds (see _sharing_key)
    held_ids: Optional[List[int]] = None      # set once the hold was ordered (or shared)
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
        self.write = not self.ep.read_mode
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
        self._holds: Dict[str, _Hold] = {}          # producer: by _sharing_key
        # Producer: holds whose requests all finished, kept (bounded) for a child of the same n > 1
        # request that reaches the engine only after its siblings finished: vLLM adds the children one by
        # one, and the engine may run a short prompt's child to its end before the next arrives. That
        # child shares the finished hold, which lives in pdlink until the decode's releases.
        self._done_holds: "OrderedDict[str, _Hold]" = OrderedDict()
        # Consumer: transfer ids already being pulled, with the request pulling each (bounded: a sibling
        # child is scheduled within a few steps of the first), and the siblings that recompute instead.
        self._pulling: "OrderedDict[str, str]" = OrderedDict()
        self._siblings: set = set()
        self._local_hit: Dict[str, int] = {}        # consumer: tokens the decode had cached itself
        self._loading: set = set()                  # consumer: requests a pull or receive was ordered for
        self._plan = StepPlan()
        # What this half decided, by cause (the e2e script reads them from the counters directory):
        # producer holds dropped at once ("dropped_aborted", "dropped_stopped", "dropped_preempted"),
        # producer requests preempted before their hold ("preempted_before_hold": they re-run and hold
        # at completion); consumer releases ordered by reason ("released_unpulled", "released_aborted",
        # "released_failed"), producer children that came after their siblings had finished and shared
        # their hold ("sibling_after_finish"), loads past a local prefix hit ("local_prefix_hit") and
        # loaded requests preempted ("preempted_after_load": they recompute locally).
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
        self._plan.releases.append(ReleaseOrder(rid, params, reason, self.write))
        self._count("released_" + reason)

    def _drop(self, rid: str, pr: _Produced, reason: str) -> None:
        self._plan.drops.append(DropOrder(rid, pr.transfer_id, reason))
        self._count("dropped_" + reason)

    # ---- both roles -------------------------------------------------------------------------------

    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> Tuple[int, bool]:
        if self.is_producer:
            return 0, False
        params = request.kv_transfer_params
        if not params or not params.get("do_remote_prefill"):
            return 0, False
        if not self.write and not params.get("remote_block_ids"):
            return 0, False
        rid = request.request_id
        tid = params.get("transfer_id")
        if tid:
            first = self._pulling.setdefault(_sharing_key(rid, str(tid)), rid)
            if first != rid:
                # Another child of the same n > 1 request pulls this transfer; its releases free the
                # prefill's hold, so a second pull could be denied mid-way. Recompute locally.
                if rid not in self._siblings:
                    self._siblings.add(rid)
                    self._count("sibling_recomputed")
                return 0, False
            while len(self._pulling) > _PULLING_CAP:
                self._pulling.popitem(last=False)
        self._local_hit[rid] = num_computed_tokens
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
                tid = str(params.get("transfer_id") or f"pdl-{rid}")
                key = _sharing_key(rid, tid)
                self._produced[rid] = _Produced(tid, request, key)
                if key not in self._holds:
                    done = self._done_holds.pop(key, None)
                    if done is not None:
                        self._count("sibling_after_finish")
                    self._holds[key] = done or _Hold()
                self._holds[key].users += 1
            return
        if not params.get("do_remote_prefill"):
            return
        params["do_remote_prefill"] = False
        if rid in self._siblings:
            return                   # the first child pulls and releases; this one recomputes
        local_hit = self._local_hit.pop(rid, 0)
        snapshot = dict(params, do_remote_prefill=True)
        if num_external_tokens <= 0:
            self._release(rid, snapshot, "unpulled")
            return
        bs = self.block_size
        first = local_hit // bs      # vLLM's local prefix hits are whole blocks
        end = -(-(local_hit + num_external_tokens) // bs)
        if local_hit > 0:
            self._count("local_prefix_hit")
        if self.write:
            # The blocks past the local hit only (the first ones are cached here, possibly shared with
            # other requests, and must not be written). The producer pushes the prompt minus its last
            # token and writes the last len(announced) of its blocks into them: the same token positions.
            if len(block_ids) < end:
                log.error("request %s: blocks %d..%d to receive, but %d allocated; reporting its load as "
                          "failed", rid, first, end - 1, len(block_ids))
                self._release(rid, snapshot, "failed")
                self._plan.failed.append(rid)
                return
            self._plan.expects.append(ExpectOrder(rid, snapshot, [int(b) for b in block_ids[first:end]]))
            self._loading.add(rid)
            return
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
        self._loading.add(rid)

    def build_connector_meta(self, num_scheduled_tokens: Mapping[str, int],
                             preempted: Iterable[str] = ()) -> StepPlan:
        """The plan of the step vLLM is about to run; ``num_scheduled_tokens`` is the step's
        ``SchedulerOutput.num_scheduled_tokens``, ``preempted`` its ``preempted_req_ids`` (requests
        whose blocks vLLM freed in this schedule). Resets the pending orders. An empty step with nothing
        to order pauses ``idle_step_s`` first (see __init__)."""
        if not self.is_producer:
            for rid in preempted:
                if rid in self._loading:
                    # Loaded (vLLM preempts running requests only): its blocks went, and it recomputes
                    # prompt and output locally (do_remote_prefill is off). The prefill was released by
                    # the load already: nothing to tell anyone.
                    self._count("preempted_after_load")
        else:
            for rid in preempted:
                pr = self._produced.get(rid)
                if pr is None or pr.dropped:
                    continue
                if pr.held_ids is None:
                    # Nothing held yet (a chunked prefill cut short): it re-runs from its first token,
                    # update_state_after_alloc sees it again, and it holds when it completes.
                    self._count("preempted_before_hold")
                elif self._holds[pr.hold_key].holder != rid:
                    # A sibling sharing another child's hold: only its own blocks went; it re-runs and
                    # shares again when it completes.
                    pr.held_ids = None
                    self._count("preempted_before_hold")
                else:
                    # Its blocks are free in vLLM already and may be reused: the hold must go now, and
                    # the request must never give params (its recomputed blocks are not the held ones).
                    pr.dropped = True
                    self._holds[pr.hold_key].dropped = True
                    if self.write:
                        # The push may be writing from blocks vLLM has freed: give it up (the decode
                        # gets a failed write_done and recomputes, unless a rank had already written).
                        self._release(rid, dict(pr.request.kv_transfer_params or {}), "preempted")
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
                    hold = self._holds[pr.hold_key]
                    if hold.dropped:
                        pr.dropped = True              # a sibling's hold went: no params for anyone
                    elif hold.holder is not None:
                        pr.held_ids = hold.block_ids   # a sibling holds the same prompt's KV
                    else:
                        ids = list(self._block_ids_of(rid)) if self._block_ids_of else []
                        ids = ids[:-(-req.num_prompt_tokens // self.block_size)]
                        pr.held_ids = hold.block_ids = [int(b) for b in ids]
                        hold.holder = rid
                        if self.write:
                            # The decode recomputes the last prompt token: it announced the blocks
                            # of the prompt minus that token.
                            p_len = int(req.num_prompt_tokens)
                            n_push = -(-(p_len - 1) // self.block_size)
                            # Rows to zero exist only when the last pushed block is the prompt's last,
                            # partial one (a full block may be in vLLM's prefix cache: never touched).
                            tail = p_len if -(-p_len // self.block_size) == n_push else None
                            if n_push > 0:
                                self._plan.pushes.append(PushOrder(rid, pr.transfer_id, dict(req.kv_transfer_params),
                                                                   pr.held_ids[:n_push], tail))
                        else:
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
            self._loading.discard(rid)
            if rid in self._siblings:
                self._siblings.discard(rid)
                if params:
                    params["do_remote_prefill"] = False
                return False, None
            if params and params.get("do_remote_prefill"):
                # Finished (aborted) before any block was allocated: the prefill still holds its blocks.
                params["do_remote_prefill"] = False
                self._release(rid, dict(params, do_remote_prefill=True), "aborted")
            return False, None
        pr = self._produced.pop(rid, None)
        if pr is None:
            return False, None
        hold = self._holds[pr.hold_key]
        hold.users -= 1
        if hold.users == 0:
            del self._holds[pr.hold_key]
            if hold.holder is not None:
                self._done_holds[pr.hold_key] = hold
                while len(self._done_holds) > _PULLING_CAP:
                    self._done_holds.popitem(last=False)
        if self.write:
            if pr.dropped:
                return False, None
            if hold.holder == rid and pr.held_ids and request.num_prompt_tokens > 1:
                # The push was ordered and the decode waits for it: the blocks stay until it is freed.
                # (A one-token prompt pushes nothing: the decode recomputes its only token.)
                return True, None
            if hold.holder is None and hold.users == 0:
                # No child pushed and none will: tell the decode now rather than at its timeout.
                self._release(rid, dict(params or {}), "aborted")
            return False, None
        if pr.held_ids is None or pr.dropped:
            return False, None
        if hold.holder != rid:
            # A sibling sharing the holder's hold: its own blocks are free at once; its params are the
            # holder's, so whichever child's params vLLM forwards name the one hold.
            if not length_capped or hold.dropped:
                return False, None
            return False, transfer_params(self.ep, transfer_id=pr.transfer_id, block_ids=hold.block_ids,
                                          tp_size=self.tp_size, dp_rank=self.dp_rank, dp_size=self.dp_size)
        if not length_capped:
            hold.dropped = True
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
