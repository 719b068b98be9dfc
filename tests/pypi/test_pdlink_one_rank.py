"""The pdlink package the way a vLLM KV connector uses it: one process per TP rank, vLLM's block ids,
vLLM's fused CPU KV layout.

vLLM's CPU backend gives each worker process (one per TP rank) one float32 tensor per layer of shape
``(num_blocks, kv_heads_of_rank, block_size, 2 * head_dim)`` -- K and V concatenated in each token's
row -- with layer l+1 right after layer l: here one numpy array ``[layers, num_blocks, heads, block_size,
2 * head_dim]`` per rank process, registered with ``Instance(..., local_rank=r, external_blocks=True)``
and ``Geometry(..., kv_fused=True)``. The producer's rank processes fill their heads of two transfers
that share a prefix (B's blocks are the first two of A's, both held at once, as with prefix caching),
the consumer's rank processes pull A and then B into block ids of their own choosing, and every
element of every head shard is compared with the value it must have. Each producer rank must then have
counted its own releases and reported both transfers ``(Event.FREED, tid, -1)`` -- what its vLLM worker
reports as finished_sending -- and nothing else. Topologies: P2/D1 and P1/D2 (4 KV heads: split).
"""
from __future__ import annotations

import multiprocessing as mp
import os
import sys
import time
from typing import Any, Dict, List

import numpy as np
import pytest

import pdlink

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools"))
from free_ports import free_range  # noqa: E402 (the tests' one port rule: outside the ephemeral range)
from children import get as child_get, reaped, reporting  # noqa: E402

L, BS, HD, HEADS, NUM_BLOCKS = 2, 4, 8, 4, 12
SENTINEL = -1.0
WAIT_S = 120.0  # a generous bound for conditions, never asserted as a duration
A_IDS, B_IDS = [5, 2, 9], [5, 2]  # B is a prefix of A: blocks 5 and 2 are held twice
A_LOCAL, B_LOCAL = [1, 3, 4], [7, 8]


def geometry() -> pdlink.Geometry:
    return pdlink.Geometry(num_layers=L, total_kv_heads=HEADS, head_dim=HD, block_size=BS, elem_size=4,
                           kv_fused=True)


def config(role: str, base: int, tp: int) -> Dict[str, Any]:
    return {"kv_connector": "PdlinkConnector", "kv_role": role,
            "kv_connector_extra_config": {"host_ip": "127.0.0.1", "handshake_port": base, "notify_port": base + tp,
                                          "read_mode": True, "backend": "tcp", "defer_timeout": 60,
                                          "transfer_timeout": 30}}


def heads_of(tp: int, r: int) -> np.ndarray:
    n = HEADS // tp
    return np.arange(r * n, (r + 1) * n)


def vllm_cache(tp: int, r: int) -> np.ndarray:
    """Rank r's KV cache as vLLM's CPU backend lays it out, every layer in one region."""
    a = np.full((L, NUM_BLOCKS, HEADS // tp, BS, 2 * HD), SENTINEL, dtype=np.float32)
    assert a.nbytes == pdlink.kv_region_len(geometry(), tp, NUM_BLOCKS, r)
    return a


def expected(layer: int, heads: np.ndarray, nblocks: int) -> np.ndarray:
    """The prompt's KV at token positions 0 .. nblocks*BS: [nblocks, len(heads), BS, 2*HD]; the row's
    first HD values are K, the last HD V. Integers below 2^24: exact in float32."""
    b = np.arange(nblocks)[:, None, None, None]
    h = heads[None, :, None, None]
    t = np.arange(BS)[None, None, :, None]
    c = np.arange(2 * HD)[None, None, None, :]
    return (((layer * 64 + h) * 1024 + (b * BS + t)) * 32 + c).astype(np.float32)


def producer_rank(q_out: Any, q_in: Any, tp: int, r: int, base: int) -> None:
    kv = vllm_cache(tp, r)
    with pdlink.Instance(config("kv_producer", base, tp), geometry(), tp_size=tp, num_blocks=NUM_BLOCKS,
                         kv_buffers=[kv], local_rank=r, external_blocks=True) as inst:
        assert inst.local_rank == r
        with pytest.raises(pdlink.PdlinkError, match="external_blocks"):
            inst.alloc_blocks(1)
        other = (r + 1) % tp
        if other != r:
            with pytest.raises(pdlink.InvalidError, match=f"rank {other} is not run by this instance"):
                inst.counters(other)
        for layer in range(L):
            kv[layer, A_IDS] = expected(layer, heads_of(tp, r), len(A_IDS))
        inst.hold("tx-a", A_IDS)
        inst.hold("tx-b", B_IDS)  # overlaps tx-a: prefix caching
        assert inst.held_blocks == len(A_IDS) + len(B_IDS)
        q_out.put(("params", inst.params("tx-a", A_IDS), inst.params("tx-b", B_IDS)))
        freed: List[str] = []
        events: List[Any] = []
        deadline = time.monotonic() + WAIT_S
        while len(freed) < 2 and time.monotonic() < deadline:
            for e in inst.events():
                events.append(e)
                if e[0] == pdlink.Event.FREED:
                    freed.append(e[1])
            time.sleep(0.005)
        # The blocks were the caller's all along: what the events said is the only thing that changed.
        q_out.put(("final", events, inst.counters(), inst.counters(r), inst.held_transfers, inst.free_block_count))
        assert q_in.get(timeout=WAIT_S) == "done"


def consumer_rank(q_out: Any, q_in: Any, tp: int, r: int, base: int) -> None:
    kv = vllm_cache(tp, r)
    buffers = [kv if i == r else None for i in range(tp)]  # the full-list form: only entry r is used
    with pdlink.Instance(config("kv_consumer", base, tp), geometry(), tp_size=tp, num_blocks=NUM_BLOCKS,
                         kv_buffers=buffers, local_rank=r, external_blocks=True) as inst:
        assert inst.rank_geometry(r)["kv_fused"] is True
        params_a, params_b = q_in.get(timeout=WAIT_S)
        checked = 0
        for params, local, n in ((params_a, A_LOCAL, len(A_IDS)), (params_b, B_LOCAL, len(B_IDS))):
            with inst.pull(params, local) as pull:
                assert pull.wait(WAIT_S) is True
            for layer in range(L):
                got = kv[layer, local]
                want = expected(layer, heads_of(tp, r), n)
                bad = int(np.count_nonzero(got != want))
                assert bad == 0, f"consumer rank {r} layer {layer} {params['transfer_id']}: {bad} values differ"
                checked += got.nbytes
        untouched = [b for b in range(NUM_BLOCKS) if b not in A_LOCAL + B_LOCAL]
        assert np.all(kv[:, untouched] == SENTINEL), f"consumer rank {r}: a block nobody pulled changed"
        q_out.put(("final", checked, inst.counters()))


def run_producer(q_out: Any, *args: Any) -> None:
    reporting(producer_rank)(q_out, *args)


def run_consumer(q_out: Any, *args: Any) -> None:
    reporting(consumer_rank)(q_out, *args)


@pytest.mark.parametrize("P,D", [(2, 1), (1, 2)], ids=["P2-D1", "P1-D2"])
def test_one_process_per_rank_fused_external_blocks(P: int, D: int) -> None:
    ctx = mp.get_context("spawn")
    pbase, cbase = free_range(2 * P), free_range(2 * D)
    from_p = [ctx.Queue() for _ in range(P)]
    to_p = [ctx.Queue() for _ in range(P)]
    from_c = [ctx.Queue() for _ in range(D)]
    to_c = [ctx.Queue() for _ in range(D)]
    procs = [ctx.Process(target=run_producer, args=(from_p[r], to_p[r], P, r, pbase)) for r in range(P)]
    procs += [ctx.Process(target=run_consumer, args=(from_c[r], to_c[r], D, r, cbase)) for r in range(D)]
    for p in procs:
        p.start()
    with reaped(procs, WAIT_S):
        params = [child_get(from_p[r], procs, f"producer rank {r} params", WAIT_S) for r in range(P)]
        # Every rank computes the same params (tp_size P, the base ports): a vLLM scheduler computes them.
        assert all(p[1] == params[0][1] and p[2] == params[0][2] for p in params)
        assert params[0][1]["tp_size"] == P and params[0][1]["remote_block_ids"] == A_IDS
        for r in range(D):
            to_c[r].put((params[0][1], params[0][2]))
        cons = [child_get(from_c[r], procs, f"consumer rank {r}", WAIT_S) for r in range(D)]
        prod = [child_get(from_p[r], procs, f"producer rank {r} final", WAIT_S) for r in range(P)]
        for q in to_p:
            q.put("done")

    # Every value of every consumer rank's head shard was compared, and that is what the pulls moved.
    row = 2 * HD * 4
    per_token_all_heads = HEADS * row
    assert sum(c[1] for c in cons) == L * BS * per_token_all_heads * (len(A_IDS) + len(B_IDS))
    assert sum(c[2]["kv_bytes"] for c in cons) == sum(c[1] for c in cons)
    assert sum(c[2]["read_failures"] for c in cons) == 0
    acks = pdlink.plan(P, D, HEADS)["expected_acks"]
    for r, (_, events, summed, own, held, free_blocks) in enumerate(prod):
        # this rank's own releases, both transfers, and the events its vLLM worker reports
        assert own["releases_received"] == 2 * acks, f"producer rank {r}"
        assert summed == own  # counters() with rank None sums the local rank only
        assert sorted(e for e in events if e[0] == pdlink.Event.FREED) == [(pdlink.Event.FREED, "tx-a", -1), (pdlink.Event.FREED, "tx-b", -1)]
        assert sorted(e for e in events if e[0] == pdlink.Event.RANK_REPORTED) == [(pdlink.Event.RANK_REPORTED, "tx-a", r), (pdlink.Event.RANK_REPORTED, "tx-b", r)]
        assert not [e for e in events if e[0] == pdlink.Event.RANK_EXPIRED]
        assert (held, free_blocks) == (0, 0)  # nothing held; no allocator to give blocks back to


def test_local_rank_arguments() -> None:
    geo = geometry()
    base = free_range(4)
    with pytest.raises(pdlink.InvalidError, match="local_rank 2: expected None or 0 .. 1"):
        pdlink.Instance(config("kv_consumer", base, 2), geo, tp_size=2, num_blocks=NUM_BLOCKS, local_rank=2)
    with pytest.raises(pdlink.InvalidError, match=r"kv_buffers: 3 buffers for tp_size 2; expected 1 \(rank 1's\) or 2"):
        pdlink.Instance(config("kv_consumer", base, 2), geo, tp_size=2, num_blocks=NUM_BLOCKS, local_rank=1,
                        kv_buffers=[None, None, None])
    with pdlink.Instance(config("kv_consumer", base, 2), geo, tp_size=2, num_blocks=NUM_BLOCKS,
                         local_rank=1) as inst:
        assert inst.local_rank == 1 and inst.handshake_port(1) == base + 1
        with pytest.raises(pdlink.InvalidError, match="rank 0 is not run by this instance"):
            inst.kv_layer(0, 0)
        with pytest.raises(pdlink.InvalidError, match="rank 0 is not run by this instance"):
            inst.handshake_port(0)
        assert inst.free_block_count == NUM_BLOCKS  # its own allocator: external_blocks is off
        assert np.frombuffer(inst.kv_layer(1, 1), dtype=np.float32).size == NUM_BLOCKS * 2 * BS * 2 * HD
    with pdlink.Instance(config("kv_consumer", free_range(4), 2), geo, tp_size=2, num_blocks=NUM_BLOCKS) as inst:
        assert inst.local_rank is None and inst.counters()["transfers"] == 0
