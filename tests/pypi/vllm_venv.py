"""vllm_venv.py -- run a script in real vLLM's venv (scripts/install-vllm: PDLINK_VLLM_VENV, else
BUILD/vllm-venv) with this checkout's pdlink first on its path. Without that venv the calling test is
skipped, or fails when PDLINK_REQUIRE_VLLM=1 (what `make vllm-e2e-short` sets once it installed vLLM)."""
from __future__ import annotations

import os
import subprocess

import pytest

import pdlink


def run_in_vllm(script: str, timeout: int = 500) -> None:
    venv = os.environ.get("PDLINK_VLLM_VENV") or os.path.join(os.environ.get("PDLINK_BUILD_DIR", "build"),
                                                               "vllm-venv")
    py = os.path.join(venv, "bin", "python")
    if not os.access(py, os.X_OK):
        if os.environ.get("PDLINK_REQUIRE_VLLM") == "1":
            raise AssertionError(f"no vLLM venv at {venv} (scripts/install-vllm)")
        pytest.skip(f"no vLLM venv at {venv}: make vllm-e2e-short runs this case once it installed vLLM")
    env = dict(os.environ)
    site = os.path.dirname(os.path.dirname(pdlink.__file__))  # this checkout's pdlink over the venv's copy
    env["PYTHONPATH"] = os.pathsep.join([site] + [p for p in [env.get("PYTHONPATH")] if p])
    r = subprocess.run([py, "-c", script], env=env, capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stdout[-3000:] + r.stderr[-3000:]
