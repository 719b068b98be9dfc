"""pdlink.vllm without vLLM: the scheduler half with fake requests, the worker half over numpy "tensors"
(fake pdlink instances, then real ones in two processes), and the params a producer returns against what
pdlink's own Instance.params returns. vLLM itself is exercised by scripts/vllm-e2e."""
from __future__ import annotations

import ctypes
import json
import multiprocessing as mp
import os
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import pytest

import pdlink
from pdlink.events import Event
from pdlink.vllm.kvcache import kv_region, layer_index
from pdlink.vllm.params import Endpoint, parse_endpoint, transfer_params
from pdlink.vllm.plan import HoldOrder, PullOrder, ReleaseOrder, StepPlan
from pdlink.vllm.scheduler import PdlinkScheduler
from pdlink.vllm.worker import PdlinkWorker

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools"))
from free_ports import free_range  # noqa: E402 (the tests' one port rule: outside the ephemeral range)

BS = 16


def config(role: str, base: int = 23100, **extra: Any) -> Dict[str, Any]:
    e = {"host_ip": "127.0.0.1", "handshake_port": base, "notify_port": base + 50, "read_mode": True,
         "backend": "tcp"}
    e.update(extra)
    return {"kv_connector": "PdlinkConnector", "kv_role": role, "kv_connector_extra_config": e}


@dataclass
class Req:
    request_id: str
    num_prompt_tokens: int
    kv_transfer_params: Optional[Dict[str, Any]]
    num_computed_tokens: int = 0


@dataclass
class Blocks:
    ids: Dict[str, List[int]] = field(default_factory=dict)

    def __call__(self, rid: str) -> List[int]:
        return self.ids[rid]


# ---- the scheduler half -----------------------------------------------------------------------------------

def test_endpoint_parsed_by_libpdlink() -> None:
    ep = parse_endpoint(config("kv_producer", 23100))
    assert ep == Endpoint("127.0.0.1", 23100, 23150, "producer", True)
    # MoRIIO's defaults when the ports are falsy, as the C parser applies them.
    ep = parse_endpoint({"kv_role": "kv_consumer", "kv_connector_extra_config": {"handshake_port": 0,
                                                                                  "read_mode": "true"}})
    assert (ep.handshake_port, ep.notify_port, ep.role, ep.read_mode) == (6301, 61005, "consumer", True)
    with pytest.raises(pdlink.InvalidError, match="read_mode"):
        parse_endpoint(config("kv_producer", read_mode="yes please"))


def test_write_mode_follows_the_config() -> None:
    assert PdlinkScheduler(config("kv_producer", read_mode=False), tp_size=1, block_size=BS).write
    assert not PdlinkScheduler(config("kv_producer"), tp_size=1, block_size=BS).write


def test_params_equal_instance_params() -> None:
    """The scheduler has no instance, so it builds the params itself: they must be what pdlink's own
    producer (Instance.params) returns for the same config, TP and blocks."""
    cfg = config("kv_producer", free_range(60))
    geo = pdlink.Geometry(num_layers=1, total_kv_heads=2, head_dim=8, block_size=BS, elem_size=4)
    with pdlink.Instance(cfg, geo, tp_size=2, num_blocks=8) as inst:
        want = inst.params("tx-1", [3, 5, 7])
    got = transfer_params(parse_endpoint(cfg), transfer_id="tx-1", block_ids=[3, 5, 7], tp_size=2, dp_rank=0,
                          dp_size=1)
    assert got == want


def test_producer_holds_in_the_step_that_completes_the_prompt() -> None:
    blocks = Blocks({"r1": [4, 9, 2, 11]})
    s = PdlinkScheduler(config("kv_producer"), tp_size=2, block_size=BS, block_ids_of=blocks)
    r = Req("r1", 40, {"do_remote_decode": True, "do_remote_prefill": False, "transfer_id": "tx-abc"})
    assert s.get_num_new_matched_tokens(r, 0) == (0, False)
    s.update_state_after_alloc(r, [4, 9], 0)
    # First chunk: 32 of 40 prompt tokens -- no hold yet (the KV is not complete).
    assert not s.build_connector_meta({"r1": 32})
    r.num_computed_tokens = 32
    assert not s.build_connector_meta({})               # not scheduled this step
    plan = s.build_connector_meta({"r1": 8})
    # 40 tokens of block size 16 fill 3 blocks; the 4th (allocated for the output) is not the prompt's.
    # num_tokens: the workers zero the last block's rows past the prompt's 40 tokens before the hold.
    assert plan.holds == [HoldOrder("r1", "tx-abc", [4, 9, 2], 40)]
    assert not s.build_connector_meta({"r1": 1})         # held once only
    delay, params = s.request_finished(r, [4, 9, 2, 11], length_capped=True)
    assert delay is True
    assert params is not None and params["remote_block_ids"] == [4, 9, 2]
    assert (params["transfer_id"], params["tp_size"], params["remote_host"]) == ("tx-abc", 2, "127.0.0.1")
    assert params["remote_engine_id"] == "127.0.0.1:23100" and params["do_remote_prefill"] is True
    assert s.tracked_requests == 0


def test_producer_held_but_stopped_frees_blocks_without_params() -> None:
    s = PdlinkScheduler(config("kv_producer"), tp_size=1, block_size=BS, block_ids_of=Blocks({"r": [1]}))
    r = Req("r", 5, {"do_remote_decode": True})
    s.update_state_after_alloc(r, [1], 0)
    plan = s.build_connector_meta({"r": 5})
    assert plan.holds[0].transfer_id == "pdl-r"           # no transfer_id from the router: one is made
    # Stopped on its own first token: no params leave the engine, so no decode can come; vLLM frees the
    # blocks now and the workers drop the hold (test_pdlink_vllm_aborts.py has the rest).
    assert s.request_finished(r, [1], length_capped=False) == (False, None)
    assert [(d.request_id, d.transfer_id, d.reason) for d in s.build_connector_meta({}).drops] == \
        [("r", "pdl-r", "stopped")]


def test_producer_aborted_before_hold_frees_at_once() -> None:
    s = PdlinkScheduler(config("kv_producer"), tp_size=1, block_size=BS, block_ids_of=Blocks({"r": [1, 2]}))
    r = Req("r", 30, {"do_remote_decode": True})
    s.update_state_after_alloc(r, [1, 2], 0)
    s.build_connector_meta({"r": 16})
    assert s.request_finished(r, [1, 2], length_capped=False) == (False, None)
    assert s.tracked_requests == 0
    plain = Req("p", 30, None)
    s.update_state_after_alloc(plain, [3], 0)
    assert s.request_finished(plain, [3], length_capped=True) == (False, None)


def remote_params(ids: List[int]) -> Dict[str, Any]:
    return transfer_params(Endpoint("127.0.0.1", 23300, 23350, "producer", True), transfer_id="tx-9",
                           block_ids=ids, tp_size=2, dp_rank=0, dp_size=1)


def test_consumer_pulls_prompt_minus_last_token_asynchronously() -> None:
    s = PdlinkScheduler(config("kv_consumer"), tp_size=1, block_size=BS)
    r = Req("d1", 40, remote_params([7, 8, 9]))
    assert s.get_num_new_matched_tokens(r, 0) == (39, True)
    s.update_state_after_alloc(r, [20, 21, 22], 39)
    assert r.kv_transfer_params["do_remote_prefill"] is False     # not pulled twice
    assert s.get_num_new_matched_tokens(r, 0) == (0, False)
    plan = s.build_connector_meta({})
    assert [(p.request_id, p.block_ids, p.params["remote_block_ids"]) for p in plan.pulls] == \
        [("d1", [20, 21, 22], [7, 8, 9])]
    assert plan.pulls[0].params["do_remote_prefill"] is True and plan.pulls[0].params["transfer_id"] == "tx-9"
    assert not s.build_connector_meta({})                          # handed over once


def test_consumer_pairs_blocks_by_token_position() -> None:
    s = PdlinkScheduler(config("kv_consumer"), tp_size=1, block_size=BS)
    # 33 prompt tokens: the prefill has 3 blocks, the decode loads 32 tokens into 2 -- remote block 3 (the
    # one holding only the last token, recomputed here) is not read; a tail alignment would shift by one.
    r = Req("a", 33, remote_params([7, 8, 9]))
    assert s.get_num_new_matched_tokens(r, 0) == (32, True)
    s.update_state_after_alloc(r, [30, 31], 32)
    p = s.build_connector_meta({}).pulls[0]
    assert (p.block_ids, p.params["remote_block_ids"]) == ([30, 31], [7, 8])
    # A local prefix hit of one block: only blocks 2.. are pulled, from the same positions remotely.
    r = Req("b", 40, remote_params([7, 8, 9]))
    assert s.get_num_new_matched_tokens(r, 16) == (23, True)
    s.update_state_after_alloc(r, [40, 41, 42], 23)
    p = s.build_connector_meta({}).pulls[0]
    assert (p.block_ids, p.params["remote_block_ids"]) == ([41, 42], [8, 9])


def test_consumer_releases_what_it_will_not_pull() -> None:
    s = PdlinkScheduler(config("kv_consumer"), tp_size=1, block_size=BS)
    one = Req("one", 1, remote_params([5]))                       # nothing but the recomputed token
    assert s.get_num_new_matched_tokens(one, 0) == (0, False)
    s.update_state_after_alloc(one, [3], 0)
    aborted = Req("ab", 50, remote_params([1, 2, 3, 4]))
    assert s.request_finished(aborted, [], length_capped=False) == (False, None)
    plan = s.build_connector_meta({})
    assert not plan.pulls and sorted(r.request_id for r in plan.releases) == ["ab", "one"]
    assert all(r.params["transfer_id"] == "tx-9" for r in plan.releases)
    # Params that do not cover the blocks: released and reported failed, never pulled short.
    bad = Req("bad", 40, remote_params([7]))
    assert s.get_num_new_matched_tokens(bad, 0) == (39, True)
    s.update_state_after_alloc(bad, [1, 2, 3], 39)
    plan = s.build_connector_meta({})
    assert plan.failed == ["bad"] and not plan.pulls and plan.releases[0].request_id == "bad"


def test_requests_without_params_are_ignored() -> None:
    for role in ("kv_producer", "kv_consumer"):
        s = PdlinkScheduler(config(role), tp_size=1, block_size=BS, block_ids_of=Blocks({"x": [1]}))
        r = Req("x", 10, None)
        assert s.get_num_new_matched_tokens(r, 0) == (0, False)
        s.update_state_after_alloc(r, [1], 0)
        assert not s.build_connector_meta({"x": 10})
        assert s.request_finished(r, [1], length_capped=True) == (False, None)


# ---- the worker half with a fake instance ---------------------------------------------------------------

class FakeTensor:
    """What kv_region reads of a torch CPU tensor, over a numpy view."""

    def __init__(self, arr: np.ndarray, device: str = "cpu") -> None:
        self.a = arr
        self.shape = arr.shape
        self.dtype = arr.dtype
        self.device = device

    def data_ptr(self) -> int:
        return self.a.ctypes.data

    def numel(self) -> int:
        return self.a.size

    def element_size(self) -> int:
        return self.a.itemsize

    def is_contiguous(self) -> bool:
        return bool(self.a.flags.c_contiguous)


def vllm_cpu_caches(layers: int, blocks: int, heads: int, head_dim: int, dtype: Any = np.float32):
    """vLLM CPU's layout: one allocation, layer l a (blocks, heads, BS, 2*head_dim) view at l*layer_len."""
    whole = np.zeros((layers, blocks, heads, BS, 2 * head_dim), dtype=dtype)
    names = [f"model.layers.{i}.self_attn.attn" for i in range(layers)]
    return whole, {n: FakeTensor(whole[i]) for i, n in enumerate(names)}


def test_kv_region_accepts_adjacent_layers_and_names_the_one_that_is_not() -> None:
    assert layer_index("model.layers.12.self_attn.attn") == 12
    whole, caches = vllm_cpu_caches(3, 4, 2, 8)
    # Registration order is not layer order in general: sorted by the layer number in the name.
    buf, geo = kv_region(dict(reversed(list(caches.items()))))
    assert ctypes.sizeof(buf) == whole.nbytes and ctypes.addressof(buf) == whole.ctypes.data
    assert geo == {"num_layers": 3, "num_blocks": 4, "heads": 2, "block_size": BS, "head_dim": 8,
                   "elem_size": 4, "layer_len": whole[0].nbytes, "kv_separate": True, "order": "hnd",
                   "fused": True}
    # A layer elsewhere (one allocation per layer, as vLLM's GPU runner makes them): one region per layer.
    other = np.zeros_like(whole[1])
    caches["model.layers.1.self_attn.attn"] = FakeTensor(other)
    bufs, geo2 = kv_region(caches)
    assert geo2 == geo
    assert [ctypes.addressof(b) for b in bufs] == [whole[0].ctypes.data, other.ctypes.data, whole[2].ctypes.data]
    assert all(ctypes.sizeof(b) == whole[0].nbytes for b in bufs)
    _, caches = vllm_cpu_caches(2, 4, 2, 8)
    caches["model.layers.1.self_attn.attn"] = FakeTensor(whole[1, :, :, :, :8])
    with pytest.raises(ValueError, match="every layer alike and contiguous"):
        kv_region(caches)
    _, caches = vllm_cpu_caches(1, 4, 2, 8)
    caches["model.layers.0.self_attn.attn"].device = "cuda:0"       # CPU's fused shape on a GPU
    with pytest.raises(ValueError, match="expected vLLM's GPU layout, 5 dims"):
        kv_region(caches)
    caches["model.layers.0.self_attn.attn"].device = "xpu:0"
    with pytest.raises(ValueError, match="is on xpu:0; pdlink moves CPU and CUDA memory"):
        kv_region(caches)


class FakePull:
    def __init__(self, outcome: List[Any]) -> None:
        self.outcome = outcome        # [False, ..., True] or an exception at the end
        self.closed = False

    def wait(self, timeout: float) -> bool:
        o = self.outcome.pop(0) if len(self.outcome) > 1 else self.outcome[0]
        if isinstance(o, Exception):
            raise o
        return o

    def close(self) -> None:
        self.closed = True


class FakeInstance:
    def __init__(self) -> None:
        self.calls: List[Any] = []
        self.pull_outcomes: Dict[str, List[Any]] = {}
        self.pending_events: List[Any] = []
        self.refuse_hold = False

    def hold(self, tid: str, ids: List[int], rid: Optional[str], num_tokens: Optional[int] = None) -> None:
        if self.refuse_hold:
            raise pdlink.PdlinkError(-1, "no room")
        self.calls.append(("hold", tid, list(ids)) if num_tokens is None else ("hold", tid, list(ids), num_tokens))

    def pull(self, params: Dict[str, Any], ids: List[int], rid: Optional[str]) -> FakePull:
        self.calls.append(("pull", params["transfer_id"], list(ids)))
        out = self.pull_outcomes[params["transfer_id"]]
        if isinstance(out, Exception):
            raise out
        return FakePull(out)

    def abandon(self, params: Dict[str, Any], rid: Optional[str]) -> None:
        self.calls.append(("abandon", params["transfer_id"]))

    def events(self) -> List[Any]:
        ev, self.pending_events = self.pending_events, []
        return ev

    def counters(self) -> Dict[str, float]:
        return {"kv_bytes": 0}


def fake_worker(role: str, read_mode: bool = True) -> PdlinkWorker:
    w = PdlinkWorker(config(role, read_mode=read_mode), tp_size=1, tp_rank=0, total_kv_heads=2)
    w.inst = FakeInstance()
    return w


def pull_order(rid: str, tid: str, ids: List[int]) -> PullOrder:
    return PullOrder(rid, dict(remote_params(ids), transfer_id=tid), ids)


def test_worker_reports_pulls_done_and_failed() -> None:
    w = fake_worker("kv_consumer")
    w.inst.pull_outcomes = {"t-ok": [False, True], "t-bad": [False, pdlink.PdlinkError(-5, "peer gone")],
                            "t-refused": pdlink.InvalidError(-2, "bad params")}
    plan = StepPlan(pulls=[pull_order("ok", "t-ok", [1]), pull_order("bad", "t-bad", [2]),
                           pull_order("refused", "t-refused", [3])],
                    releases=[ReleaseOrder("rel", dict(remote_params([4]), transfer_id="t-rel"))],
                    failed=["short"])
    w.start_load_kv(plan)
    assert ("abandon", "t-rel") in w.inst.calls
    # A pull that could not even start, and a request the scheduler could not pair, fail at once.
    assert w.get_transfer_results(set()) == (set(), {"refused", "short"}, {"refused", "short"})
    # Second poll: "ok" finishes, "bad" raises -- it must be reported failed, never as loaded.
    assert w.get_transfer_results(set()) == (set(), {"ok", "bad"}, {"bad"})
    assert w.get_transfer_results(set()) == (set(), set(), set())
    assert w.stats["pulls"] == 1 and w.stats["pulls_failed"] == 1 and w.stats["releases"] == 1


def test_worker_reports_sent_only_after_freed_and_finished() -> None:
    w = fake_worker("kv_producer")
    w.wait_for_save(StepPlan(holds=[HoldOrder("r1", "t1", [1, 2], 20), HoldOrder("r2", "t2", [3])]))
    # The prompt's token count goes with the hold (pdlink zeroes the last block's tail first).
    assert w.inst.calls == [("hold", "t1", [1, 2], 20), ("hold", "t2", [3])]
    # r1 freed by pdlink before vLLM told this worker r1 finished: held back (vLLM's contract).
    w.inst.pending_events = [(Event.RANK_REPORTED, "t1", 0), (Event.FREED, "t1", 0)]
    assert w.get_transfer_results(set()) == (set(), set(), set())
    assert w.get_transfer_results({"r1", "r2"}) == ({"r1"}, set(), set())
    # r2 finished earlier, freed now (after an expiry): reported; unknown transfers are ignored.
    w.inst.pending_events = [(Event.RANK_EXPIRED, "t2", 0), (Event.FREED, "t2", 0), (Event.FREED, "t-unknown", 0)]
    assert w.get_transfer_results(set()) == ({"r2"}, set(), set())
    assert (w.stats["freed"], w.stats["expired"], w.stats["holds"]) == (2, 1, 2)


def test_worker_failed_hold_does_not_pin_blocks() -> None:
    w = fake_worker("kv_producer")
    w.inst.refuse_hold = True
    w.wait_for_save(StepPlan(holds=[HoldOrder("r", "t", [1])]))
    assert w.stats["holds_failed"] == 1
    assert w.get_transfer_results({"r"}) == ({"r"}, set(), set())


def test_worker_writes_counters_file(tmp_path: Any, monkeypatch: Any) -> None:
    monkeypatch.setenv("PDLINK_VLLM_COUNTERS_DIR", str(tmp_path))
    w = PdlinkWorker(config("kv_consumer"), tp_size=2, tp_rank=1, total_kv_heads=2)
    w.inst = FakeInstance()
    w.inst.pull_outcomes = {"t": [True]}
    w.start_load_kv(StepPlan(pulls=[pull_order("a", "t", [1])]))
    w.get_transfer_results(set())
    c = json.load(open(tmp_path / "kv_consumer-dp0-tp1.json"))
    assert c["connector"]["pulls"] == 1 and c["tp_rank"] == 1 and c["pdlink"] == {"kv_bytes": 0}


# ---- both halves with real pdlink instances, one process per vLLM worker --------------------------------

LAYERS, HEADS, HD, NBLK = 2, 4, 8, 12


PROMPT = 2 * BS + 3      # the e2e's prompt: its last block has 3 tokens of KV


def kv_value(layer: np.ndarray, block_pos: int, head: int, tok: np.ndarray, c: np.ndarray) -> np.ndarray:
    # A function of everything that places a byte: a wrong layer, block, head, token or K/V half differs.
    return layer * 1e5 + block_pos * 1e4 + head * 1e3 + tok * 40 + c + 0.5


def rank_fill(whole: np.ndarray, ids: List[int], tp: int, rank: int, first: int = 0,
              layers: Any = range(LAYERS)) -> None:
    """This rank's heads of the prompt's blocks ``first``, ``first + 1``, ... into ``ids``, in ``layers``."""
    heads = HEADS // tp
    L, _, H, T, C = np.ix_(list(layers), [0], range(heads), range(BS), range(2 * HD))
    for pos, b in enumerate(ids, start=first):
        whole[list(layers), b] = kv_value(L, pos, H + rank * heads, T, C)[:, 0]


def wait_sent(w: PdlinkWorker, rid: str) -> List[str]:
    """Poll a producer worker until it reports ``rid`` sent (or 30 s pass)."""
    sent: set = set()
    for _ in range(3000):
        s, _r, _f = w.get_transfer_results({rid})
        sent |= s
        if sent:
            break
        time.sleep(0.01)
    return sorted(sent)


def producer_rank(tp: int, rank: int, base: int, ids: List[int], q_in: Any, q_out: Any,
                  read_mode: bool = True) -> None:
    """One prefill worker process, called as vLLM calls it in the step that computes the prompt:
    start_load_kv (WRITE: the pushes start), then a forward that fills its heads of ``ids`` layer by layer
    with save_kv_layer after each, then wait_for_save (the holds, READ); report "held", then "sent" once
    pdlink freed the transfer."""
    whole, caches = vllm_cpu_caches(LAYERS, NBLK, HEADS // tp, HD)
    w = PdlinkWorker(config("kv_producer", base, read_mode=read_mode), tp_size=tp, tp_rank=rank,
                     total_kv_heads=HEADS)
    w.register_kv_caches(caches)
    plan = q_in.get()
    w.start_load_kv(plan)
    for layer, name in enumerate(sorted(caches, key=layer_index)):
        rank_fill(whole, ids, tp, rank, layers=[layer])
        w.save_kv_layer(name)
    w.wait_for_save(plan)
    q_out.put(("held", rank))
    rid = (plan.holds or plan.pushes)[0].request_id
    q_out.put(("sent", rank, wait_sent(w, rid), w.counters()))
    w.shutdown()


def consumer_rank(tp: int, rank: int, base: int, q_in: Any, q_out: Any, read_mode: bool = True,
                  first: int = 0) -> None:
    """One decode worker process: report "up", run the plan's pull (READ) or expect (WRITE), then report
    what it loaded and whether its whole cache is exactly the pulled blocks' heads and the sentinel.
    ``first``: the prompt's block the loaded ones start at (the blocks before are a local prefix hit)."""
    whole, caches = vllm_cpu_caches(LAYERS, NBLK, HEADS // tp, HD)
    whole[:] = -1.0
    w = PdlinkWorker(config("kv_consumer", base, read_mode=read_mode), tp_size=tp, tp_rank=rank,
                     total_kv_heads=HEADS)
    w.register_kv_caches(caches)
    q_out.put(("up", rank))
    plan = q_in.get()
    w.start_load_kv(plan)
    order = (plan.pulls or plan.expects)[0]
    got: Tuple[set, set] = (set(), set())
    for _ in range(3000):
        _s, r, f = w.get_transfer_results(set())
        if r:
            got = (r, f)
            break
        time.sleep(0.01)
    want = np.full_like(whole, -1.0)
    rank_fill(want, order.block_ids, tp, rank, first)
    # vLLM CPU's cache has no per-token rows pdlink may address (K of every token, then V, in the
    # kernels' own order), so the worker does not zero the last block's tail there: the whole blocks
    # arrive exactly as the prefill had them.
    q_out.put(("pulled", rank, sorted(got[0]), sorted(got[1]), bool(np.array_equal(whole, want)),
               order.request_id, w.counters()))
    w.shutdown()


def reap(procs: List[Any]) -> None:
    """Join the rank processes; kill one still running after 30 s."""
    for p in procs:
        p.join(30)
        if p.is_alive():
            p.kill()


def collect(out: Any, want: Dict[str, int], timeout: float = 120) -> List[Any]:
    """The rank processes' messages until ``want`` (kind -> count) is met; other kinds are skipped."""
    got: List[Any] = []
    while any(sum(m[0] == k for m in got) < n for k, n in want.items()):
        m = out.get(timeout=timeout)
        if m[0] in want:
            got.append(m)
    return got


@pytest.mark.parametrize("p_tp,d_tp", [(2, 1), (1, 2)])
def test_workers_move_vllm_cpu_kv_between_processes(p_tp: int, d_tp: int) -> None:
    """The scheduler halves plan, the worker halves (one process per TP rank, vLLM's CPU layout in numpy)
    hold and pull through pdlink: every decode rank gets exactly its heads of the pulled blocks (other
    blocks keep the sentinel), reports the request loaded, and every prefill rank reports it sent once
    the releases arrived."""
    ctx = mp.get_context("spawn")
    pbase = free_range(120)                      # config(): handshake base.., notify base+50..
    dbase = pbase + 60
    prompt = PROMPT                              # 3 prefill blocks; the decode loads 2*BS+2 tokens: 3 blocks
    p_ids, d_ids = [5, 2, 9], [7, 3, 10]
    qs = [ctx.Queue() for _ in range(p_tp)]
    out = ctx.Queue()
    procs = [ctx.Process(target=producer_rank, args=(p_tp, r, pbase, p_ids, qs[r], out)) for r in range(p_tp)]
    for p in procs:
        p.start()
    try:
        ps = PdlinkScheduler(config("kv_producer", pbase), tp_size=p_tp, block_size=BS,
                             block_ids_of=Blocks({"req-p": p_ids + [11]}))
        preq = Req("req-p", prompt, {"do_remote_decode": True, "transfer_id": "tx-e2e"})
        ps.update_state_after_alloc(preq, p_ids, 0)
        plan = ps.build_connector_meta({"req-p": prompt})
        for q in qs:
            q.put(plan)
        assert sorted(out.get(timeout=60)[:2] for _ in range(p_tp)) == [("held", r) for r in range(p_tp)]
        _, params = ps.request_finished(preq, p_ids + [11], length_capped=True)

        cs = PdlinkScheduler(config("kv_consumer", dbase), tp_size=d_tp, block_size=BS)
        dreq = Req("req-d", prompt, json.loads(json.dumps(params)))   # as the router forwards it
        n, is_async = cs.get_num_new_matched_tokens(dreq, 0)
        assert (n, is_async) == (prompt - 1, True)
        cs.update_state_after_alloc(dreq, d_ids, n)
        dplan = cs.build_connector_meta({})
        cq = [ctx.Queue() for _ in range(d_tp)]
        cprocs = [ctx.Process(target=consumer_rank, args=(d_tp, r, dbase, cq[r], out)) for r in range(d_tp)]
        procs += cprocs
        for p in cprocs:
            p.start()
        for q in cq:
            q.put(dplan)
        msgs = collect(out, {"pulled": d_tp, "sent": p_tp})
    finally:
        reap(procs)
    pulled, sent = ([m for m in msgs if m[0] == k] for k in ("pulled", "sent"))
    for _, rank, recv, failed, exact, rid, counters in pulled:
        assert (recv, failed, exact) == (["req-d"], [], True), f"decode rank {rank}"
        assert counters["pdlink"]["kv_bytes"] == LAYERS * 3 * (HEADS // d_tp) * BS * 2 * HD * 4
    for _, rank, s, counters in sent:
        assert s == ["req-p"], f"prefill rank {rank} never reported the transfer freed"
        assert counters["connector"]["freed"] == 1 and counters["held_now"] == 0


def test_empty_steps_are_marked_idle_and_the_workers_pause_after_polling(monkeypatch: Any) -> None:
    """vLLM steps only to poll transfers: the plan says the step is idle (nothing computed, nothing
    ordered) and each worker pauses idle_step_s after its poll; planning a step never waits."""
    slept: List[float] = []
    monkeypatch.setattr(time, "sleep", slept.append)
    monkeypatch.setenv("PDLINK_VLLM_IDLE_STEP_MS", "7")
    s = PdlinkScheduler(config("kv_consumer"), tp_size=1, block_size=BS)
    plans = [s.build_connector_meta({}),            # vLLM stepping only to poll transfers
             s.build_connector_meta({"busy": 3})]   # a step that computes
    r = Req("d", 40, remote_params([1, 2, 3]))
    s.get_num_new_matched_tokens(r, 0)
    s.update_state_after_alloc(r, [4, 5, 6], 39)
    plans.append(s.build_connector_meta({}))
    assert plans[2].pulls                           # orders go out at once, never delayed
    assert [p.idle for p in plans] == [True, False, False] and not plans[0] and slept == []
    w = fake_worker("kv_consumer")
    w.inst.pull_outcomes = {"tx-9": [False]}
    for p in plans:
        w.start_load_kv(p)
        w.wait_for_save(p)
        w.get_transfer_results(set(), p)
    assert slept == [0.007]
    monkeypatch.setenv("PDLINK_VLLM_IDLE_STEP_MS", "0")
    fake_worker("kv_consumer").get_transfer_results(set(), plans[0])
    assert slept == [0.007]


def test_pdlink_threads_start_unpinned_from_an_openmp_bound_worker_thread() -> None:
    """vLLM's CPU backend pins a worker's main thread to one OpenMP CPU and every thread started from it
    inherits that: the worker widens the calling thread to its thread_cpus while pdlink may start
    threads (a pull starts a producer's transfer lane), then puts the binding back."""
    allowed = os.sched_getaffinity(0)
    assert len(allowed) >= 2, "this test needs a machine with 2 CPUs or more"
    pinned = {min(allowed)}
    seen: Dict[str, Any] = {}

    def worker_thread() -> None:
        os.sched_setaffinity(0, pinned)              # what libgomp does to vLLM's worker thread
        w = fake_worker("kv_consumer")
        w.thread_cpus = set(allowed)
        real_pull = w.inst.pull

        def pull(params: Dict[str, Any], ids: List[int], rid: Optional[str]) -> FakePull:
            seen["during_pull"] = os.sched_getaffinity(0)
            return real_pull(params, ids, rid)
        w.inst.pull = pull
        w.inst.pull_outcomes = {"t1": [True]}
        w.start_load_kv(StepPlan(pulls=[pull_order("r1", "t1", [1])]))
        seen["after"] = os.sched_getaffinity(0)
        seen["results"] = w.get_transfer_results(set())

    t = threading.Thread(target=worker_thread)
    t.start()
    t.join()
    assert seen["during_pull"] == allowed
    assert seen["after"] == pinned
    assert seen["results"] == (set(), {"r1"}, set())


def test_dp_rank_of_a_dense_model_is_its_original_index() -> None:
    """vLLM runs a dense model's DP ranks as independent engines reconfigured to rank 0 of size 1, the
    original rank kept in data_parallel_index: pdlink's ports (base + dp_rank * tp + rank) need that one,
    or every DP engine binds DP 0's ports (seen: 'bind tcp://127.0.0.1:26230 failed: Address already in
    use' from DP 1)."""
    from types import SimpleNamespace
    from pdlink.vllm.params import dp_of
    assert dp_of(SimpleNamespace(data_parallel_rank=0, data_parallel_size=1, data_parallel_index=1)) == (1, 2)
    assert dp_of(SimpleNamespace(data_parallel_rank=0, data_parallel_size=1, data_parallel_index=0)) == (0, 1)
    assert dp_of(SimpleNamespace(data_parallel_rank=3, data_parallel_size=4, data_parallel_index=3)) == (3, 4)
    assert dp_of(SimpleNamespace(data_parallel_rank=1, data_parallel_size=2)) == (1, 2)   # no index: older vLLM
