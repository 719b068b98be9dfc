"""Per-rank counters (``pdl_rank_counters_t``), keyed by their Prometheus names without ``pdlink_`` and
``_total``, read through the C table (``pdl_rank_counters_table``) so no name or offset is copied here."""
from __future__ import annotations

from typing import Any, Dict, Iterable, List, Optional, Tuple

from pdlink._pdlink import ffi, lib
from pdlink.errors import check, new_error

__all__ = ["counter_names"]

_ROWS: Optional[List[Tuple[str, int, int]]] = None


def _rows() -> List[Tuple[str, int, int]]:
    """(short name, kind, offset) per counter, in the C table's order."""
    global _ROWS
    if _ROWS is None:
        n = ffi.new("size_t *")
        t = lib.pdl_rank_counters_table(n)
        rows = []
        for i in range(n[0]):
            name = ffi.string(t[i].name).decode()
            short = name[len("pdlink_"):] if name.startswith("pdlink_") else name
            short = short[:-len("_total")] if short.endswith("_total") else short
            rows.append((short, t[i].kind, t[i].offset))
        _ROWS = rows
    return _ROWS


def counter_names() -> List[str]:
    """The keys of :meth:`Instance.counters`, in the C table's order."""
    return [r[0] for r in _rows()]


def read_counters(inst: Any, ranks: Iterable[int]) -> Dict[str, float]:
    """The counters of ``ranks`` of instance handle ``inst``, summed; ``*_seconds`` values are floats."""
    out: Dict[str, float] = {}
    c = ffi.new("pdl_rank_counters_t *")
    base = ffi.cast("char *", c)
    for r in ranks:
        err = new_error()
        check(lib.pdl_instance_counters(inst, r, c, err), err)
        for name, kind, off in _rows():
            v = ffi.cast("uint64_t *", base + off)[0]
            out[name] = out.get(name, 0) + (v / 1e9 if kind == lib.PDL_COUNTER_NS else int(v))
    return out
