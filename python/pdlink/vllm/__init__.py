"""pdlink.vllm -- pdlink as a vLLM KV connector (v1 interface), selected with

    --kv-transfer-config '{"kv_connector": "PdlinkConnector", "kv_connector_module_path": "pdlink.vllm",
                           "kv_role": "kv_producer", "kv_connector_extra_config": {...MoRIIO's keys...}}'

The package is split so that the logic can be tested without vLLM installed. Each half picks its role
once, from the config's role (producer: the prefill; consumer: the decode) and mode (READ: the decode
pulls; WRITE: the prefill pushes), and forwards every vLLM hook to one small class per role and mode:

* :mod:`pdlink.vllm.scheduler` -- the scheduler-process half (pure Python: which requests to hold, pull,
  push, expect or release in each step, and the kv_transfer_params a prefill returns):
  :mod:`~pdlink.vllm.scheduler_producer` (``ReadProducer``, ``WriteProducer``),
  :mod:`~pdlink.vllm.scheduler_consumer` (``ReadConsumer``, ``WriteConsumer``), what they share in
  :mod:`~pdlink.vllm.scheduler_role`;
* :mod:`pdlink.vllm.plan` -- the step plan the scheduler half hands the workers (vLLM's connector
  metadata);
* :mod:`pdlink.vllm.worker` -- the worker-process half (one :class:`pdlink.Instance` per TP rank over
  vLLM's own KV tensors): :mod:`~pdlink.vllm.worker_producer` (holds, pushes),
  :mod:`~pdlink.vllm.worker_consumer` (pulls, receives), what they share in
  :mod:`~pdlink.vllm.worker_role`; the KV tensors as pdlink regions in :mod:`~pdlink.vllm.kvcache`,
  pdlink's threads' CPUs in :mod:`~pdlink.vllm.affinity`;
* :mod:`pdlink.vllm.params` -- the endpoint and params computed from the config;
  :mod:`pdlink.vllm.log` -- the logger (vLLM's, as ``vllm.pdlink``);
* :mod:`pdlink.vllm.stats` -- the transfer figures vLLM's connector stats API carries to its /metrics
  (``vllm:pdlink_*``);
* :mod:`pdlink.vllm.connector` -- the ``KVConnectorBase_V1`` subclass vLLM loads, which only adapts
  vLLM's objects to the two halves. Importing it needs vLLM; importing this package does not.
"""
from __future__ import annotations

from typing import Any

__all__ = ["PdlinkConnector"]


def __getattr__(name: str) -> Any:
    # vLLM resolves the class with getattr(module, "PdlinkConnector"); importing the vLLM-facing module
    # only then keeps `import pdlink.vllm.scheduler` free of the vLLM dependency.
    if name in ("PdlinkConnector", "PdlinkConnectorMetadata"):
        from pdlink.vllm import connector
        return getattr(connector, name)
    raise AttributeError(f"module 'pdlink.vllm' has no attribute {name!r}")
