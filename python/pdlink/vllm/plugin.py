"""pdlink.vllm.plugin -- registers PdlinkConnector with vLLM's KV connector factory, so that

    --kv-transfer-config '{"kv_connector": "PdlinkConnector", "kv_role": ..., ...}'

works after ``pip install`` without ``kv_connector_module_path``. vLLM calls :func:`register` from its
``vllm.general_plugins`` entry-point group (python/pyproject.toml names it) in every process it starts:
the API server, the engine core (the scheduler) and each worker. The factory imports the connector
module lazily, by name, when a config asks for it, so registering costs one dict entry and nothing
here imports vLLM at pdlink import time (only :func:`register` does, when vLLM calls it).
"""
from __future__ import annotations

from typing import Any, Optional

CONNECTOR_NAME = "PdlinkConnector"
CONNECTOR_MODULE = "pdlink.vllm.connector"
CONNECTOR_CLASS = "PdlinkConnector"


def register(factory: Optional[Any] = None) -> bool:
    """Register PdlinkConnector with ``factory`` (default: vLLM's ``KVConnectorFactory``). Returns True
    when this call registered it, False when the name was registered already: vLLM may load its plugins
    more than once per process, and ``register_connector`` raises ValueError on a name it has. A factory
    that already maps the name to another class keeps it (a user's own registration wins)."""
    if factory is None:
        from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory as factory
    registry = getattr(factory, "_registry", None)
    if registry is not None and CONNECTOR_NAME in registry:
        return False
    factory.register_connector(CONNECTOR_NAME, CONNECTOR_MODULE, CONNECTOR_CLASS)
    return True
