"""The pdlink Python package (python/) moving numpy KV caches between processes, every byte verified.

Each instance runs in its own process (multiprocessing, spawn) with its KV cache in numpy arrays it
registers through the buffer protocol (``kv_buffers``): one array per rank shaped like vLLM's CPU KV
cache, ``[layers, 2 (K, V), num_blocks, heads of the rank, block_size, head_dim]`` of uint16. Producers
fill their blocks with a function of (transfer, layer, K/V, global head, token, dim), hold them and hand
their kv_transfer_params to the consumers, which pull them into other block ids and compare every
element of every pulled block with the function; the blocks nobody pulled must still hold the
consumer's sentinel. Then every producer rank must have counted its releases (no block held) and the
counters must agree with the plan. Topologies: P4/D8 and P8/D4 (8 KV heads: head splitting), 2P1D
(TP4+TP4 -> TP8) and 1P2D (TP8 -> TP4+TP4) with 4 KV heads (TP8 ranks replicate heads).

The package is the one ``pip install`` put into the build tree (the fixture test
``pypi.pdlink_pip_install``, see tests/CMakeLists.txt); PYTHONPATH points there.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import sys
import time
from typing import Any, Dict, List, Tuple

import numpy as np
import pytest

import pdlink

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools"))
from free_ports import free_range  # noqa: E402 (the tests' one port rule: outside the ephemeral range)
from children import get as child_get, reaped, reporting  # noqa: E402

L, BS, HD, NUM_BLOCKS, NBLK = 2, 4, 8, 16, 3
SENTINEL = 0xBEEF
WAIT_S = 120.0  # a generous bound for conditions, never asserted as a duration




def geometry(heads: int) -> pdlink.Geometry:
    return pdlink.Geometry(num_layers=L, total_kv_heads=heads, head_dim=HD, block_size=BS, elem_size=2)


def make_instance(role: str, tp: int, heads: int) -> Tuple[pdlink.Instance, List[np.ndarray]]:
    """An instance on free ports whose KV cache is numpy arrays (one per rank), filled with SENTINEL."""
    geo = geometry(heads)
    for _ in range(20):
        base = free_range(2 * tp)
        cfg = {"kv_connector": "PdlinkConnector", "kv_role": role,
               "kv_connector_extra_config": {"host_ip": "127.0.0.1", "handshake_port": base,
                                             "notify_port": base + tp, "read_mode": True, "backend": "tcp",
                                             "defer_timeout": 60, "transfer_timeout": 30}}
        arrays = []
        for r in range(tp):
            per_rank = max(heads // tp, 1)
            a = np.full((L, 2, NUM_BLOCKS, per_rank, BS, HD), SENTINEL, dtype=np.uint16)
            assert a.nbytes == pdlink.kv_region_len(geo, tp, NUM_BLOCKS, r)
            arrays.append(a)
        try:
            return pdlink.Instance(cfg, geo, tp_size=tp, num_blocks=NUM_BLOCKS, kv_buffers=arrays), arrays
        except pdlink.PdlinkError as e:
            if "in use" not in str(e):
                raise
    raise RuntimeError("no free port range stayed free long enough")


def expected(seed: int, layer: int, kv: int, heads: np.ndarray, nblocks: int) -> np.ndarray:
    """The KV a producer writes for transfer `seed`: shape [nblocks, len(heads), BS, HD], uint16."""
    b = np.arange(nblocks, dtype=np.uint32)[:, None, None, None]
    h = heads.astype(np.uint32)[None, :, None, None]
    t = np.arange(BS, dtype=np.uint32)[None, None, :, None]
    d = np.arange(HD, dtype=np.uint32)[None, None, None, :]
    x = (np.uint32(seed) * np.uint32(0x9E3779B1)) ^ (np.uint32(layer) * np.uint32(0x85EBCA77)) \
        ^ (np.uint32(kv) * np.uint32(0xC2B2AE3D)) ^ (h * np.uint32(0x27D4EB2F)) \
        ^ ((b * BS + t) * np.uint32(0x165667B1)) ^ (d * np.uint32(0xD3A2646C))
    x ^= x >> np.uint32(15)
    x *= np.uint32(0x2C1B3C6D)
    x ^= x >> np.uint32(12)
    v = (x & np.uint32(0xFFFF)).astype(np.uint16)
    v[v == SENTINEL] = 0  # a sentinel value in the payload could hide a block that was never written
    return v


def rank_heads(inst: pdlink.Instance, tp: int, heads: int, r: int) -> np.ndarray:
    n = inst.rank_geometry(r)["num_heads"]
    first = r * heads // tp if tp <= heads else r // (tp // heads)
    return np.arange(first, first + n)


def producer(q_out: Any, q_in: Any, tp: int, heads: int, seeds: List[int]) -> None:
    inst, arrays = make_instance("kv_producer", tp, heads)
    try:
        for seed in seeds:
            ids = inst.alloc_blocks(NBLK)
            for r in range(tp):
                hs = rank_heads(inst, tp, heads, r)
                for layer in range(L):
                    for kv in range(2):
                        arrays[r][layer, kv, ids] = expected(seed, layer, kv, hs, NBLK)
            tid = f"tx-{seed}"
            inst.hold(tid, ids)
            q_out.put(("params", seed, inst.params(tid, ids)))
        # Wait for every release: the consumers tell us when they are done; then nothing may stay held.
        assert q_in.get(timeout=WAIT_S) == "done"
        deadline = time.monotonic() + WAIT_S
        while inst.held_transfers and time.monotonic() < deadline:
            time.sleep(0.01)
        per_rank = [inst.counters(r) for r in range(tp)]
        q_out.put(("final", inst.held_transfers, inst.held_blocks, inst.free_block_count, per_rank,
                   inst.events()))
    finally:
        inst.close()


def consumer(q_out: Any, q_in: Any, tp: int, heads: int, nxfer: int) -> None:
    inst, arrays = make_instance("kv_consumer", tp, heads)
    try:
        checked = pulled = 0
        touched: List[int] = []
        for _ in range(nxfer):
            seed, params = q_in.get(timeout=WAIT_S)
            skip = inst.alloc_blocks(1 + seed % 2)  # so the block ids differ from the producer's
            ids = inst.alloc_blocks(NBLK)
            inst.free_blocks(skip)
            touched += ids
            with inst.pull(params, ids) as pull:
                assert pull.wait(WAIT_S) is True
                pulled += pull.bytes
                assert pull.descriptors > 0
            for r in range(tp):
                hs = rank_heads(inst, tp, heads, r)
                for layer in range(L):
                    for kv in range(2):
                        got = arrays[r][layer, kv, ids]
                        want = expected(seed, layer, kv, hs, NBLK)
                        bad = int(np.count_nonzero(got != want))
                        assert bad == 0, f"seed {seed} rank {r} layer {layer} kv {kv}: {bad} elements differ"
                        checked += got.nbytes
        untouched = [b for b in range(NUM_BLOCKS) if b not in touched]
        for r in range(tp):
            assert np.all(arrays[r][:, :, untouched] == SENTINEL), f"rank {r}: a block nobody pulled changed"
        q_out.put(("final", checked, pulled, inst.counters()))
    finally:
        inst.close()


def run_producer(q_out: Any, *args: Any) -> None:
    reporting(producer)(q_out, *args)


def run_consumer(q_out: Any, *args: Any) -> None:
    reporting(consumer)(q_out, *args)


TOPOLOGIES = [
    # id, prefill TP, decode TP, producers, consumers, KV heads, transfers
    ("P4-D8", 4, 8, 1, 1, 8, 3),
    ("P8-D4", 8, 4, 1, 1, 8, 3),
    ("2P1D", 4, 8, 2, 1, 4, 4),
    ("1P2D", 8, 4, 1, 2, 4, 4),
]


@pytest.mark.parametrize("name,P,D,np_,nc,heads,T", TOPOLOGIES, ids=[t[0] for t in TOPOLOGIES])
def test_numpy_kv_between_processes(name: str, P: int, D: int, np_: int, nc: int, heads: int, T: int) -> None:
    ctx = mp.get_context("spawn")
    from_prod = [ctx.Queue() for _ in range(np_)]
    to_prod = [ctx.Queue() for _ in range(np_)]
    from_cons = [ctx.Queue() for _ in range(nc)]
    to_cons = [ctx.Queue() for _ in range(nc)]
    seeds_of = [[t + 1 for t in range(T) if t % np_ == i] for i in range(np_)]
    cons_of = [[t for t in range(T) if t % nc == j] for j in range(nc)]
    procs = [ctx.Process(target=run_producer, args=(from_prod[i], to_prod[i], P, heads, seeds_of[i]))
             for i in range(np_)]
    procs += [ctx.Process(target=run_consumer, args=(from_cons[j], to_cons[j], D, heads, len(cons_of[j])))
              for j in range(nc)]
    for p in procs:
        p.start()
    with reaped(procs, WAIT_S):
        params: Dict[int, Any] = {}
        for i in range(np_):
            for _ in seeds_of[i]:
                kind, seed, prm = child_get(from_prod[i], procs, f"producer {i} params", WAIT_S)
                assert kind == "params"
                assert prm["remote_block_ids"] and prm["tp_size"] == P and prm["do_remote_prefill"] is True
                params[seed] = prm
        for t in range(T):
            to_cons[t % nc].put((t + 1, params[t + 1]))
        cons_final = [child_get(from_cons[j], procs, f"consumer {j}", WAIT_S) for j in range(nc)]
        for q in to_prod:
            q.put("done")
        prod_final = [child_get(from_prod[i], procs, f"producer {i} final", WAIT_S) for i in range(np_)]

    plan = pdlink.plan(P, D, heads)
    acks = plan["expected_acks"]
    # Every byte of every consumer rank's pulled blocks was compared, and that is what the pulls moved.
    half_block = BS * HD * 2
    per_xfer = sum(len(c["heads"]) for c in plan["consumers"]) * half_block * 2 * L * NBLK
    total_checked = sum(f[1] for f in cons_final)
    assert total_checked == per_xfer * T
    assert sum(f[2] for f in cons_final) == total_checked
    assert sum(f[3]["kv_bytes"] for f in cons_final) == total_checked
    assert sum(f[3]["read_failures"] for f in cons_final) == 0
    # Each consumer rank releases every producer rank of its group: D * group size per transfer.
    group = len(plan["consumers"][0]["group"])
    assert sum(f[3]["releases_sent"] for f in cons_final) == T * D * group
    for i, (kind, held, held_blocks, free_blocks, per_rank, events) in enumerate(prod_final):
        assert kind == "final"
        # the events a vLLM scheduler would wait for: every rank reported each transfer, then one "freed"
        tids = sorted(f"tx-{seed}" for seed in seeds_of[i])
        assert sorted((t, r) for e, t, r in events if e == pdlink.Event.RANK_REPORTED) == sorted(
            (t, r) for t in tids for r in range(P))
        assert sorted(t for e, t, r in events if e == pdlink.Event.FREED) == tids
        assert not [e for e in events if e[0] == pdlink.Event.RANK_EXPIRED]
        assert (held, held_blocks, free_blocks) == (0, 0, NUM_BLOCKS)
        for r, c in enumerate(per_rank):
            # every producer rank (P8/D4: the odd ones too) counted its releases for each transfer
            assert c["releases_received"] == acks * len(seeds_of[i]), f"producer {i} rank {r}"
            assert c["transfers"] == len(seeds_of[i]), f"producer {i} rank {r}"
            assert c["expired"] == 0


def test_errors_carry_pdlink_message() -> None:
    geo = geometry(8)
    with pytest.raises(pdlink.InvalidError) as e:
        pdlink.Instance({"kv_role": "kv_producer", "kv_connector_extra_config": {"read_mode": "yes please"}},
                        geo, tp_size=2, num_blocks=4)
    assert "kv_connector_extra_config.read_mode" in str(e.value) and "yes please" in str(e.value)
    assert e.value.status_name == "PDL_ERR_INVALID"
    with pytest.raises(pdlink.InvalidError, match="tp rank 2 not in"):
        pdlink.kv_region_len(geo, 2, 4, 2)
    with pytest.raises(pdlink.InvalidError, match="kv_buffers.0.: needs a writable C-contiguous buffer"):
        a = np.zeros((2, pdlink.kv_region_len(geo, 1, 4, 0)), dtype=np.uint8)[:, ::2]
        pdlink.Instance({"kv_role": "kv_consumer", "kv_connector_extra_config": {"read_mode": True}}, geo,
                        tp_size=1, num_blocks=4, kv_buffers=[a])
    small = bytearray(64)
    with pytest.raises(pdlink.InvalidError, match="caller KV region .* of 64 bytes, but the geometry needs"):
        base = free_range(2)
        pdlink.Instance({"kv_role": "kv_consumer", "kv_connector_extra_config": {
            "read_mode": True, "handshake_port": base, "notify_port": base + 1}}, geo, tp_size=1, num_blocks=4,
            kv_buffers=[small])
    with pytest.raises(pdlink.InvalidError, match="heads"):
        pdlink.plan(4, 8, 3)


def test_connector_config_reports_the_parsed_values() -> None:
    c = pdlink.connector_config({"kv_role": "kv_consumer", "kv_connector_extra_config": {
        "host_ip": "10.1.2.3", "handshake_port": 7000, "read_mode": True, "backend": "tcp"}})
    assert c["role"] == "consumer" and c["host_ip"] == "10.1.2.3" and c["handshake_port"] == 7000
    assert c["read_mode"] is True and c["backend"] == "tcp"
    d = pdlink.connector_config('{"kv_role": "kv_producer"}')  # JSON text; MoRIIO's defaults filled in
    assert d["role"] == "producer" and d["host_ip"] == "127.0.0.1" and d["read_mode"] is False
    assert d["handshake_port"] == 6301 and d["notify_port"] == 61005
    with pytest.raises(pdlink.InvalidError, match="handshake_port"):
        pdlink.connector_config({"kv_role": "kv_producer", "kv_connector_extra_config": {"handshake_port": 70000}})


def test_plan_matches_the_seed_topologies() -> None:
    p = pdlink.plan(8, 4, 8)
    assert p["expected_acks"] == 1  # each P8 rank is in exactly one TP4 consumer's group
    assert [c["group"] for c in p["consumers"]] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert [r["producer_rank"] for r in p["consumers"][1]["reads"]] == [2, 3]
    q = pdlink.plan(4, 8, 8)
    assert q["expected_acks"] == 2 and [c["heads"] for c in q["consumers"]] == [[h] for h in range(8)]
    assert q["producers"][0]["writes"][1]["consumer_rank"] == 1


def test_instance_owned_memory_and_views() -> None:
    base = free_range(4)
    inst = pdlink.Instance({"kv_role": "kv_producer", "kv_connector_extra_config": {
        "read_mode": True, "handshake_port": base, "notify_port": base + 2}}, geometry(8), tp_size=2,
        num_blocks=NUM_BLOCKS)
    try:
        g = inst.rank_geometry(1)
        assert g["num_heads"] == 4 and g["layer_len"] == NUM_BLOCKS * 2 * 4 * BS * HD * 2
        view = np.frombuffer(inst.kv_layer(1, 1), dtype=np.uint16)
        assert view.size * 2 == g["layer_len"]
        assert set(pdlink.counter_names()) >= {"transfers", "kv_bytes", "releases_received", "expired"}
        assert inst.counters()["transfers"] == 0
        assert inst.engine_id.startswith("127.0.0.1:") and inst.handshake_port(1) == inst.handshake_port(0) + 1
        with pytest.raises(pdlink.PdlinkError, match="free"):
            inst.alloc_blocks(NUM_BLOCKS + 1)
    finally:
        inst.close()
