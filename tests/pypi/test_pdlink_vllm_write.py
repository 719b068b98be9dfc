"""PdlinkConnector's WRITE mode without vLLM: the scheduler halves plan, the worker halves (one process
per TP rank, vLLM's CPU layout in numpy, real pdlink instances) push and receive.

What vllm-router's MoRIIO WRITE dispatch gives each leg, concurrently: the same request id
``___prefill_addr_{P}___decode_addr_{D}_{32 hex}`` (vLLM wraps it as ``cmpl-<id>-<8 chars>``), the
transfer id, and the peer's TP size; the prefill's params say ``do_remote_decode``, the decode's
``do_remote_prefill``."""
from __future__ import annotations

import multiprocessing as mp
from typing import Any, Dict, List

import numpy as np
import pytest

from test_pdlink_vllm_connector import (BS, HD, HEADS, LAYERS, PROMPT, Blocks, FakeInstance, FakeTensor, Req, collect,
                                        config, consumer_rank, fake_worker, producer_rank, reap, vllm_cpu_caches)
from free_ports import free_range  # noqa: E402 (on the path test_pdlink_vllm_connector set)

from pdlink.events import Event
from pdlink.vllm.plan import PushOrder, ReleaseOrder, StepPlan
from pdlink.vllm.scheduler import PdlinkScheduler
from pdlink.vllm.worker import PdlinkWorker

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
    r = Req("p", 2 * BS + 1, {"do_remote_decode": True, "transfer_id": "tx-w"})
    s.update_state_after_alloc(r, [5, 2, 9], 0)
    (push,) = s.build_connector_meta({"p": 2 * BS + 1}).pushes
    assert (push.block_ids, push.num_tokens) == ([5, 2], None)


def test_producer_one_token_prompt_pushes_nothing_and_keeps_no_blocks() -> None:
    # Nothing to push (the decode recomputes the only token), so no worker will ever report it sent:
    # keeping the blocks would pin them for good.
    s = PdlinkScheduler(wconfig("kv_producer", 23100), tp_size=1, block_size=BS, block_ids_of=Blocks({"p": [5]}))
    r = Req("p", 1, {"do_remote_decode": True, "transfer_id": "tx-1t"})
    s.update_state_after_alloc(r, [5], 0)
    assert not s.build_connector_meta({"p": 1}).pushes
    r.num_computed_tokens = 1
    assert s.request_finished(r, [5], length_capped=True) == (False, None)


def test_producer_finished_before_its_push_fails_the_decode_at_once() -> None:
    s = PdlinkScheduler(wconfig("kv_producer", 23100), tp_size=1, block_size=BS, block_ids_of=Blocks({"p": [1]}))
    r = Req("cmpl-x", 40, {"do_remote_decode": True, "transfer_id": "tx-a"})
    s.update_state_after_alloc(r, [1, 2, 3], 0)
    assert not s.build_connector_meta({"cmpl-x": 16})            # a first chunk: nothing pushed yet
    assert s.request_finished(r, [1, 2, 3], length_capped=False, aborted=True) == (False, None)
    (rel,) = s.build_connector_meta({}).releases
    assert (rel.request_id, rel.params["transfer_id"], rel.reason, rel.write) == ("cmpl-x", "tx-a", "aborted", True)


def test_consumer_expects_the_blocks_it_allocated() -> None:
    s = PdlinkScheduler(wconfig("kv_consumer", 23200), tp_size=1, block_size=BS)
    # No remote_block_ids in WRITE mode: the prefill writes into the blocks the decode announces.
    r = Req("d", PROMPT, {"do_remote_prefill": True, "transfer_id": "tx-w", "remote_tp_size": 1})
    assert s.get_num_new_matched_tokens(r, 0) == (PROMPT - 1, True)
    s.update_state_after_alloc(r, [7, 3, 10], PROMPT - 1)
    plan = s.build_connector_meta({})
    assert [(x.request_id, x.block_ids, x.params["transfer_id"]) for x in plan.expects] == [("d", [7, 3, 10], "tx-w")]
    assert not plan.pulls and not plan.releases


def test_consumer_with_a_local_prefix_expects_only_the_rest() -> None:
    s = PdlinkScheduler(wconfig("kv_consumer", 23200), tp_size=1, block_size=BS)
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
    w = fake_worker("kv_producer", read_mode=False)
    calls: List[Any] = w.inst.calls
    w.inst.zero_tail = lambda ids, n: calls.append(("zero_tail", list(ids), n))
    w.inst.push = lambda params, ids, rid: calls.append(("push", params["transfer_id"], list(ids), rid))
    w.wait_for_save(StepPlan(pushes=[PushOrder("r1", "t1", {"transfer_id": "t1"}, [1, 2], 20),
                                     PushOrder("r2", "t2", {"transfer_id": "t2"}, [3], None)]))
    assert calls == [("zero_tail", [1, 2], 20), ("push", "t1", [1, 2], "r1"), ("push", "t2", [3], "r2")]
    w.inst.pending_events = [(Event.FREED, "t1", 0)]
    assert w.get_transfer_results({"r1"}) == ({"r1"}, set(), set())
    assert w.stats["pushes"] == 2


def test_worker_failed_push_does_not_pin_blocks() -> None:
    w = fake_worker("kv_producer", read_mode=False)

    def refuse(*_: Any) -> None:
        raise RuntimeError("no consumer address")
    w.inst.push = refuse
    w.wait_for_save(StepPlan(pushes=[PushOrder("r", "t", {"transfer_id": "t"}, [1], None)]))
    assert w.stats["pushes_failed"] == 1
    assert w.get_transfer_results({"r"}) == ({"r"}, set(), set())


def test_worker_write_release_names_the_request() -> None:
    w = fake_worker("kv_consumer")
    seen: List[Any] = []
    w.inst.abandon = lambda params, rid: seen.append(rid)
    w.start_load_kv(StepPlan(releases=[ReleaseOrder("cmpl-r", {"transfer_id": "t"}, "unpulled", True),
                                       ReleaseOrder("cmpl-s", {"transfer_id": "u"}, "unpulled", False)]))
    assert seen == ["cmpl-r", None]        # WRITE: the id carries the peer's address; READ: params do
    assert isinstance(w.inst, FakeInstance)


# ---- layer by layer: the pushes start before the forward, save_kv_layer says each layer final -------------

class PushingInstance(FakeInstance):
    """A fake pdlink instance recording pushes (whole or started with ``layers``) and push_layers."""

    def __init__(self) -> None:
        super().__init__()
        self.refuse_push: set = set()
        self.gone: set = set()

    def zero_tail(self, ids: List[int], n: int) -> None:
        self.calls.append(("zero_tail", list(ids), n))

    def push(self, params: Dict[str, Any], ids: List[int], rid: str, layers: Any = None) -> None:
        if params["transfer_id"] in self.refuse_push:
            raise RuntimeError("no consumer address")
        self.calls.append(("push", params["transfer_id"], list(ids), rid, layers))

    def push_layers(self, tid: str, layers: int) -> None:
        if tid in self.gone:
            raise RuntimeError(f"push_layers: no push of transfer {tid} on this instance")
        self.calls.append(("push_layers", tid, layers))


class FakeCudaTensor(FakeTensor):
    """What kv_region reads of a torch CUDA tensor (flash-attention's layout), over a numpy array."""

    def __init__(self, arr: np.ndarray) -> None:
        super().__init__(arr, device="cuda")

    def stride(self) -> tuple:
        return tuple(st // self.a.itemsize for st in self.a.strides)


def registered_worker(cuda: bool = False) -> PdlinkWorker:
    """A producer worker over vLLM-shaped KV tensors of LAYERS layers (host, or CUDA-like), whose pdlink
    instance is a PushingInstance."""
    inst = PushingInstance()
    w = PdlinkWorker(wconfig("kv_producer", 23100), tp_size=1, tp_rank=0, total_kv_heads=2,
                     make_instance=lambda *a, **k: inst)
    if cuda:
        whole = np.zeros((LAYERS, 2, 8, BS, 2, HD), dtype=np.float32)
        caches = {f"model.layers.{i}.self_attn.attn": FakeCudaTensor(whole[i]) for i in range(LAYERS)}
    else:
        _whole, caches = vllm_cpu_caches(LAYERS, 8, 2, HD)
    w.register_kv_caches(caches)
    return w


def push_plan() -> StepPlan:
    return StepPlan(pushes=[PushOrder("r1", "t1", {"transfer_id": "t1"}, [1, 2], 20),
                            PushOrder("r2", "t2", {"transfer_id": "t2"}, [3], None)])


def test_worker_host_cache_pushes_layer_by_layer() -> None:
    assert LAYERS == 2
    w = registered_worker()
    calls: List[Any] = w.inst.calls
    plan = push_plan()
    # start_load_kv, before the forward: each push starts with no layer final (vLLM CPU's cache: no
    # tail rows to zero, see register_kv_caches).
    w.start_load_kv(plan)
    assert calls == [("push", "t1", [1, 2], "r1", 0), ("push", "t2", [3], "r2", 0)]
    del calls[:]
    # save_kv_layer after each attention layer: layers 0..i final in every push of the step; a name
    # that is no registered KV cache layer changes nothing.
    w.save_kv_layer("model.layers.0.self_attn.attn")
    w.save_kv_layer("model.layers.0.mlp")
    assert calls == [("push_layers", "t1", 1), ("push_layers", "t2", 1)]
    w.save_kv_layer("model.layers.1.self_attn.attn")
    assert calls[2:] == [("push_layers", "t1", 2), ("push_layers", "t2", 2)]
    del calls[:]
    # wait_for_save: every layer final (a no-op for pdlink here, as save_kv_layer said them all), no
    # second push; later steps' save_kv_layer calls say nothing.
    w.wait_for_save(plan)
    assert calls == [("push_layers", "t1", LAYERS), ("push_layers", "t2", LAYERS)]
    w.save_kv_layer("model.layers.1.self_attn.attn")
    assert len(calls) == 2
    assert (w.stats["pushes"], w.stats["pushes_layered"]) == (2, 2)
    # Reported sent once pdlink freed the push and vLLM said the request finished, as a whole push.
    w.inst.pending_events = [(Event.FREED, "t1", -1)]
    assert w.get_transfer_results({"r1"}) == ({"r1"}, set(), set())


def test_worker_layers_never_reported_are_made_final_by_wait_for_save() -> None:
    w = registered_worker()
    w.start_load_kv(push_plan())
    w.wait_for_save(push_plan())            # vLLM reported no attention layer of this model
    assert w.inst.calls[2:] == [("push_layers", "t1", LAYERS), ("push_layers", "t2", LAYERS)]


def test_worker_layered_push_that_cannot_start_is_not_pushed_again() -> None:
    w = registered_worker()
    w.inst.refuse_push = {"t1"}
    w.start_load_kv(push_plan())
    w.save_kv_layer("model.layers.0.self_attn.attn")
    w.wait_for_save(push_plan())
    assert [c for c in w.inst.calls if c[1] == "t1"] == []
    assert (w.stats["pushes_failed"], w.stats["pushes"], w.stats["pushes_layered"]) == (1, 1, 1)
    # Handled as a whole push's failure: the request is reported sent, its blocks are not pinned.
    assert w.get_transfer_results({"r1"}) == ({"r1"}, set(), set())


def test_worker_stops_saying_layers_of_a_push_pdlink_gave_up() -> None:
    w = registered_worker()
    w.start_load_kv(push_plan())
    w.inst.gone = {"t2"}                    # its decode abandoned it: pdlink no longer knows it
    w.save_kv_layer("model.layers.0.self_attn.attn")
    w.save_kv_layer("model.layers.1.self_attn.attn")
    w.wait_for_save(push_plan())
    assert [c for c in w.inst.calls if c[0] == "push_layers"] == [
        ("push_layers", "t1", 1), ("push_layers", "t1", 2), ("push_layers", "t1", LAYERS)]


def test_worker_forgets_the_layered_pushes_of_a_step_without_wait_for_save() -> None:
    # The forward failed: its layers were not all computed, so the next step must not say them final.
    w = registered_worker()
    w.start_load_kv(push_plan())
    w.start_load_kv(StepPlan())
    w.save_kv_layer("model.layers.1.self_attn.attn")
    assert [c for c in w.inst.calls if c[0] == "push_layers"] == []


def test_worker_cuda_cache_pushes_whole_after_the_forward() -> None:
    w = registered_worker(cuda=True)
    plan = push_plan()
    w.start_load_kv(plan)
    w.save_kv_layer("model.layers.0.self_attn.attn")   # the layer's kernels are only queued: nothing said
    assert w.inst.calls == []
    w.wait_for_save(plan)
    # The tail rows are zeroed first (GPU layouts keep one row per token), then the push goes whole.
    assert w.inst.calls == [("zero_tail", [1, 2], 20), ("push", "t1", [1, 2], "r1", None),
                            ("push", "t2", [3], "r2", None)]
    assert w.stats["pushes"] == 2 and "pushes_layered" not in w.stats


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
        assert counters["connector"]["pushes_layered"] == 1       # started before the forward
    assert sum(c["pdlink"]["kv_bytes"] for *_, c in sent) == LAYERS * (3 - hit) * HEADS * BS * 2 * HD * 4
