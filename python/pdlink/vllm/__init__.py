"""pdlink.vllm -- pdlink as a vLLM KV connector (v1 interface), selected with

    --kv-transfer-config '{"kv_connector": "PdlinkConnector", "kv_connector_module_path": "pdlink.vllm",
                           "kv_role": "kv_producer", "kv_connector_extra_config": {...MoRIIO's keys...}}'

The package is split so that the logic can be tested without vLLM installed:

* :mod:`pdlink.vllm.scheduler` -- the scheduler-process half (pure Python: which requests to hold, pull
  or release in each step, and the kv_transfer_params a prefill returns);
* :mod:`pdlink.vllm.worker` -- the worker-process half (one :class:`pdlink.Instance` per TP rank over
  vLLM's own KV tensors; holds, pulls, completion and failure reporting);
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
