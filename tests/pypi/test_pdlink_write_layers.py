"""The pdlink Python package's WRITE mode layer by layer (``Instance.push(..., layers=0)`` and
``Instance.push_layers``) between two processes, every byte verified.

The prefill process (TP 2) starts its push before its KV exists, as a vLLM worker does before the
forward; the decode process (TP 4, so each prefill rank writes to two decode ranks and each decode rank
holds half a prefill rank's heads) announces its blocks. Then, layer after layer, the prefill fills the
layer and says it is final, and waits until the decode reports that layer landed on every decode rank
before it fills the next: each layer is written while the later ones do not exist yet, and the decode's
receive is not done before the last layer. At the end every element of every pushed block is compared
with the function that made it, and the blocks nobody pushed still hold the sentinel.
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

L, BS, HD, HEADS, NUM_BLOCKS, NBLK = 4, 4, 8, 8, 16, 3
P, D = 2, 4
SENTINEL = 0xBEEF
WAIT_S = 120.0  # a generous bound for conditions, never asserted as a duration
TID = "tx-layers"


def geometry() -> pdlink.Geometry:
    return pdlink.Geometry(num_layers=L, total_kv_heads=HEADS, head_dim=HD, block_size=BS, elem_size=2)


def make_instance(role: str, tp: int, **extra: Any) -> Tuple[pdlink.Instance, List[np.ndarray], int]:
    """A WRITE-mode instance on free ports whose KV cache is numpy arrays (one per rank), filled with
    SENTINEL; returns it, the arrays and its handshake base (notify base = handshake base + tp)."""
    geo = geometry()
    for _ in range(20):
        base = free_range(2 * tp)
        e = {"host_ip": "127.0.0.1", "handshake_port": base, "notify_port": base + tp, "read_mode": False,
             "backend": "tcp", "defer_timeout": 60, "transfer_timeout": 60}
        e.update(extra)
        cfg = {"kv_connector": "PdlinkConnector", "kv_role": role, "kv_connector_extra_config": e}
        arrays = [np.full((L, 2, NUM_BLOCKS, HEADS // tp, BS, HD), SENTINEL, dtype=np.uint16) for _ in range(tp)]
        try:
            inst = pdlink.Instance(cfg, geo, tp_size=tp, num_blocks=NUM_BLOCKS, kv_buffers=arrays,
                                   allow_write_mode=True)
            return inst, arrays, base
        except pdlink.PdlinkError as ex:
            if "in use" not in str(ex):
                raise
    raise RuntimeError("no free port range stayed free long enough")


def expected(layer: int, kv: int, heads: np.ndarray) -> np.ndarray:
    """The KV the prefill writes: shape [NBLK, len(heads), BS, HD], uint16, never the sentinel."""
    b = np.arange(NBLK, dtype=np.uint32)[:, None, None, None]
    h = heads.astype(np.uint32)[None, :, None, None]
    t = np.arange(BS, dtype=np.uint32)[None, None, :, None]
    d = np.arange(HD, dtype=np.uint32)[None, None, None, :]
    x = (np.uint32(layer + 1) * np.uint32(0x85EBCA77)) ^ (np.uint32(kv) * np.uint32(0xC2B2AE3D)) \
        ^ (h * np.uint32(0x27D4EB2F)) ^ ((b * BS + t) * np.uint32(0x165667B1)) ^ (d * np.uint32(0xD3A2646C))
    x ^= x >> np.uint32(15)
    x *= np.uint32(0x2C1B3C6D)
    x ^= x >> np.uint32(12)
    v = (x & np.uint32(0xFFFF)).astype(np.uint16)
    v[v == SENTINEL] = 0
    return v


def rank_heads(tp: int, r: int) -> np.ndarray:
    n = HEADS // tp
    return np.arange(r * n, (r + 1) * n)


def layer_landed(arrays: List[np.ndarray], ids: List[int], layer: int) -> bool:
    return all(np.array_equal(arrays[r][layer, kv, ids], expected(layer, kv, rank_heads(D, r)))
               for r in range(D) for kv in range(2))


def producer(q_out: Any, q_in: Any) -> None:
    inst, arrays, base = make_instance("kv_producer", P)
    try:
        q_out.put(("up", base))
        dbase = q_in.get(timeout=WAIT_S)
        ids = inst.alloc_blocks(NBLK)
        params = {"transfer_id": TID, "remote_host": "127.0.0.1", "remote_handshake_port": dbase,
                  "remote_notify_port": dbase + D, "remote_tp_size": D}
        inst.push(params, ids, layers=0)          # before any KV exists, as before a forward
        for layer in range(L):
            for r in range(P):
                for kv in range(2):
                    arrays[r][layer, kv, ids] = expected(layer, kv, rank_heads(P, r))
            inst.push_layers(TID, layer + 1)
            if layer + 1 < L:                     # after the last one the push may be over at once
                inst.push_layers(TID, layer)      # a smaller count is ignored
            # The decode reports this layer on every rank before the next one is even filled here.
            assert q_in.get(timeout=WAIT_S) == ("landed", layer)
        deadline = time.monotonic() + WAIT_S
        while inst.held_transfers and time.monotonic() < deadline:
            time.sleep(0.01)
        with pytest.raises(pdlink.PdlinkError, match=TID):
            inst.push_layers(TID, L)              # the push is over
        q_out.put(("final", inst.held_transfers, inst.free_block_count, inst.counters(), inst.events()))
    finally:
        inst.close()


def consumer(q_out: Any, q_in: Any) -> None:
    inst, arrays, base = make_instance("kv_consumer", D)
    try:
        q_out.put(("up", base))
        pbase = q_in.get(timeout=WAIT_S)
        skip = inst.alloc_blocks(2)               # so the block ids differ from the producer's
        ids = inst.alloc_blocks(NBLK)
        inst.free_blocks(skip)
        params = {"transfer_id": TID, "remote_host": "127.0.0.1", "remote_handshake_port": pbase,
                  "remote_notify_port": pbase + P, "remote_tp_size": P}
        done_early = []
        with inst.expect_push(params, ids) as recv:
            for layer in range(L):
                deadline = time.monotonic() + WAIT_S
                while not layer_landed(arrays, ids, layer):
                    assert time.monotonic() < deadline, f"layer {layer} never landed"
                    time.sleep(0.005)
                if layer + 1 < L:
                    done_early.append(recv.wait(0) or any(recv.write_done(r) for r in range(D)))
                q_out.put(("landed", layer))
            assert recv.wait(WAIT_S) is True
            write_done = [recv.write_done(r) for r in range(D)]
        checked = 0
        for r in range(D):
            for layer in range(L):
                for kv in range(2):
                    got = arrays[r][layer, kv, ids]
                    bad = int(np.count_nonzero(got != expected(layer, kv, rank_heads(D, r))))
                    assert bad == 0, f"rank {r} layer {layer} kv {kv}: {bad} elements differ"
                    checked += got.nbytes
        untouched = [b for b in range(NUM_BLOCKS) if b not in ids]
        for r in range(D):
            assert np.all(arrays[r][:, :, untouched] == SENTINEL), f"rank {r}: a block nobody pushed changed"
        q_out.put(("final", checked, done_early, write_done, inst.counters()))
    finally:
        inst.close()


def run_producer(q_out: Any, q_in: Any) -> None:
    reporting(producer)(q_out, q_in)


def run_consumer(q_out: Any, q_in: Any) -> None:
    reporting(consumer)(q_out, q_in)


def test_push_layer_by_layer_between_processes() -> None:
    ctx = mp.get_context("spawn")
    from_prod, to_prod, from_cons, to_cons = (ctx.Queue() for _ in range(4))
    procs = [ctx.Process(target=run_producer, args=(from_prod, to_prod)),
             ctx.Process(target=run_consumer, args=(from_cons, to_cons))]
    for p in procs:
        p.start()
    with reaped(procs, WAIT_S):
        _, pbase = child_get(from_prod, procs, "producer up", WAIT_S)
        _, dbase = child_get(from_cons, procs, "consumer up", WAIT_S)
        to_prod.put(dbase)
        to_cons.put(pbase)
        for layer in range(L):
            msg = child_get(from_cons, procs, f"layer {layer} on the decode", WAIT_S)
            assert msg == ("landed", layer)
            to_prod.put(msg)
        cons = child_get(from_cons, procs, "consumer final", WAIT_S)
        prod = child_get(from_prod, procs, "producer final", WAIT_S)
    _, checked, done_early, write_done, ccounters = cons
    _, held, free_blocks, pcounters, events = prod
    # Every decode rank's share of every layer, compared element by element.
    assert checked == L * 2 * NBLK * HEADS * BS * HD * 2
    assert pcounters["kv_bytes"] == checked and pcounters["write_failures"] == 0
    # No write_done (nor the receive's end) before the last layer was final.
    assert done_early == [False] * (L - 1)
    assert write_done == [1] * D                  # P2/D4: one producer rank per decode rank
    assert ccounters["write_done_failed"] == 0
    # Each producer rank waited at its gate at least for the layers after the first.
    assert pcounters["push_layer_waits"] >= P
    assert (held, free_blocks) == (0, NUM_BLOCKS)
    assert [e[0] for e in events if e[0] == pdlink.Event.FREED] == [pdlink.Event.FREED]


def test_push_layers_refusals() -> None:
    inst, _arrays, _base = make_instance("kv_producer", 1)
    try:
        with pytest.raises(pdlink.PdlinkError, match="tx-nobody") as e:
            inst.push_layers("tx-nobody", 1)
        assert e.value.status_name == "PDL_ERR_NOT_FOUND"
        ids = inst.alloc_blocks(1)
        params = {"transfer_id": "tx-r", "remote_host": "127.0.0.1", "remote_handshake_port": 1000,
                  "remote_notify_port": 1100, "remote_tp_size": 1}
        with pytest.raises(pdlink.InvalidError, match="layers=5"):
            inst.push(params, ids, layers=L + 1)
        assert inst.held_transfers == 0           # refused before anything was pushed
        inst.push(params, ids, layers=2)
        with pytest.raises(pdlink.InvalidError, match="-1 layers"):
            inst.push_layers("tx-r", -1)
        inst.push_layers("tx-r", 1)               # below what was said: ignored
        assert inst.held_transfers == 1
    finally:
        inst.close()
