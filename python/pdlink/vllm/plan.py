"""The step plan: what the scheduler half orders the worker halves to do in one engine step.

vLLM's scheduler process owns the block ids and no KV memory; each worker process (one per TP rank) owns
its memory and a pdlink instance. :meth:`PdlinkScheduler.build_connector_meta` hands the workers one
:class:`StepPlan` per step inside vLLM's connector metadata, which vLLM pickles to every worker: plain
data only. Which orders a plan can carry depends on the instance's role and mode:

  ================  =========================  ==================================
  role              READ mode                  WRITE mode
  ================  =========================  ==================================
  producer          holds, drops               pushes, releases, drops
  consumer          pulls, releases, failed    expects, releases, failed
  ================  =========================  ==================================
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional


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
    # The step computes nothing and orders nothing: vLLM runs it only to poll the workers for transfers,
    # and the workers pause after polling (pdlink.vllm.worker, idle_step_s). Not an order: a plan that is
    # only idle is still empty (False).
    idle: bool = False

    def __bool__(self) -> bool:
        return bool(self.pulls or self.holds or self.releases or self.failed or self.drops or self.pushes
                    or self.expects)
