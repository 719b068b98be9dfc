"""The example of docs/python.md runs as written (its two base ports swapped for free ones) and prints
what the page says it prints: the heads each decode rank received and the counters."""
from __future__ import annotations

import os
import re
import subprocess
import sys

from test_pdlink_package import free_range

SRC = os.environ.get("PDLINK_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))


def test_docs_example_moves_numpy_kv_between_two_processes(tmp_path) -> None:
    page = open(os.path.join(SRC, "docs", "python.md")).read()
    code = re.search(r"## Example.*?```python\n(.*?)```", page, re.S).group(1)
    assert '"kv_producer", 21000' in code and '"kv_consumer", 22000' in code
    code = code.replace("21000", str(free_range(200))).replace("22000", str(free_range(200)))
    script = tmp_path / "example.py"
    script.write_text(code)
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "[1.0, 1.0, 2.0, 2.0, 3.0, 3.0, 4.0, 4.0]"
    # 2 blocks x 2 layers x K+V x 8 heads x 16 tokens x 64 dims x 2 bytes; each TP8 rank releases one producer
    assert lines[1] == f"{2 * 2 * 2 * 8 * 16 * 64 * 2} bytes pulled; releases sent: 8"
