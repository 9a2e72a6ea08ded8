"""The README's quick start and its runnable examples work as written."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"


def blocks(path: Path, language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", path.read_text(encoding="utf-8"), flags=re.S)


def test_runnable_python_examples_run(tmp_path: Path) -> None:
    runnable = [b for b in blocks(README, "python") if "asyncio.run(" in b]
    assert runnable, "the README has no runnable example"
    for i, block in enumerate(runnable):
        script = tmp_path / f"example_{i}.py"
        script.write_text(block, encoding="utf-8")
        done = subprocess.run(
            [sys.executable, str(script)], capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0, done.stderr
        if "# 1 (1,)" in block:
            assert done.stdout.strip() == "1 (1,)"


def test_every_quick_start_command_is_a_make_target() -> None:
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    targets = set(re.findall(r"^([a-z]+):", makefile, flags=re.M))
    commands = [line.split("#")[0].split() for b in blocks(README, "sh") for line in b.splitlines()]
    makes = [c[1] for c in commands if len(c) == 2 and c[0] == "make"]
    assert {"demo", "test"} <= set(makes)
    assert set(makes) <= targets, set(makes) - targets


@pytest.mark.slow
def test_make_demo_runs_as_the_readme_says() -> None:
    done = subprocess.run(["make", "demo"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "FAIL" not in done.stdout and "the tool ran exactly once" in done.stdout


def test_the_http_api_reference_lists_every_route_of_the_openapi_document() -> None:
    from wakeful.server import create_app
    from wakeful.store.memory import MemoryStore

    spec = create_app(MemoryStore()).openapi()
    doc = (ROOT / "docs" / "http-api.md").read_text(encoding="utf-8")
    missing = [
        f"{method.upper()} {path}"
        for path, operations in spec["paths"].items()
        for method in operations
        if f"`{method.upper()} {path}`" not in doc
    ]
    assert not missing, f"docs/http-api.md does not list {missing}"
