"""The examples in the docs run as written."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def python_blocks(path: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", path.read_text(encoding="utf-8"), flags=re.S)


@pytest.mark.parametrize("doc", ["README.md"])
def test_python_examples_run(doc: str, tmp_path: Path) -> None:
    blocks = python_blocks(ROOT / doc)
    assert blocks, f"{doc} has no python example"
    for i, block in enumerate(blocks):
        script = tmp_path / f"example_{i}.py"
        script.write_text(block, encoding="utf-8")
        done = subprocess.run(
            [sys.executable, str(script)], capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0, done.stderr
        if "# 1 (1,)" in block:
            assert done.stdout.strip() == "1 (1,)"
