"""PdlinkConnector's WRITE mode without vLLM: the scheduler halves plan, the worker halves (one process
per TP rank, vLLM's CPU layout in numpy, real pdlink instances) push and receive.

What vllm-router's MoRIIO WRITE dispatch gives each leg, concurrently: the same request id
``___prefill_addr_{P}___decode_addr_{D}_{32 hex}`` (vLLM wraps it as ``cmpl-<id>-<8 chars>``), the
transfer id, and the peer's TP size; the prefill's params say ``do_remote_decode``, the decode's
``do_remote_prefill``."""
from __future__ import annotations

import multiprocessing as mp
from typing import Any, Dict, List

import pytest

from test_pdlink_vllm_connector import (BS, HD, HEADS, LAYERS, PROMPT, Blocks, FakeInstance, Req, collect, config,
                                        consumer_rank, fake_worker, producer_rank, reap)
from free_ports import free_range  # noqa: E402 (on the path test_pdlink_vllm_connector set)

from pdlink.vllm.scheduler import PdlinkScheduler, PushOrder, ReleaseOrder, StepPlan

HEX = "0123456789abcdef" * 2


def wconfig(role: str, base: int) -> Dict[str, Any]:
    return config(role, base, read_mode=False)


def zmq(base: int) -> str:
    return f"host:127.0.0.1,handshake:{base},notify:{base + 50}"


def request_id(pbase: int, dbase: int) -> str:
    return f"cmpl-___prefill_addr_{zmq(pbase)}___decode_addr_{zmq(dbase)}_{HEX}-1a2b3c4d"


# ---- the scheduler half ---------------------------------------------------------------------------------

def test_producer_pushes_the_prompt_minus_its_last_token_and_keeps_the_blocks() -> None:
    s = PdlinkScheduler(wconfig("kv_producer", 23100), tp_size=1, block_size=BS,
                        block_ids_of=Blocks({"p": [5, 2, 9, 11]}))
    s.idle_step_s = 0
    r = Req("p", PROMPT, {"do_remote_decode": True, "transfer_id": "tx-w", "remote_tp_size": 2})
    s.update_state_after_alloc(r, [5, 2, 9], 0)
    plan = s.build_connector_meta({"p": PROMPT})
    assert not plan.holds
    # 2*BS+3 tokens: the decode loads 2*BS+2 (it recomputes the last), 3 blocks; the third is the
    # prompt's partial last block, so its rows past the prompt are zeroed first.
    assert [(x.request_id, x.transfer_id, x.block_ids, x.num_tokens) for x in plan.pushes] == \
        [("p", "tx-w", [5, 2, 9], PROMPT)]
    assert plan.pushes[0].params["remote_tp_size"] == 2
    # Whatever the finish status, the decode waits for this push: the blocks stay until it is freed.
    r.num_computed_tokens = PROMPT
    assert s.request_finished(r, [5, 2, 9], length_capped=False) == (True, None)


def test_producer_full_last_block_is_not_pushed_nor_zeroed() -> None:
    # 2*BS+1 tokens: the last block holds only the last token, which the decode recomputes.
    s = PdlinkScheduler(wconfig("kv_producer", 23100), tp_size=1, block_size=BS,
                        block_ids_of=Blocks({"p": [5, 2, 9]}))
    s.idle_step_s = 0
    r = Req("p", 2 * BS + 1, {"do_remote_decode": True, "transfer_id": "tx-w"})
    s.update_state_after_alloc(r, [5, 2, 9], 0)
    (push,) = s.build_connector_meta({"p": 2 * BS + 1}).pushes
    assert (push.block_ids, push.num_tokens) == ([5, 2], None)


def test_producer_one_token_prompt_pushes_nothing_and_keeps_no_blocks() -> None:
    # Nothing to push (the decode recomputes the only token), so no worker will ever report it sent:
    # keeping the blocks would pin them for good.
    s = PdlinkScheduler(wconfig("kv_producer", 23100), tp_size=1, block_size=BS, block_ids_of=Blocks({"p": [5]}))
    s.idle_step_s = 0
    r = Req("p", 1, {"do_remote_decode": True, "transfer_id": "tx-1t"})
    s.update_state_after_alloc(r, [5], 0)
    assert not s.build_connector_meta({"p": 1}).pushes
    r.num_computed_tokens = 1
    assert s.request_finished(r, [5], length_capped=True) == (False, None)


def test_producer_finished_before_its_push_fails_the_decode_at_once() -> None:
    s = PdlinkScheduler(wconfig("kv_producer", 23100), tp_size=1, block_size=BS, block_ids_of=Blocks({"p": [1]}))
    s.idle_step_s = 0
    r = Req("cmpl-x", 40, {"do_remote_decode": True, "transfer_id": "tx-a"})
    s.update_state_after_alloc(r, [1, 2, 3], 0)
    assert not s.build_connector_meta({"cmpl-x": 16})            # a first chunk: nothing pushed yet
    assert s.request_finished(r, [1, 2, 3], length_capped=False, aborted=True) == (False, None)
    (rel,) = s.build_connector_meta({}).releases
    assert (rel.request_id, rel.params["transfer_id"], rel.reason, rel.write) == ("cmpl-x", "tx-a", "aborted", True)


def test_consumer_expects_the_blocks_it_allocated() -> None:
    s = PdlinkScheduler(wconfig("kv_consumer", 23200), tp_size=1, block_size=BS)
    s.idle_step_s = 0
    # No remote_block_ids in WRITE mode: the prefill writes into the blocks the decode announces.
    r = Req("d", PROMPT, {"do_remote_prefill": True, "transfer_id": "tx-w", "remote_tp_size": 1})
    assert s.get_num_new_matched_tokens(r, 0) == (PROMPT - 1, True)
    s.update_state_after_alloc(r, [7, 3, 10], PROMPT - 1)
    plan = s.build_connector_meta({})
    assert [(x.request_id, x.block_ids, x.params["transfer_id"]) for x in plan.expects] == [("d", [7, 3, 10], "tx-w")]
    assert not plan.pulls and not plan.releases


def test_consumer_with_a_local_prefix_expects_only_the_rest() -> None:
    s = PdlinkScheduler(wconfig("kv_consumer", 23200), tp_size=1, block_size=BS)
    s.idle_step_s = 0
    r = Req("d", PROMPT, {"do_remote_prefill": True, "transfer_id": "tx-w"})
    assert s.get_num_new_matched_tokens(r, BS) == (PROMPT - 1 - BS, True)
    s.update_state_after_alloc(r, [7, 3, 10], PROMPT - 1 - BS)
    plan = s.build_connector_meta({})
    # Block 7 is the cached prefix (vLLM may share it with other requests): never announced.
    assert [x.block_ids for x in plan.expects] == [[3, 10]] and not plan.releases
    assert s.stats == {"local_prefix_hit": 1}
    # The whole prompt but its last token cached here: nothing to receive, the push is given up.
    r = Req("e", 2 * BS + 1, {"do_remote_prefill": True, "transfer_id": "tx-v"})
    assert s.get_num_new_matched_tokens(r, 2 * BS) == (0, False)
    s.update_state_after_alloc(r, [7, 3, 10], 0)
    plan = s.build_connector_meta({})
    assert not plan.expects and [(x.reason, x.write) for x in plan.releases] == [("unpulled", True)]


def test_worker_pushes_zeroes_first_and_reports_sent_when_freed() -> None:
    w = fake_worker("kv_producer")
    calls: List[Any] = w.inst.calls
    w.inst.zero_tail = lambda ids, n: calls.append(("zero_tail", list(ids), n))
    w.inst.push = lambda params, ids, rid: calls.append(("push", params["transfer_id"], list(ids), rid))
    w.wait_for_save(StepPlan(pushes=[PushOrder("r1", "t1", {"transfer_id": "t1"}, [1, 2], 20),
                                     PushOrder("r2", "t2", {"transfer_id": "t2"}, [3], None)]))
    assert calls == [("zero_tail", [1, 2], 20), ("push", "t1", [1, 2], "r1"), ("push", "t2", [3], "r2")]
    w.inst.pending_events = [("freed", "t1", 0)]
    assert w.get_transfer_results({"r1"}) == ({"r1"}, set(), set())
    assert w.stats["pushes"] == 2


def test_worker_failed_push_does_not_pin_blocks() -> None:
    w = fake_worker("kv_producer")

    def refuse(*_: Any) -> None:
        raise RuntimeError("no consumer address")
    w.inst.push = refuse
    w.wait_for_save(StepPlan(pushes=[PushOrder("r", "t", {"transfer_id": "t"}, [1], None)]))
    assert w.stats["pushes_failed"] == 1
    assert w.get_transfer_results({"r"}) == ({"r"}, set(), set())


def test_worker_write_release_names_the_request() -> None:
    w = fake_worker("kv_consumer")
    seen: List[Any] = []
    w.inst.release = lambda params, rid: seen.append(rid)
    w.start_load_kv(StepPlan(releases=[ReleaseOrder("cmpl-r", {"transfer_id": "t"}, "unpulled", True),
                                       ReleaseOrder("cmpl-s", {"transfer_id": "u"}, "unpulled", False)]))
    assert seen == ["cmpl-r", None]        # WRITE: the id carries the peer's address; READ: params do
    assert isinstance(w.inst, FakeInstance)


# ---- both halves with real pdlink instances, one process per vLLM worker --------------------------------

@pytest.mark.parametrize("p_tp,d_tp,hit", [(1, 1, 0), (2, 1, 0), (1, 2, 0), (1, 1, 1), (2, 1, 1)])
def test_workers_push_vllm_cpu_kv_between_processes(p_tp: int, d_tp: int, hit: int) -> None:
    """Both legs at once, as vllm-router's WRITE dispatch sends them: every decode rank ends with exactly
    its heads of the pushed blocks (other blocks keep the sentinel) and reports the request loaded;
    every prefill rank reports it sent once its push was written. ``hit``: blocks the decode had cached
    (a local prefix hit): only the blocks past them are written, from the same prompt positions."""
    ctx = mp.get_context("spawn")
    pbase = free_range(120)
    dbase = pbase + 60
    p_ids, d_ids = [5, 2, 9], [7, 3, 10]
    rid = request_id(pbase, dbase)
    out = ctx.Queue()
    pq = [ctx.Queue() for _ in range(p_tp)]
    cq = [ctx.Queue() for _ in range(d_tp)]
    procs = [ctx.Process(target=consumer_rank, args=(d_tp, r, dbase, cq[r], out, False, hit)) for r in range(d_tp)]
    procs += [ctx.Process(target=producer_rank, args=(p_tp, r, pbase, p_ids, pq[r], out, False))
              for r in range(p_tp)]
    for p in procs:
        p.start()
    try:
        assert sorted(m[1] for m in collect(out, {"up": d_tp}, 60)) == list(range(d_tp))
        cs = PdlinkScheduler(wconfig("kv_consumer", dbase), tp_size=d_tp, block_size=BS)
        dreq = Req(rid, PROMPT, {"do_remote_prefill": True, "transfer_id": "tx-w", "remote_tp_size": p_tp,
                                 "remote_dp_size": 1})
        n, is_async = cs.get_num_new_matched_tokens(dreq, hit * BS)
        assert (n, is_async) == (PROMPT - 1 - hit * BS, True)
        cs.update_state_after_alloc(dreq, d_ids, n)
        dplan = cs.build_connector_meta({})
        for q in cq:
            q.put(dplan)

        ps = PdlinkScheduler(wconfig("kv_producer", pbase), tp_size=p_tp, block_size=BS,
                             block_ids_of=Blocks({rid: p_ids + [11]}))
        preq = Req(rid, PROMPT, {"do_remote_decode": True, "transfer_id": "tx-w", "remote_tp_size": d_tp,
                                 "remote_dp_size": 1})
        ps.update_state_after_alloc(preq, p_ids, 0)
        pplan = ps.build_connector_meta({rid: PROMPT})
        for q in pq:
            q.put(pplan)
        assert ps.request_finished(preq, p_ids + [11], length_capped=True) == (True, None)
        msgs = collect(out, {"pulled": d_tp, "sent": p_tp})
    finally:
        reap(procs)
    received, sent = ([m for m in msgs if m[0] == k] for k in ("pulled", "sent"))
    assert len(received) == d_tp and len(sent) == p_tp
    for _, rank, recv, failed, exact, _rid, _counters in received:
        assert (recv, failed, exact) == ([rid], [], True), f"decode rank {rank}"
    for _, rank, s, counters in sent:
        assert s == [rid], f"prefill rank {rank} never reported the push freed"
        assert counters["connector"]["pushes"] == 1 and counters["held_now"] == 0
    assert sum(c["pdlink"]["kv_bytes"] for *_, c in sent) == LAYERS * (3 - hit) * HEADS * BS * 2 * HD * 4
