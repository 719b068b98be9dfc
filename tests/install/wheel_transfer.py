#!/usr/bin/env python3
"""wheel_transfer.py -- moves KV between two processes with an installed pdlink package (a wheel).

usage: wheel_transfer.py BASE_PORT     (8 free ports from BASE_PORT: tests/tools/free_ports.py 8)

A TP2 prefill process fills every block of its two ranks' KV regions (bytearrays, registered in place)
with a pattern, holds them and hands its kv_transfer_params to a TP2 decode process, which pulls them
over the tcp backend into its own regions and compares every byte with the pattern. It prints where
pdlink was imported from, so a run shows it is the installed package and not a source tree.
Only the standard library and the pdlink package are needed (no numpy).
"""
import multiprocessing as mp
import sys

import pdlink

TP = 2
BLOCKS = 4
GEO = dict(num_layers=2, total_kv_heads=4, head_dim=16, block_size=4, elem_size=2)


def config(role, base):
    return {"kv_connector": "PdlinkConnector", "kv_role": role,
            "kv_connector_extra_config": {"host_ip": "127.0.0.1", "handshake_port": base,
                                          "notify_port": base + TP, "read_mode": True, "backend": "tcp"}}


def pattern(rank, n):
    return bytes((i * 7 + rank * 13 + 1) & 0xFF for i in range(n))


def regions():
    geo = pdlink.Geometry(**GEO)
    return geo, [bytearray(pdlink.kv_region_len(geo, TP, BLOCKS, r)) for r in range(TP)]


def prefill(base, q_out, q_in):
    geo, kv = regions()
    with pdlink.Instance(config("kv_producer", base), geo, tp_size=TP, num_blocks=BLOCKS, kv_buffers=kv) as inst:
        ids = inst.alloc_blocks(BLOCKS)
        for r in range(TP):
            kv[r][:] = pattern(r, len(kv[r]))
        inst.hold("wheel-1", ids)
        q_out.put((ids, inst.params("wheel-1", ids)))
        q_in.get()  # the decode is done
        q_out.put(("releases", inst.counters()["releases_received"], inst.held_transfers))


def main():
    base = int(sys.argv[1])
    print(f"pdlink from {pdlink.__file__}")
    ctx = mp.get_context("spawn")
    to_parent, to_child = ctx.Queue(), ctx.Queue()
    p = ctx.Process(target=prefill, args=(base, to_parent, to_child))
    p.start()
    try:
        src_ids, params = to_parent.get(timeout=120)
        geo, kv = regions()
        with pdlink.Instance(config("kv_consumer", base + 2 * TP), geo, tp_size=TP, num_blocks=BLOCKS,
                             kv_buffers=kv) as inst:
            ids = inst.alloc_blocks(BLOCKS)
            assert ids == src_ids, f"block ids differ: {ids} vs {src_ids}"
            with inst.pull(params, ids) as pull:
                pull.wait()  # no timeout: a failure raises; the ctest timeout bounds a hang
                moved = pull.bytes
            for r in range(TP):
                if bytes(kv[r]) != pattern(r, len(kv[r])):
                    raise SystemExit(f"FAIL: rank {r}: the pulled KV differs from the prefill's")
            kv_bytes = inst.counters()["kv_bytes"]
        to_child.put("done")
        _, releases, held = to_parent.get(timeout=120)
    finally:
        p.join(timeout=60)
    total = sum(len(b) for b in kv)
    print(f"pulled {moved} bytes (counter kv_bytes {kv_bytes:.0f}) of {total}: every byte matches; "
          f"prefill counted {releases:.0f} releases, {held} transfers still held")
    if moved != total or held != 0 or releases < TP or p.exitcode != 0:
        raise SystemExit("FAIL: bytes, releases or held transfers are not what a complete transfer leaves")
    print("OK")


if __name__ == "__main__":
    main()
