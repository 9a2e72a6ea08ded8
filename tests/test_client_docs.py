"""docs/client.md's streaming example runs as written against ``wakeful serve`` and
``wakeful worker`` processes and prints the whole reply."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parent.parent
WAKEFUL = str(Path(sys.executable).parent / "wakeful")


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.slow
def test_the_client_streaming_example_prints_the_reply(tmp_path: Path) -> None:
    doc = (ROOT / "docs" / "client.md").read_text(encoding="utf-8")
    [example] = [b for b in re.findall(r"```python\n(.*?)```", doc, re.S) if "asyncio.run(" in b]
    script = tmp_path / "example.py"
    script.write_text(example, encoding="utf-8")
    port = _port()
    store = f"sqlite:///{tmp_path / 'demo.db'}"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join((str(ROOT / "src"), str(ROOT))),
        "WAKEFUL_API": f"http://127.0.0.1:{port}",
    }
    env.pop("WAKEFUL_TOKENS", None)
    procs = [
        subprocess.Popen(
            [WAKEFUL, *args],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for args in (
            ["serve", "--store", store, "--port", str(port)],
            ["worker", "--store", store, "--app", "tests.cli_app:registry", "--poll", "0.1"],
        )
    ]
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "the server never got ready"
            time.sleep(0.05)
        for _ in range(2):  # the second run streams a reply too, not nothing
            done = subprocess.run(
                [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=60
            )
            assert done.returncode == 0, done.stderr
            assert done.stdout.strip() == "Hello from the command line.", done.stdout
        broken = tmp_path / "broken.py"  # the same example on a run that fails
        failing = example.replace('"greeter", "Say hello"', '"broken", {}')
        assert failing != example
        broken.write_text(failing, encoding="utf-8")
        failed = subprocess.run(
            [sys.executable, str(broken)], env=env, capture_output=True, text=True, timeout=30
        )
        assert failed.returncode == 1, failed.stdout + failed.stderr
        assert "ended run.failed: see wakeful threads events greeting-" in failed.stderr
    finally:
        for proc in procs:
            proc.kill()
            proc.wait(10)
