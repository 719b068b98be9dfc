"""PdlinkConnector's transfer figures in vLLM's connector stats API, so they are on vLLM's own /metrics
as ``vllm:pdlink_*`` (as NixlConnector's are ``vllm:nixl_*``), without vLLM imported here.

vLLM's path (0.32): each worker's ``get_kv_connector_stats()`` after a step returns what it counted since
its last call; vLLM sums the workers' objects (``aggregate``), sends ``to_dict()`` to the API server, which
hands it to the connector class's ``build_kv_connector_stats`` (the periodic "KV Transfer metrics" log
line, from ``reduce``) and to the object ``build_prom_metrics`` made (``observe``: one Prometheus
counter per figure, per engine). So a worker reports deltas and the API server only adds them up.

Each figure is one row of :data:`METRICS`: its key, its help text, and how it follows from a worker
rank's counters -- the connector's own (``PdlinkWorker.stats``) and pdlink's (``Instance.counters``).
The vLLM classes themselves are thin and live in :mod:`pdlink.vllm.connector`."""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Mapping, Tuple

Counts = Mapping[str, float]


def _sum(*keys: str, of: str) -> Callable[[Counts, Counts], float]:
    """A figure that adds ``keys`` of the connector's (``of="connector"``) or pdlink's counters."""
    def figure(connector: Counts, pdlink: Counts) -> float:
        src = connector if of == "connector" else pdlink
        return sum(src.get(k, 0) for k in keys)
    return figure


#: (key, help text, figure): exported as the Prometheus counter ``vllm:pdlink_<key>`` (``_total``).
METRICS: Tuple[Tuple[str, str, Callable[[Counts, Counts], float]], ...] = (
    ("pulls", "KV pulls a decode rank completed (READ mode).", _sum("pulls", of="connector")),
    ("pushes", "KV pushes a prefill rank completed (WRITE mode).", _sum("pushes", of="connector")),
    ("holds", "Prompts a prefill rank held for a decode to pull (READ mode).", _sum("holds", of="connector")),
    ("failures", "Failed pulls, pushes and holds (each fails its request or is recomputed).",
     _sum("pulls_failed", "pushes_failed", "holds_failed", of="connector")),
    ("bytes", "KV bytes pdlink moved (read by a decode rank or written by a prefill rank).",
     _sum("kv_bytes", of="pdlink")),
    ("seconds", "Seconds pdlink's transfers took (reads and writes, summed over transfers).",
     _sum("read_seconds", "write_seconds", of="pdlink")),
)
KEYS: List[str] = [m[0] for m in METRICS]


def totals(connector: Counts, pdlink: Counts) -> Dict[str, float]:
    """Every figure of one worker rank since it started."""
    return {key: figure(connector, pdlink) for key, _, figure in METRICS}


def delta(now: Counts, before: Counts) -> Dict[str, float]:
    """What changed between two :func:`totals`."""
    return {k: now.get(k, 0) - before.get(k, 0) for k in KEYS}


def aggregate(a: Counts, b: Counts) -> Dict[str, float]:
    """Two ranks' (or two steps') figures added up; a key either lacks counts as 0."""
    return {k: a.get(k, 0) + b.get(k, 0) for k in KEYS}


def is_empty(data: Counts) -> bool:
    return not any(data.get(k, 0) for k in KEYS)


def reduce(data: Counts) -> Dict[str, float]:
    """The log line's figures: the sums, seconds rounded to the microsecond."""
    return {k: round(data.get(k, 0), 6) if k == "seconds" else int(data.get(k, 0)) for k in KEYS}


class PromCounters:
    """One Prometheus counter per row of :data:`METRICS`, with a child per engine. ``counter_cls`` is
    vLLM's (``metric_types[Counter]``), which may not be prometheus_client's own."""

    def __init__(self, counter_cls: Any, labelnames: List[str],
                 per_engine_labelvalues: Mapping[int, List[object]]) -> None:
        self.children: Dict[str, Dict[int, Any]] = {}
        for key, doc, _ in METRICS:
            metric = counter_cls(name=f"vllm:pdlink_{key}", documentation=f"pdlink: {doc}", labelnames=labelnames)
            self.children[key] = {idx: metric.labels(*lv) for idx, lv in per_engine_labelvalues.items()}

    def observe(self, data: Counts, engine_idx: int = 0) -> None:
        """Add one report's figures (a counter only goes up: a negative delta, a rank's counters read
        across a restart, is dropped)."""
        for key in KEYS:
            v = data.get(key, 0)
            if v > 0:
                self.children[key][engine_idx].inc(v)
