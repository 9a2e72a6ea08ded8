"""docs/langgraph.md's runnable examples work as written and print what they say."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.test_docs import blocks

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "langgraph.md"


def test_the_examples_run_verbatim_and_print_what_their_comments_say(tmp_path: Path) -> None:
    runnable = [b for b in blocks(PAGE, "python") if "asyncio.run(" in b]
    assert len(runnable) == 3, "the one-line switch, the fencing API, resuming after a crash"
    # the crash block asserts its own result (charge and ship once each) and takes seconds
    # (a lease must expire): tests/test_docs.py runs it once
    assert 'assert final == {"log": ["charged", "shipped"]}' in runnable[2]
    printed = []
    for i, block in enumerate(runnable[:2]):
        script = tmp_path / f"example_{i}.py"
        script.write_text(block, encoding="utf-8")
        done = subprocess.run(
            [sys.executable, str(script)], capture_output=True, text=True, timeout=60, cwd=tmp_path
        )
        assert done.returncode == 0, done.stderr
        printed.append(done.stdout.strip())
    assert printed == ["{'log': ['answer:yes']}", "refused: worker-1"]
