"""check-install.py -- what an installed pdlink wheel must do before a vLLM image ships it: run by the
Containerfile after `pip install` and by build.sh in a throwaway venv (never from the source tree).

  1. `pdlink` and `pdlink.vllm` import (pdlink.vllm imports nothing from vLLM until vLLM calls it);
  2. libpdlink's strict config parser (an unknown key is an error) accepts a producer and a consumer
     kv-transfer-config of the shape deploy/kubernetes/configmap.yaml uses (auth_key_file is read when an instance starts, not here);
  3. the `vllm.general_plugins` entry point that registers PdlinkConnector is installed.
Exits non-zero with the failing step named."""
import importlib.metadata
import os
import sys

import pdlink
import pdlink.vllm  # noqa: F401  (the import is the check)

here = os.path.dirname(os.path.abspath(pdlink.__file__))
if os.path.exists(os.path.join(here, "..", "setup.py")):
    sys.exit(f"check-install: pdlink was imported from a source tree ({here}), not from the install")

for role, hs, nt in (("kv_producer", 6301, 61005), ("kv_consumer", 7301, 7501)):
    got = pdlink.connector_config({
        "kv_connector": "PdlinkConnector", "kv_connector_module_path": "pdlink.vllm", "kv_role": role,
        "kv_connector_extra_config": {
            "host_ip": "10.0.0.11", "proxy_ip": "10.0.0.5", "proxy_ping_port": 36367, "http_port": 8100,
            "handshake_port": hs, "notify_port": nt, "read_mode": True, "backend": "rdma",
            "trusted_hosts": ["10.0.0.0/24"], "auth_key_file": "/etc/pdlink/cluster.key"}}, strict=True)
    want_role = "producer" if role == "kv_producer" else "consumer"
    if got["role"] != want_role or got["handshake_port"] != hs or got["notify_port"] != nt:
        sys.exit(f"check-install: connector_config({role}) gave {got}")

plugins = [e for e in importlib.metadata.entry_points(group="vllm.general_plugins") if e.name == "pdlink"]
if not plugins:
    sys.exit("check-install: no vllm.general_plugins entry point 'pdlink' (PdlinkConnector would not register)")
print(f"check-install: pdlink {importlib.metadata.version('pdlink')} from {here}: config parser, plugin "
      f"{plugins[0].value}: ok")
