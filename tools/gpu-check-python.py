#!/usr/bin/env python3
"""tools/gpu-check-python.py -- the Python stage of pdlink's GPU check (docs/gpu.md): pdlink.Instance
over torch CUDA tensors, two processes, READ, every byte compared on the GPU.

For each topology P:D (default 1:1 and 2:4, a head split), a prefill process and a decode process each
make one instance whose ranks' KV caches are torch CUDA tensors of one GPU in vLLM flash-attention's NHD
layout, layers one after the other: per rank (layers, 2, num_blocks, block_size, heads of the rank,
head_dim), fp16. The prefill fills its blocks with a pattern of (layer, K/V, global head, block's place
in the transfer, token, dim) on the GPU, zeroes the last block's rows past the prompt and holds them
(``hold(num_tokens=...)``); the decode pulls into other block ids and compares, on the GPU with
torch.equal, every pulled block with the pattern of its heads (zeros past the prompt) and every other
block with its sentinel. Nothing is copied to the host for the check.

Exit 0: every byte equal; 1: a difference or a failed transfer; 77: no GPU here (no torch, no CUDA
device, or no pdlink package), nothing checked.
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import sys
import time
from typing import Any, Dict, List, Tuple

LAYERS, HEADS, HEAD_DIM, BS = 4, 8, 128, 16


def skip(why: str) -> None:
    print(f"gpu-check python: SKIPPED: no GPU ({why}); nothing was checked", flush=True)
    sys.exit(77)


def config(role: str, base: int) -> Dict[str, Any]:
    # No backend key: CUDA tensors make pdlink.Instance pick "cuda" (GPUs of one host).
    return {"kv_connector": "PdlinkConnector", "kv_role": role,
            "kv_connector_extra_config": {"host_ip": "127.0.0.1", "handshake_port": base,
                                          "notify_port": base + 32, "read_mode": True}}


def geometry() -> Any:
    import pdlink
    return pdlink.Geometry(num_layers=LAYERS, total_kv_heads=HEADS, head_dim=HEAD_DIM, block_size=BS,
                           elem_size=2, order="nhd", kv_separate=True)


def caches(tp: int, num_blocks: int, fill: int) -> List[Any]:
    import torch
    h = HEADS // tp
    return [torch.full((LAYERS, 2, num_blocks, BS, h, HEAD_DIM), fill, dtype=torch.int16, device="cuda")
            .view(torch.float16) for _ in range(tp)]


def pattern(tp: int, rank: int, nblk: int, prompt: int) -> Any:
    """The KV of rank `rank`'s heads for a transfer of nblk blocks, as int16 bits, shape
    (layers, 2, nblk, BS, heads of the rank, head_dim); rows past `prompt` are 0."""
    import torch
    h = HEADS // tp
    dev = "cuda"
    L = torch.arange(LAYERS, device=dev).view(-1, 1, 1, 1, 1, 1)
    K = torch.arange(2, device=dev).view(1, -1, 1, 1, 1, 1)
    B = torch.arange(nblk, device=dev).view(1, 1, -1, 1, 1, 1)
    T = torch.arange(BS, device=dev).view(1, 1, 1, -1, 1, 1)
    H = (torch.arange(h, device=dev) + rank * h).view(1, 1, 1, 1, -1, 1)
    D = torch.arange(HEAD_DIM, device=dev).view(1, 1, 1, 1, 1, -1)
    v = (L * 7919 + K * 4099 + H * 1031 + B * 523 + T * 131 + D + 1) % 32749
    v = torch.where(B * BS + T < prompt, v, torch.zeros_like(v))
    return v.to(torch.int16)


def prefill(tp: int, base: int, ids: List[int], prompt: int, nblocks: int, q_out: Any, q_in: Any) -> None:
    import pdlink
    import torch
    kv = caches(tp, nblocks, 0x5A5A)       # stale rows an earlier request left: must not reach the decode
    with pdlink.Instance(config("kv_producer", base), geometry(), tp_size=tp, num_blocks=nblocks,
                         kv_buffers=kv) as inst:
        idx = torch.tensor(ids, device="cuda")
        for r in range(tp):
            full = pattern(tp, r, len(ids), 1 << 30)          # every row: the tail is pdlink's to zero
            kv[r].view(torch.int16)[:, :, idx] = full
        torch.cuda.synchronize()
        inst.hold("gpu-check", ids, num_tokens=prompt)
        q_out.put({"params": inst.params("gpu-check", ids), "backend": inst.backend})
        q_in.get(timeout=300)


def decode(tp: int, base: int, params: Dict[str, Any], ids: List[int], prompt: int, nblocks: int) -> Tuple[int, str]:
    import pdlink
    import torch
    kv = caches(tp, nblocks, -1)
    with pdlink.Instance(config("kv_consumer", base), geometry(), tp_size=tp, num_blocks=nblocks,
                         kv_buffers=kv) as inst:
        t0 = time.monotonic()
        with inst.pull(params, ids) as pull:
            if not pull.wait(120):
                raise TimeoutError("pull not finished after 120 s")
            nbytes = pull.bytes
        secs = time.monotonic() - t0
        bad = 0
        idx = torch.tensor(ids, device="cuda")
        rest = torch.tensor([b for b in range(nblocks) if b not in ids], device="cuda")
        for r in range(tp):
            got = kv[r].view(torch.int16)
            if not torch.equal(got[:, :, idx], pattern(tp, r, len(ids), prompt)):
                bad += int((got[:, :, idx] != pattern(tp, r, len(ids), prompt)).sum().item())
            if not torch.equal(got[:, :, rest], torch.full_like(got[:, :, rest], -1)):
                bad += int((got[:, :, rest] != -1).sum().item())
        return bad, f"{nbytes} bytes in {secs * 1e3:.1f} ms, backend {inst.backend}"


def run(p_tp: int, d_tp: int, base: int) -> bool:
    nblocks, n = 64, 5
    p_ids = [3 + 7 * i for i in range(n)]
    d_ids = [60 - 11 * i for i in range(n)]
    prompt = (n - 1) * BS + 5
    ctx = mp.get_context("spawn")
    q_out, q_in = ctx.Queue(), ctx.Queue()
    p = ctx.Process(target=prefill, args=(p_tp, base, p_ids, prompt, nblocks, q_out, q_in))
    p.start()
    try:
        got = q_out.get(timeout=300)
        bad, what = decode(d_tp, base + 100, got["params"], d_ids, prompt, nblocks)
    except Exception as e:  # a refused instance, a failed pull: the stage fails with pdlink's message
        print(f"gpu-check python: P{p_tp}/D{d_tp}: FAIL: {type(e).__name__}: {e}", flush=True)
        return False
    finally:
        q_in.put("done")
        p.join(60)
        if p.is_alive():
            p.kill()
    ok = bad == 0 and p.exitcode == 0
    print(f"gpu-check python: P{p_tp}/D{d_tp} READ, {LAYERS} layers x {n} blocks, NHD fp16 torch CUDA tensors: "
          f"{what}; {bad} wrong elements (compared on the GPU); prefill exit {p.exitcode}: "
          f"{'PASS' if ok else 'FAIL'}", flush=True)
    return ok


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--topologies", default="1:1,2:4", help="P:D pairs (default 1:1,2:4)")
    ap.add_argument("--port", type=int, default=int(os.environ.get("PDLINK_GPU_CHECK_PORT", "24600")))
    args = ap.parse_args()
    try:
        import torch
    except ImportError as e:
        skip(f"torch not importable: {e}")
    if not torch.cuda.is_available():
        skip("torch sees no CUDA device")
    try:
        import pdlink  # noqa: F401
    except ImportError as e:
        skip(f"the pdlink package is not importable: {e}")
    ok = True
    for i, pair in enumerate(args.topologies.split(",")):
        p_tp, d_tp = (int(x) for x in pair.split(":"))
        ok &= run(p_tp, d_tp, args.port + 200 * i)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
