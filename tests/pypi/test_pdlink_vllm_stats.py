"""PdlinkConnector's figures through vLLM's connector stats API (pdlink.vllm.stats): a worker reports what
it moved since its last report, and the API server's counters add the reports up as vllm:pdlink_*.

Without vLLM: the worker half with a fake instance, and PromCounters with a fake counter class. With vLLM's
own objects (vLLM's venv, $PDLINK_VLLM_VENV or $PDLINK_BUILD_DIR/vllm-venv, as scripts/install-vllm makes
it; skipped without one): vLLM's KVConnectorLogging and KVConnectorProm resolve PdlinkConnector through
vLLM's connector factory, aggregate two workers' stats as vLLM's scheduler does, and prometheus_client's
exposition shows vllm:pdlink_* with the sums."""
from __future__ import annotations

from typing import Any, Dict, List


from pdlink.vllm import stats
from pdlink.vllm.worker import PdlinkWorker
from vllm_venv import run_in_vllm


def config(role: str) -> Dict[str, Any]:
    return {"kv_connector": "PdlinkConnector", "kv_role": role,
            "kv_connector_extra_config": {"host_ip": "127.0.0.1", "handshake_port": 23500,
                                          "notify_port": 23550, "read_mode": True, "backend": "tcp"}}


class CountingInstance:
    """What transfer_stats reads of a pdlink instance: its counters."""

    def __init__(self) -> None:
        self.c: Dict[str, float] = {"kv_bytes": 0, "read_seconds": 0.0, "write_seconds": 0.0}

    def counters(self) -> Dict[str, float]:
        return dict(self.c)


def test_worker_reports_what_moved_since_its_last_report() -> None:
    w = PdlinkWorker(config("kv_consumer"), tp_size=1, tp_rank=0, total_kv_heads=2)
    w.inst = CountingInstance()
    assert w.transfer_stats() == {}                       # nothing yet: an idle step sends nothing
    w.stats["pulls"] += 2
    w.stats["pulls_failed"] += 1
    w.inst.c.update(kv_bytes=4096, read_seconds=0.25)
    assert w.transfer_stats() == {"pulls": 2, "pushes": 0, "holds": 0, "failures": 1, "bytes": 4096,
                                  "seconds": 0.25}
    assert w.transfer_stats() == {}                       # reported once
    w.stats["pulls"] += 1
    w.inst.c.update(kv_bytes=6144, read_seconds=0.5)
    d = w.transfer_stats()
    assert (d["pulls"], d["bytes"], d["seconds"], d["failures"]) == (1, 2048, 0.25, 0)


def test_every_row_is_a_figure_of_the_issue() -> None:
    assert stats.KEYS == ["pulls", "pushes", "holds", "failures", "bytes", "seconds"]
    a = {"pulls": 1, "bytes": 10, "seconds": 0.5}
    b = {"pulls": 2, "holds": 3, "seconds": 0.25}
    s = stats.aggregate(a, b)
    assert (s["pulls"], s["holds"], s["bytes"], s["seconds"]) == (3, 3, 10, 0.75)
    assert stats.is_empty({}) and stats.is_empty(dict.fromkeys(stats.KEYS, 0)) and not stats.is_empty(a)
    assert stats.reduce(s)["pulls"] == 3 and isinstance(stats.reduce(s)["pulls"], int)


class FakeCounter:
    """prometheus_client's Counter as PromCounters uses it: name, documentation, labelnames, labels, inc."""
    made: List["FakeCounter"] = []

    def __init__(self, name: str, documentation: str, labelnames: List[str]) -> None:
        self.name, self.documentation, self.labelnames = name, documentation, labelnames
        self.values: Dict[tuple, float] = {}
        FakeCounter.made.append(self)

    def labels(self, *lv: object) -> Any:
        outer = self

        class Child:
            def inc(self, v: float) -> None:
                outer.values[lv] = outer.values.get(lv, 0) + v
        return Child()


def test_prom_counters_one_per_figure_and_engine() -> None:
    FakeCounter.made = []
    p = stats.PromCounters(FakeCounter, ["model_name", "engine"], {0: ["m", "0"], 1: ["m", "1"]})
    assert [c.name for c in FakeCounter.made] == [f"vllm:pdlink_{k}" for k in stats.KEYS]
    p.observe({"pulls": 2, "bytes": 100, "seconds": 0.5}, 1)
    p.observe({"pulls": 1, "bytes": -5}, 1)               # a negative delta is dropped, never a decrease
    by = {c.name: c.values for c in FakeCounter.made}
    assert by["vllm:pdlink_pulls"] == {("m", "1"): 3}
    assert by["vllm:pdlink_bytes"] == {("m", "1"): 100}
    assert by["vllm:pdlink_seconds"] == {("m", "1"): 0.5}
    assert by["vllm:pdlink_holds"] == {}


# Run in vLLM's venv: vLLM's own stats classes, factory and Prometheus metric classes.
VLLM_SCRIPT = r'''
import functools, sys
from types import SimpleNamespace
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from vllm.config import KVTransferConfig
from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorLogging, KVConnectorProm
import pdlink.vllm.plugin
from pdlink.vllm.connector import PdlinkConnector, PdlinkKVConnectorStats

pdlink.vllm.plugin.register()
ktc = KVTransferConfig(kv_connector="PdlinkConnector", kv_role="kv_consumer",
                       kv_connector_extra_config={"read_mode": True})
reg = CollectorRegistry()

class Prom(KVConnectorProm):  # vLLM's, with a registry of the test's own
    _counter_cls = functools.partial(Counter, registry=reg)
    _gauge_cls = functools.partial(Gauge, registry=reg)
    _histogram_cls = functools.partial(Histogram, registry=reg)

prom = Prom(SimpleNamespace(kv_transfer_config=ktc), ["model_name", "engine"], {0: ["tiny", "0"]})

class Worker:  # two TP ranks' workers, as get_kv_connector_stats sees them
    def __init__(self, d): self.d = d
    def transfer_stats(self): d, self.d = self.d, {}; return d

stats = []
for d in ({"pulls": 2, "bytes": 4096, "seconds": 0.5}, {"pulls": 2, "bytes": 4096, "seconds": 0.25, "failures": 1}):
    c = object.__new__(PdlinkConnector)
    c._worker, c._sched = Worker(d), None
    stats.append(c.get_kv_connector_stats())
    assert c.get_kv_connector_stats() is None, "a worker with nothing new reports None"
agg = stats[0].aggregate(stats[1])           # vLLM's KVOutputAggregator over the ranks
assert isinstance(agg, PdlinkKVConnectorStats) and not agg.is_empty()
lines = []
log = KVConnectorLogging(ktc)
log.observe(agg.to_dict())                   # the API server: the periodic log line
log.log(lambda fmt, *a: lines.append(fmt % a))
assert lines and "pulls=4" in lines[0] and "bytes=8192" in lines[0], lines
prom.observe(agg.to_dict(), 0)
prom.observe(PdlinkConnector.build_kv_connector_stats({"holds": 1}).to_dict(), 0)
text = generate_latest(reg).decode()
want = ['vllm:pdlink_pulls_total{engine="0",model_name="tiny"} 4.0',
        'vllm:pdlink_bytes_total{engine="0",model_name="tiny"} 8192.0',
        'vllm:pdlink_seconds_total{engine="0",model_name="tiny"} 0.75',
        'vllm:pdlink_failures_total{engine="0",model_name="tiny"} 1.0',
        'vllm:pdlink_holds_total{engine="0",model_name="tiny"} 1.0',
        'vllm:pdlink_pushes_total{engine="0",model_name="tiny"} 0.0']
missing = [w for w in want if w not in text]
assert not missing, (missing, text)
print("ok")
'''


def test_stats_through_vllms_own_logging_and_prometheus() -> None:
    run_in_vllm(VLLM_SCRIPT)
