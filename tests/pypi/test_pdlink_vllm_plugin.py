"""pdlink's vLLM plugin without vLLM: the installed package's entry point in vLLM's plugin group names
pdlink.vllm.plugin:register, and register() registers PdlinkConnector with a factory that behaves like
vLLM's KVConnectorFactory (a stub here) exactly once. scripts/vllm-e2e checks the same with real vLLM:
its vLLMs are started without kv_connector_module_path."""
from __future__ import annotations

import importlib
import importlib.util
import importlib.metadata as md
import subprocess
import sys
from typing import Dict, Tuple

import pytest

import pdlink.vllm.plugin as plugin


class StubFactory:
    """What register() may use of vLLM's KVConnectorFactory: _registry, and register_connector raising
    ValueError on a name it has (vLLM's does: "Connector '...' is already registered.")."""

    def __init__(self) -> None:
        self._registry: Dict[str, Tuple[str, str]] = {}
        self.calls = 0

    def register_connector(self, name: str, module_path: str, class_name: str) -> None:
        self.calls += 1
        if name in self._registry:
            raise ValueError(f"Connector '{name}' is already registered.")
        self._registry[name] = (module_path, class_name)


def test_entry_point_in_vllm_plugin_group() -> None:
    dist = md.distribution("pdlink")
    eps = [ep for ep in dist.entry_points if ep.group == "vllm.general_plugins"]
    assert [(ep.name, ep.value) for ep in eps] == [("pdlink", "pdlink.vllm.plugin:register")]
    # What vLLM does with it: load() and call with no argument (here: the function it resolves to).
    assert eps[0].load() is plugin.register


def test_register_once_with_the_connector_module() -> None:
    f = StubFactory()
    assert plugin.register(f) is True
    assert f._registry == {"PdlinkConnector": ("pdlink.vllm.connector", "PdlinkConnector")}
    # The module and class named exist (importing the module itself needs vLLM, so only the file).
    spec = importlib.util.find_spec(f._registry["PdlinkConnector"][0])
    assert spec is not None and spec.origin is not None
    with open(spec.origin) as fh:
        assert "\nclass PdlinkConnector(KVConnectorBase_V1):" in fh.read()
    # A second load in the same process (vLLM may load plugins again): no ValueError, no change.
    assert plugin.register(f) is False
    assert f.calls == 1


def test_register_keeps_a_users_own_registration() -> None:
    f = StubFactory()
    f._registry["PdlinkConnector"] = ("my.module", "MyConnector")
    assert plugin.register(f) is False
    assert f._registry["PdlinkConnector"] == ("my.module", "MyConnector")


def test_importing_pdlink_and_the_plugin_does_not_import_vllm() -> None:
    code = ("import sys, pdlink, pdlink.vllm, pdlink.vllm.plugin, pdlink.vllm.scheduler; "
            "print(sorted(m for m in sys.modules if m == 'vllm' or m.startswith('vllm.')))")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    assert out.strip() == "[]"


def test_register_without_vllm_names_what_is_missing() -> None:
    try:
        importlib.import_module("vllm")
    except ImportError:
        with pytest.raises(ImportError, match="vllm"):
            plugin.register()
    else:
        pytest.skip("vLLM is installed here: scripts/vllm-e2e covers the real factory")
