"""The topology's plans (``include/pdlink/topo.h``): what pdlink does for a prefill/decode TP pair, from
the same C functions as ``pdlink plan``."""
from __future__ import annotations

from typing import Any, Dict

from pdlink._pdlink import ffi, lib
from pdlink.errors import check, new_error

__all__ = ["plan"]


def plan(prefill_tp: int, decode_tp: int, total_kv_heads: int, is_mla: bool = False) -> Dict[str, Any]:
    """What pdlink does for a P/D TP pair (``pdlink plan``'s data, from the same C functions):
    ``expected_acks`` (releases a producer rank counts), ``expected_write_done``, and per consumer
    rank its group, heads and read pieces; per producer rank its heads, write targets and notify set.
    Raises :class:`InvalidError` for an impossible triple (heads not splittable, TP out of range)."""
    err = new_error()
    acks = ffi.new("int *")
    wd = ffi.new("int *")
    check(lib.pdl_topo_expected_acks(prefill_tp, decode_tp, acks, err), err)
    check(lib.pdl_topo_expected_write_done(prefill_tp, decode_tp, wd, err), err)

    def piece(p: Any) -> Dict[str, int]:
        return {"producer_rank": p.producer_rank, "first_head": p.first_head, "num_heads": p.num_heads,
                "src_head": p.src_head, "dst_head": p.dst_head}

    consumers = []
    rp = ffi.new("pdl_read_plan_t *")
    for d in range(decode_tp):
        check(lib.pdl_topo_read_plan(prefill_tp, decode_tp, total_kv_heads, is_mla, d, rp, err), err)
        consumers.append({"rank": d,
                          "group": list(range(rp.group_first, rp.group_first + rp.group_count)),
                          "heads": list(range(rp.local_first_head, rp.local_first_head + rp.local_num_heads)),
                          "reads": [piece(rp.pieces[i]) for i in range(rp.num_pieces)]})
    producers = []
    wp = ffi.new("pdl_write_plan_t *")
    first = ffi.new("int *")
    count = ffi.new("int *")
    for p in range(prefill_tp):
        check(lib.pdl_topo_write_plan(prefill_tp, decode_tp, total_kv_heads, is_mla, p, wp, err), err)
        check(lib.pdl_topo_heads(prefill_tp, total_kv_heads, is_mla, p, first, count, err), err)
        producers.append({"rank": p, "heads": list(range(first[0], first[0] + count[0])),
                          "notify": list(range(wp.notify_first, wp.notify_first + wp.notify_count)),
                          "writes": [{"consumer_rank": t.consumer_rank, **piece(t.piece)}
                                     for t in (wp.targets[i] for i in range(wp.num_targets))]})
    return {"prefill_tp": prefill_tp, "decode_tp": decode_tp, "total_kv_heads": total_kv_heads,
            "is_mla": is_mla, "expected_acks": acks[0], "expected_write_done": wd[0],
            "consumers": consumers, "producers": producers}

