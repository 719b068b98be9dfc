"""The scheduler half of a producer (``kv_role: kv_producer``, the prefill): :class:`ReadProducer` holds
a prompt's blocks for the decode to pull, :class:`WriteProducer` pushes them into the decode's blocks.

Both track a request whose kv_transfer_params carry ``do_remote_decode`` from ``update_state_after_alloc``
to ``request_finished`` in one :class:`Produced` record, under its transfer id (the router's
``transfer_id``), and order the transfer in the step that computes its last prompt token
(``scheduled``): the workers carry it out after that step's forward wrote the KV.

READ (:class:`ReadProducer`):
  * the order is a HOLD of the prompt's blocks (the workers make it in ``wait_for_save``), so the hold
    exists before the step's output -- and so the response carrying the params -- leaves the engine: a
    decode's pull can never reach a block that is not held yet;
  * ``request_finished`` returns ``(True, params)``: the blocks stay allocated until every worker
    reports the transfer freed (pdlink's release fan-in, or defer_timeout), and the params are the ones
    pdlink's own ``Instance.params`` returns, so vllm-router's MoRIIO mode forwards them unchanged;
  * a held request that ends any other way (aborted by its client, stopped on its own first token) or
    is preempted gives its params to nobody, so no decode can ever pull it: ``request_finished``
    returns ``(False, None)`` (vLLM frees the blocks at once, as NixlConnector's producer does) and the
    next plan orders the workers to DROP the hold from their books (see :class:`~pdlink.vllm.plan.DropOrder`).

WRITE (:class:`WriteProducer`; vllm-router sends both legs at once, each with the transfer id):
  * the order is a PUSH of the blocks holding the prompt minus its last token (the decode recomputes
    that one); the blocks stay allocated until the push is freed (written, or given up) --
    ``request_finished`` returns ``(True, None)`` whatever the finish status, since the decode waits for
    the push. A request that finishes before its push was ordered queues a RELEASE, which sends the
    decode a failed ``write_done`` so it stops waiting at once; a preempted pusher's push is given up
    the same way.

Parallel sampling (``n > 1``): vLLM runs a request as ``n`` child requests (``0_<id>``, ``1_<id>``, ...),
each carrying the router's one ``transfer_id``, and answers with the params of the child that finishes
last. Their prompts -- so their prompt KV -- are the same. The producer transfers once per transfer id
(:class:`Hold`): the first child to complete its prompt orders the HOLD (or PUSH), the others share it
(they free their own blocks at once and return the same params), so whichever child's params vLLM
forwards name the one hold.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from pdlink.vllm.params import transfer_params
from pdlink.vllm.plan import HoldOrder, PushOrder
from pdlink.vllm.scheduler_role import SIBLING_MEMORY, SchedulerRole, sharing_key


@dataclass
class Hold:
    """The one hold (READ) or push (WRITE) of a transfer id, shared by the children of an ``n > 1``
    request."""
    users: int = 0                            # tracked requests naming the transfer id
    holder: Optional[str] = None              # the request that ordered it (its blocks are transferred)
    block_ids: List[int] = field(default_factory=list)
    dropped: bool = False                     # dropped: nobody may advertise it


@dataclass
class Produced:
    """One tracked producer request, from its allocation to request_finished."""
    transfer_id: str
    request: Any
    hold_key: str                             # its entry in the holds (see sharing_key)
    held_ids: Optional[List[int]] = None      # set once the hold was ordered (or shared)
    dropped: bool = False                     # preempted after its hold: it will never give params


class Producer(SchedulerRole):
    """What READ and WRITE producers do alike; :meth:`_order` and :meth:`_finished` are the mode's."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.produced: Dict[str, Produced] = {}
        self.holds: Dict[str, Hold] = {}                # by sharing_key
        # Holds whose requests all finished, kept (bounded) for a child of the same n > 1 request that
        # reaches the engine only after its siblings finished: vLLM adds the children one by one, and the
        # engine may run a short prompt's child to its end before the next arrives. That child shares the
        # finished hold, which lives in pdlink until the decode's releases.
        self.done_holds: "OrderedDict[str, Hold]" = OrderedDict()

    def update_state_after_alloc(self, request: Any, block_ids: Sequence[int], num_external_tokens: int) -> None:
        params = request.kv_transfer_params
        rid = request.request_id
        if not params or not params.get("do_remote_decode") or rid in self.produced:
            return
        tid = str(params.get("transfer_id") or f"pdl-{rid}")
        key = sharing_key(rid, tid)
        self.produced[rid] = Produced(tid, request, key)
        if key not in self.holds:
            done = self.done_holds.pop(key, None)
            if done is not None:
                self.count("sibling_after_finish")
            self.holds[key] = done or Hold()
        self.holds[key].users += 1

    def preempted(self, request_ids: Iterable[str]) -> None:
        for rid in request_ids:
            pr = self.produced.get(rid)
            if pr is None or pr.dropped:
                continue
            if pr.held_ids is None:
                # Nothing held yet (a chunked prefill cut short): it re-runs from its first token,
                # update_state_after_alloc sees it again, and it holds when it completes.
                self.count("preempted_before_hold")
            elif self.holds[pr.hold_key].holder != rid:
                # A sibling sharing another child's hold: only its own blocks went; it re-runs and
                # shares again when it completes.
                pr.held_ids = None
                self.count("preempted_before_hold")
            else:
                # Its blocks are free in vLLM already and may be reused: the hold must go now, and
                # the request must never give params (its recomputed blocks are not the held ones).
                pr.dropped = True
                self.holds[pr.hold_key].dropped = True
                self._holder_preempted(rid, pr)
                self.drop(rid, pr.transfer_id, "preempted")

    def scheduled(self, num_scheduled_tokens: Mapping[str, int]) -> None:
        for rid, pr in self.produced.items():
            n = num_scheduled_tokens.get(rid, 0)
            req = pr.request
            # Called before vLLM advances num_computed_tokens: this step computes the last prompt
            # token iff computed + scheduled reaches the prompt length.
            if (pr.held_ids is None and not pr.dropped and n > 0
                    and req.num_computed_tokens + n >= req.num_prompt_tokens):
                self._prompt_complete(rid, pr)

    def _prompt_complete(self, rid: str, pr: Produced) -> None:
        hold = self.holds[pr.hold_key]
        if hold.dropped:
            pr.dropped = True              # a sibling's hold went: no params for anyone
        elif hold.holder is not None:
            pr.held_ids = hold.block_ids   # a sibling holds the same prompt's KV
        else:
            req = pr.request
            ids = list(self.block_ids_of(rid)) if self.block_ids_of else []
            ids = ids[:-(-req.num_prompt_tokens // self.block_size)]
            pr.held_ids = hold.block_ids = [int(b) for b in ids]
            hold.holder = rid
            self._order(rid, pr)

    def request_finished(self, request: Any, length_capped: bool,
                         aborted: bool) -> Tuple[bool, Optional[Dict[str, Any]]]:
        rid = request.request_id
        pr = self.produced.pop(rid, None)
        if pr is None:
            return False, None
        hold = self.holds[pr.hold_key]
        hold.users -= 1
        if hold.users == 0:
            del self.holds[pr.hold_key]
            if hold.holder is not None:
                self.done_holds[pr.hold_key] = hold
                while len(self.done_holds) > SIBLING_MEMORY:
                    self.done_holds.popitem(last=False)
        return self._finished(request, pr, hold, length_capped, aborted)

    # ---- the mode's part -----------------------------------------------------------------------------

    def _holder_preempted(self, rid: str, pr: Produced) -> None:
        """The request whose blocks are transferred was preempted (its hold is dropped next)."""
        return

    def _order(self, rid: str, pr: Produced) -> None:
        """Order the transfer of ``pr.held_ids``, the blocks of ``rid``'s completed prompt."""
        raise NotImplementedError

    def _finished(self, request: Any, pr: Produced, hold: Hold, length_capped: bool,
                  aborted: bool) -> Tuple[bool, Optional[Dict[str, Any]]]:
        """request_finished's answer, once the request's record and its share of the hold are gone."""
        raise NotImplementedError

    @property
    def tracked_requests(self) -> int:
        return len(self.produced)


class ReadProducer(Producer):
    """READ: hold the prompt's blocks and advertise them in the params request_finished returns."""

    def _order(self, rid: str, pr: Produced) -> None:
        self.plan.holds.append(HoldOrder(rid, pr.transfer_id, pr.held_ids, int(pr.request.num_prompt_tokens)))

    def _finished(self, request: Any, pr: Produced, hold: Hold, length_capped: bool,
                  aborted: bool) -> Tuple[bool, Optional[Dict[str, Any]]]:
        rid = request.request_id
        if pr.held_ids is None or pr.dropped:
            return False, None
        if hold.holder != rid:
            # A sibling sharing the holder's hold: its own blocks are free at once; its params are the
            # holder's, so whichever child's params vLLM forwards name the one hold.
            if not length_capped or hold.dropped:
                return False, None
            return False, self._params(pr.transfer_id, hold.block_ids)
        if not length_capped:
            hold.dropped = True
            # Held, but no params leave the engine, so no decode will ever pull or release it: free the
            # blocks now rather than at defer_timeout.
            self.drop(rid, pr.transfer_id, "aborted" if aborted else "stopped")
            return False, None
        # Held and advertised: the workers own the blocks until they report the transfer freed (the
        # decode's releases, or defer_timeout when no decode comes).
        if not pr.held_ids:
            return True, None
        return True, self._params(pr.transfer_id, pr.held_ids)

    def _params(self, transfer_id: str, block_ids: List[int]) -> Dict[str, Any]:
        return transfer_params(self.ep, transfer_id=transfer_id, block_ids=block_ids, tp_size=self.tp_size,
                               dp_rank=self.dp_rank, dp_size=self.dp_size)


class WriteProducer(Producer):
    """WRITE: push the prompt minus its last token into the blocks the decode announces."""

    def _holder_preempted(self, rid: str, pr: Produced) -> None:
        # The push may be writing from blocks vLLM has freed: give it up (the decode gets a failed
        # write_done and recomputes, unless a rank had already written).
        self.release(rid, dict(pr.request.kv_transfer_params or {}), "preempted")

    def _order(self, rid: str, pr: Produced) -> None:
        req = pr.request
        # The decode recomputes the last prompt token: it announced the blocks of the prompt minus it.
        p_len = int(req.num_prompt_tokens)
        n_push = -(-(p_len - 1) // self.block_size)
        # Rows to zero exist only when the last pushed block is the prompt's last, partial one (a full
        # block may be in vLLM's prefix cache: never touched).
        tail = p_len if -(-p_len // self.block_size) == n_push else None
        if n_push > 0:
            self.plan.pushes.append(PushOrder(rid, pr.transfer_id, dict(req.kv_transfer_params),
                                              pr.held_ids[:n_push], tail))

    def _finished(self, request: Any, pr: Produced, hold: Hold, length_capped: bool,
                  aborted: bool) -> Tuple[bool, Optional[Dict[str, Any]]]:
        rid = request.request_id
        if pr.dropped:
            return False, None
        if hold.holder == rid and pr.held_ids and request.num_prompt_tokens > 1:
            # The push was ordered and the decode waits for it: the blocks stay until it is freed.
            # (A one-token prompt pushes nothing: the decode recomputes its only token.)
            return True, None
        if hold.holder is None and hold.users == 0:
            # No child pushed and none will: tell the decode now rather than at its timeout.
            self.release(rid, dict(request.kv_transfer_params or {}), "aborted")
        return False, None
