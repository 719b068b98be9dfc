"""The worker half of a producer (the prefill, one per TP rank): sends a prompt's KV once the forward
wrote it, :class:`ReadProducer` by holding the blocks for the decode's pull, :class:`WriteProducer` by
pushing them into the blocks the decode announced (with a host cache layer by layer, each layer as
``save_kv_layer`` reports it written, as MoRIIO's WRITE mode does; with a CUDA cache whole, after the
forward: vLLM calls save_kv_layer once a layer's kernels are queued, not done).

Each request's transfer is one :class:`Send` record, from its hold or push to finished_sending:

  hold/push made --> live --Event.FREED--> freed --vLLM listed it finished--> reported in finished_sending
  hold/push failed ------------------------^            (and the record goes)
  live --DropOrder--> gone (Instance.drop ended pdlink's record) or lapsing (pdlink kept it: it lapses at
                      defer_timeout, counted dropped_expired, and is forgotten at its FREED)
  freed --DropOrder--> gone (a hold that failed: nothing to report, vLLM forgot the request)

A failed hold or push is "freed" at once: nothing is transferred, and the blocks must not stay pinned
on a FREED that never comes. vLLM only accepts a finished send for a request it has already reported
finished to this worker, hence the two conditions.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Iterable, Optional, Set

from pdlink.events import Event
from pdlink.vllm.log import log
from pdlink.vllm.plan import DropOrder, PushOrder, StepPlan
from pdlink.vllm.worker_role import Results, WorkerRole


@dataclass
class Send:
    """One request's hold (READ) or push (WRITE) on this rank."""
    transfer_id: str
    freed: bool = False         # pdlink freed it (or it never started): vLLM may reuse the blocks
    finished: bool = False      # vLLM listed the request finished


class Producer(WorkerRole):
    """What READ and WRITE producers do alike: the Send records, drops, pdlink's events."""

    def __init__(self, tp_rank: int) -> None:
        super().__init__(tp_rank)
        self.sends: Dict[str, Send] = {}          # by request id
        # Transfer ids dropped while pdlink kept their record (Instance.drop refused: a WRITE push, or
        # freed meanwhile): vLLM forgot their requests; they lapse at defer_timeout.
        self.lapsing: Set[str] = set()

    def sent(self, rid: str, tid: str, mark: str) -> None:
        """``rid``'s hold or push of ``tid`` was made: live until pdlink frees it."""
        self.sends[rid] = Send(tid)
        self.mark(tid, mark)

    def failed(self, rid: str, tid: str) -> None:
        """``rid``'s hold or push of ``tid`` could not be made: reported sent once vLLM says it finished."""
        self.sends[rid] = Send(tid, freed=True)

    def drop_all(self, drops: Iterable[DropOrder]) -> None:
        for d in drops:
            self._drop(d)

    def _drop(self, d: DropOrder) -> None:
        """The scheduler let vLLM free a held request's blocks (pdlink.vllm.plan.DropOrder): forget the
        hold and end pdlink's record of it at once (Instance.drop: its grants are revoked). The request
        must not reach finished_sending (vLLM no longer knows it). A record that could not be dropped (a
        WRITE push) lapses at defer_timeout and is counted dropped_expired, not expired."""
        s = self.sends.pop(d.request_id, None)
        if s is not None and not s.freed:
            self.mark(d.transfer_id, "dropped")
            try:
                self.inst.drop(d.transfer_id)    # pdlink's record goes now, not at defer_timeout
            except Exception as e:  # freed meanwhile, or a WRITE push: it lapses on its own (counted)
                log.debug("pdlink rank %d: drop of %s: %s", self.tp_rank, d.transfer_id, e)
                self.lapsing.add(d.transfer_id)
        self.bump("dropped")
        self.bump("dropped_" + d.reason)
        self.dirty = True

    def poll(self, finished_req_ids: Set[str]) -> Results:
        if self.inst is not None:
            for kind, tid, _rank in self.inst.events():
                self._event(kind, tid)
        for rid in finished_req_ids:
            s = self.sends.get(rid)
            if s is not None:
                s.finished = True
        sending = {rid for rid, s in self.sends.items() if s.freed and s.finished}
        for rid in sending:
            del self.sends[rid]
        return sending, set(), set()

    def _event(self, kind: Event, tid: str) -> None:
        if tid in self.lapsing:
            if kind == Event.RANK_EXPIRED:
                self.bump("dropped_expired")
            elif kind == Event.FREED:
                self.lapsing.discard(tid)
        elif kind == Event.RANK_EXPIRED:
            self.stats["expired"] += 1
            log.warning("pdlink rank %d: transfer %s expired (no decode released it before defer_timeout)",
                        self.tp_rank, tid)
        elif kind == Event.FREED:
            s = self._live(tid)
            if s is not None:
                s.freed = True
                self.mark(tid, "freed")
                self.stats["freed"] += 1
                self.dirty = True

    def _live(self, tid: str) -> Optional[Send]:
        """The live send of ``tid`` (the latest, should a transfer id have been reused)."""
        return next((s for s in reversed(self.sends.values()) if s.transfer_id == tid and not s.freed), None)

    def in_flight(self) -> Dict[str, int]:
        return {"held_now": sum(not s.freed for s in self.sends.values()), "pulls_in_flight": 0}


class ReadProducer(Producer):
    """READ: hold the prompt's blocks after the forward wrote them (HoldOrder)."""

    def start(self, plan: StepPlan) -> None:
        self.drop_all(plan.drops)

    def after_forward(self, plan: StepPlan) -> None:
        for h in plan.holds:
            try:
                # The last block's rows past the prompt still hold an earlier request's KV: zeroed
                # first (on the GPU for CUDA caches), and nothing is held if that fails.
                self.inst.hold(h.transfer_id, h.block_ids, None,
                               num_tokens=h.num_tokens if self.zero_tail else None)
                self.sent(h.request_id, h.transfer_id, "held")
                self.stats["holds"] += 1
            except Exception as e:
                # Nothing is held, so a decode's pull fails and is reported there; the blocks must not
                # stay pinned on a "freed" that will never come.
                log.error("pdlink rank %d: hold of request %s (transfer %s) failed: %s", self.tp_rank,
                          h.request_id, h.transfer_id, e)
                self.stats["holds_failed"] += 1
                self.failed(h.request_id, h.transfer_id)


class WriteProducer(Producer):
    """WRITE: push the prompt's blocks to the decode (PushOrder): with a host cache started before the
    forward with no layer final and said final layer by layer, with a CUDA cache whole after it."""

    def __init__(self, tp_rank: int) -> None:
        super().__init__(tp_rank)
        # Pushes of this step started in start_load_kv: transfer id -> whether its layers are still to be
        # said final (False when it could not start, or once pdlink no longer knows it: given up).
        self.layered: Dict[str, bool] = {}

    def step_begins(self) -> None:
        # A step whose wait_for_save never came (its forward failed) left its pushes here: their layers
        # were not all computed, so they are never said final (they fail at transfer_timeout).
        self.layered.clear()

    def start(self, plan: StepPlan) -> None:
        self.release_all(plan.releases)
        self.drop_all(plan.drops)
        if not self.host_cache:
            return
        for p in plan.pushes:
            # Started before this step's forward computes the prompt: pdlink handshakes now and writes
            # each layer once save_kv_layer says it is final. One that cannot start is handled in _push
            # and not tried again in after_forward.
            self.layered[p.transfer_id] = self._push(p, layers=0)
            if self.layered[p.transfer_id]:
                self.bump("pushes_layered")

    def layer_saved(self, layer_name: str) -> None:
        """It and every layer before it are final in the pushes started in start; a name that is no
        registered KV cache layer is ignored."""
        if not self.layered:
            return
        i = self.layer_of.get(layer_name)
        if i is None:
            return
        for tid, live in self.layered.items():
            if live:
                self._say_layers(tid, i + 1)

    def after_forward(self, plan: StepPlan) -> None:
        for p in plan.pushes:
            if p.transfer_id not in self.layered:
                self._push(p)
            elif self.layered.pop(p.transfer_id):
                # Every layer is written now: also those of a model whose attention layers vLLM did not
                # report through save_kv_layer (a no-op when it did).
                self._say_layers(p.transfer_id, len(self.layer_of))
        self.layered.clear()

    def _say_layers(self, tid: str, layers: int) -> None:
        try:
            self.inst.push_layers(tid, layers)
        except Exception as e:
            # Given up already (its decode abandoned it or is gone): pdlink freed it, nothing to say.
            log.debug("pdlink rank %d: push %s: layers %d not said final: %s", self.tp_rank, tid, layers, e)
            self.layered[tid] = False

    def _push(self, p: PushOrder, layers: Optional[int] = None) -> bool:
        """Push ``p``: whole (``layers`` None, after the forward) or started with ``layers`` final. False
        when it could not start, which is then handled here."""
        try:
            # The last block's rows past the prompt still hold an earlier request's KV: zeroed before the
            # push starts (this step's forward writes only the prompt's rows, so before it is as good as
            # after), and nothing is pushed if that fails.
            if self.zero_tail and p.num_tokens is not None:
                self.inst.zero_tail(p.block_ids, p.num_tokens)
            if layers is None:
                self.inst.push(p.params, p.block_ids, p.request_id)
            else:
                self.inst.push(p.params, p.block_ids, p.request_id, layers=layers)
            self.sent(p.request_id, p.transfer_id, "pushed")
            self.bump("pushes")
            return True
        except Exception as e:
            # Nothing is pushed: the decode's receive times out or is failed by the release the
            # scheduler orders; the blocks must not stay pinned on a "freed" that never comes.
            log.error("pdlink rank %d: push of request %s (transfer %s) failed: %s", self.tp_rank,
                      p.request_id, p.transfer_id, e)
            self.bump("pushes_failed")
            self.failed(p.request_id, p.transfer_id)
            return False
