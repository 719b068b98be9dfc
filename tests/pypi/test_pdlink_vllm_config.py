"""The whole kv_connector_extra_config is checked with libpdlink's strict parser when vLLM creates
PdlinkConnector, in either process: an unknown key is an error naming the nearest known key (a warning
before, and its value silently the default), a bad value names key, range and value. vLLM's earliest call
that hands the connector the extra config (requires_piecewise_for_cudagraph, from VllmConfig when CUDA
graphs are on) checks it too; that one runs in vLLM's venv (skipped without one)."""
from __future__ import annotations

from typing import Any, Dict

import pytest

import pdlink
from pdlink.vllm.scheduler import PdlinkScheduler
from pdlink.vllm.worker import PdlinkWorker
from vllm_venv import run_in_vllm


def config(role: str, **extra: Any) -> Dict[str, Any]:
    return {"kv_connector": "PdlinkConnector", "kv_role": role,
            "kv_connector_extra_config": {"host_ip": "127.0.0.1", "read_mode": True, "backend": "tcp", **extra}}


def test_scheduler_refuses_an_unknown_key_with_did_you_mean() -> None:
    with pytest.raises(pdlink.InvalidError, match=r'unknown key "notify_prot" \(did you mean "notify_port"\?\)'):
        PdlinkScheduler(config("kv_consumer", notify_prot=61005), tp_size=1, block_size=16)


def test_worker_refuses_an_unknown_key_too() -> None:
    # vLLM creates the workers' connectors before the scheduler's.
    with pytest.raises(pdlink.InvalidError, match=r'"handshake_prot".*"handshake_port"'):
        PdlinkWorker(config("kv_producer", handshake_prot=6301), tp_size=1, tp_rank=0, total_kv_heads=2)


def test_far_unknown_key_and_bad_value() -> None:
    with pytest.raises(pdlink.InvalidError, match=r'unknown key "completely_made_up" \(pdlink-node --help-config'):
        PdlinkScheduler(config("kv_producer", completely_made_up=1), tp_size=1, block_size=16)
    with pytest.raises(pdlink.InvalidError, match=r"notify_port: expected an integer 0-65535.*got 70000"):
        PdlinkScheduler(config("kv_producer", notify_port=70000), tp_size=1, block_size=16)


def test_accepted_upstream_keys_and_the_lenient_parser() -> None:
    # Upstream keys pdlink accepts and ignores stay accepted by the strict parser.
    s = PdlinkScheduler(config("kv_producer", recv_abort_timeout=5, handshake_port=23600), tp_size=1, block_size=16)
    assert s.ep.handshake_port == 23600
    # connector_config without strict (pdlink.Instance, pdlink-node) still only warns.
    assert pdlink.connector_config(config("kv_consumer", notify_prot=1))["notify_port"] == 61005
    with pytest.raises(pdlink.InvalidError, match="notify_prot"):
        pdlink.connector_config(config("kv_consumer", notify_prot=1), strict=True)


VLLM_SCRIPT = r'''
import pdlink
from pdlink.vllm.connector import PdlinkConnector
assert PdlinkConnector.requires_piecewise_for_cudagraph({"read_mode": True}) is False
try:
    PdlinkConnector.requires_piecewise_for_cudagraph({"read_mod": True})
except pdlink.InvalidError as e:
    assert 'did you mean "read_mode"' in str(e), e
else:
    raise AssertionError("an unknown key passed")
print("ok")
'''


def test_vllms_config_time_hook_checks_the_extra_config() -> None:
    run_in_vllm(VLLM_SCRIPT)
