"""The scheduler half of a consumer (``kv_role: kv_consumer``, the decode): :class:`ReadConsumer` pulls a
prompt's KV from the prefill's held blocks, :class:`WriteConsumer` announces its blocks and waits for
the prefill's push.

Both, for a request with ``do_remote_prefill`` (one :class:`Decoding` record from
``get_num_new_matched_tokens`` to ``request_finished``):
  * ``get_num_new_matched_tokens`` offers the prompt minus its last token (vLLM recomputes the last
    token locally to sample the first output, as MoRIIO's and NIXL's READ modes do) as loaded
    asynchronously: the request waits in WAITING_FOR_REMOTE_KVS until the load is done;
  * ``update_state_after_alloc`` orders the load of the blocks past the local prefix hit (vLLM's own
    prefix cache; those blocks may be shared with other requests and are never loaded into);
  * a request that ends up loading nothing (a one-token prompt, a full local prefix hit, an abort
    before allocation) queues a RELEASE instead, so the prefill frees its blocks (READ) or its push
    (WRITE: a failed release) at once rather than after a timeout. A request aborted while its load
    runs needs nothing here: vLLM keeps its blocks until the worker reports the load finished
    (``finish_requests`` delays the free of a request in WAITING_FOR_REMOTE_KVS), and the load's own
    releases free the prefill's. A request preempted after its load recomputes locally (its
    ``do_remote_prefill`` is off by then).

READ (:class:`ReadConsumer`): the load is a PULL; the local blocks are paired with the remote ones by
token position (a prefix the decode already had cached is not pulled).

WRITE (:class:`WriteConsumer`): the load is an EXPECT of the allocated blocks: every worker sends them to
its producer ranks (``remote_blocks``) and counts their ``write_done``. With a local prefix hit only the
blocks past it are announced, and the producer writes the last that many of its pushed blocks into them
(the same token positions).

Parallel sampling (``n > 1``): the consumer loads once per transfer id: the first child loads, its
siblings recompute the prompt locally (``sibling_recomputed``) rather than load a transfer that the
first load's releases free.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Dict, Iterable, Mapping, Optional, Sequence, Tuple

from pdlink.vllm.log import log
from pdlink.vllm.plan import ExpectOrder, PullOrder
from pdlink.vllm.scheduler_role import SIBLING_MEMORY, SchedulerRole, sharing_key


@dataclass
class Decoding:
    """One consumer request with ``do_remote_prefill``, from get_num_new_matched_tokens to request_finished."""
    local_hit: int = 0       # prompt tokens the decode had cached itself
    sibling: bool = False    # another child of its n > 1 request loads the transfer: this one recomputes
    loading: bool = False    # its pull or receive was ordered


class Consumer(SchedulerRole):
    """What READ and WRITE consumers do alike; :meth:`_has_source` and :meth:`_order` are the mode's."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.decoding: Dict[str, Decoding] = {}
        # Transfer ids already being loaded (by sharing_key), with the request loading each; bounded, as a
        # sibling child is scheduled within a few steps of the first.
        self.loading_transfers: "OrderedDict[str, str]" = OrderedDict()

    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> Tuple[int, bool]:
        params = request.kv_transfer_params
        if not params or not params.get("do_remote_prefill") or not self._has_source(params):
            return 0, False
        rid = request.request_id
        rec = self.decoding.setdefault(rid, Decoding())
        tid = params.get("transfer_id")
        if tid:
            first = self.loading_transfers.setdefault(sharing_key(rid, str(tid)), rid)
            if first != rid:
                # Another child of the same n > 1 request loads this transfer; its releases free the
                # prefill's hold, so a second pull could be denied mid-way. Recompute locally.
                if not rec.sibling:
                    rec.sibling = True
                    self.count("sibling_recomputed")
                return 0, False
            while len(self.loading_transfers) > SIBLING_MEMORY:
                self.loading_transfers.popitem(last=False)
        rec.local_hit = num_computed_tokens
        n = request.num_prompt_tokens - 1 - num_computed_tokens
        # vLLM requires False whenever the count is 0; update_state_after_alloc then queues the release.
        return (n, True) if n > 0 else (0, False)

    def update_state_after_alloc(self, request: Any, block_ids: Sequence[int], num_external_tokens: int) -> None:
        params = request.kv_transfer_params
        if not params or not params.get("do_remote_prefill"):
            return
        params["do_remote_prefill"] = False       # handled: a re-scheduled request does not load twice
        rid = request.request_id
        rec = self.decoding.setdefault(rid, Decoding())
        if rec.sibling:
            return                   # the first child loads and releases; this one recomputes
        local_hit, rec.local_hit = rec.local_hit, 0
        snapshot = dict(params, do_remote_prefill=True)
        if num_external_tokens <= 0:
            self.release(rid, snapshot, "unpulled")
            return
        bs = self.block_size
        first = local_hit // bs      # vLLM's local prefix hits are whole blocks
        end = -(-(local_hit + num_external_tokens) // bs)
        if local_hit > 0:
            self.count("local_prefix_hit")
        rec.loading = self._order(rid, snapshot, block_ids, first, end)

    def preempted(self, request_ids: Iterable[str]) -> None:
        for rid in request_ids:
            rec = self.decoding.get(rid)
            if rec is not None and rec.loading:
                # Loaded (vLLM preempts running requests only): its blocks went, and it recomputes
                # prompt and output locally (do_remote_prefill is off). The prefill was released by
                # the load already: nothing to tell anyone.
                self.count("preempted_after_load")

    def request_finished(self, request: Any, length_capped: bool,
                         aborted: bool) -> Tuple[bool, Optional[Dict[str, Any]]]:
        rid = request.request_id
        params = request.kv_transfer_params
        rec = self.decoding.pop(rid, None)
        if rec is not None and rec.sibling:
            if params:
                params["do_remote_prefill"] = False
            return False, None
        if params and params.get("do_remote_prefill"):
            # Finished (aborted) before any block was allocated: the prefill still holds its blocks.
            params["do_remote_prefill"] = False
            self.release(rid, dict(params, do_remote_prefill=True), "aborted")
        return False, None

    def _fail(self, rid: str, snapshot: Dict[str, Any]) -> bool:
        """The load cannot be made: release the transfer and report the request's load failed."""
        self.release(rid, snapshot, "failed")
        self.plan.failed.append(rid)
        return False

    # ---- the mode's part -----------------------------------------------------------------------------

    def _has_source(self, params: Mapping[str, Any]) -> bool:
        """Whether the params name something to load from."""
        raise NotImplementedError

    def _order(self, rid: str, snapshot: Dict[str, Any], block_ids: Sequence[int], first: int, end: int) -> bool:
        """Order the load of the prompt's blocks ``first..end-1`` into ``block_ids`` (all of the request's
        blocks); False when it cannot be made (then released and failed)."""
        raise NotImplementedError


class ReadConsumer(Consumer):
    """READ: pull the prefill's held blocks into the same token positions here."""

    def _has_source(self, params: Mapping[str, Any]) -> bool:
        return bool(params.get("remote_block_ids"))

    def _order(self, rid: str, snapshot: Dict[str, Any], block_ids: Sequence[int], first: int, end: int) -> bool:
        local = [int(b) for b in block_ids[first:end]]
        remote = [int(b) for b in (snapshot.get("remote_block_ids") or [])]
        if remote and isinstance(remote[0], list):    # MoRIIO's per-group form: one group here
            remote = remote[0]
        if len(local) != end - first or len(remote) < end:
            log.error("request %s: blocks %d..%d to pull, but %d local and %d remote blocks; reporting "
                      "its load as failed", rid, first, end - 1, len(block_ids), len(remote))
            return self._fail(rid, snapshot)
        snapshot["remote_block_ids"] = remote[first:end]
        self.plan.pulls.append(PullOrder(rid, snapshot, local))
        return True


class WriteConsumer(Consumer):
    """WRITE: announce the blocks past the local hit and wait for the prefill's write_done."""

    def _has_source(self, params: Mapping[str, Any]) -> bool:
        return True                  # no remote_block_ids: the prefill writes into the announced blocks

    def _order(self, rid: str, snapshot: Dict[str, Any], block_ids: Sequence[int], first: int, end: int) -> bool:
        # The blocks past the local hit only (the first ones are cached here, possibly shared with other
        # requests, and must not be written). The producer pushes the prompt minus its last token and
        # writes the last len(announced) of its blocks into them: the same token positions.
        if len(block_ids) < end:
            log.error("request %s: blocks %d..%d to receive, but %d allocated; reporting its load as "
                      "failed", rid, first, end - 1, len(block_ids))
            return self._fail(rid, snapshot)
        self.plan.expects.append(ExpectOrder(rid, snapshot, [int(b) for b in block_ids[first:end]]))
        return True
