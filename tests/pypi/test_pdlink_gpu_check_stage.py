"""tools/gpu-check-python.py (the GPU check's Python stage, docs/gpu.md) where there is no GPU: it
imports, and skips with exit 77 and "no GPU" -- without torch, and with a torch that sees no CUDA
device. The stage itself runs on a GPU only."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "tools" / "gpu-check-python.py"


def run(env_extra: dict) -> subprocess.CompletedProcess:
    env = dict(os.environ, **env_extra)
    return subprocess.run([sys.executable, str(SCRIPT), "--topologies", "1:1"], env=env, capture_output=True,
                          text=True, timeout=60)


def test_skips_without_torch(tmp_path: Path) -> None:
    # A torch that cannot be imported, whatever this venv has.
    (tmp_path / "torch.py").write_text("raise ImportError('no torch here')\n")
    r = run({"PYTHONPATH": f"{tmp_path}:{os.environ.get('PYTHONPATH', '')}"})
    assert r.returncode == 77, r.stdout + r.stderr
    assert "gpu-check python: SKIPPED: no GPU (torch not importable: no torch here)" in r.stdout


def test_skips_when_torch_sees_no_device(tmp_path: Path) -> None:
    (tmp_path / "torch.py").write_text("class cuda:\n    @staticmethod\n    def is_available():\n        return False\n")
    r = run({"PYTHONPATH": f"{tmp_path}:{os.environ.get('PYTHONPATH', '')}"})
    assert r.returncode == 77, r.stdout + r.stderr
    assert "SKIPPED: no GPU (torch sees no CUDA device)" in r.stdout


def test_script_compiles() -> None:
    compile(SCRIPT.read_text(), str(SCRIPT), "exec")
