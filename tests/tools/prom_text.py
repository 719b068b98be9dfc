#!/usr/bin/python3
"""prom_text.py -- Prometheus text exposition as the tests read it back: one number per metric name, the
sum of all its series (every rank, every label set), so a test asks "how many bytes were verified" without
caring which rank verified them."""
from typing import Dict


def sums(text: str) -> Dict[str, float]:
    """Sum of every series of each metric name in `text` (comments and malformed lines skipped)."""
    vals: Dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("#") or " " not in line:
            continue
        series, v = line.rsplit(" ", 1)
        name = series.split("{", 1)[0]
        vals[name] = vals.get(name, 0.0) + float(v)
    return vals
