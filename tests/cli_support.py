"""Running the ``wakeful`` entry point in a subprocess, for the CLI tests."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WAKEFUL = str(Path(sys.executable).parent / "wakeful")


def cli_env(store: str | None = None, **extra: str) -> dict[str, str]:
    # the checkout's own sources first (a worktree beside an editable install elsewhere)
    path = os.pathsep.join((str(ROOT / "src"), str(ROOT)))
    env = {**os.environ, "COLUMNS": "200", "PYTHONPATH": path, **extra}
    env.pop("WAKEFUL_LOG_LEVEL", None)
    env.pop("WAKEFUL_LOG_FORMAT", None)
    if store is not None:
        env["WAKEFUL_STORE"] = store
    return env


def cli(
    *args: str, store: str | None = None, stdin: str | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [WAKEFUL, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=cli_env(store),
        cwd=ROOT,
        input=stdin,
    )


def error_line(done: subprocess.CompletedProcess[str]) -> str:
    """The one ``error:`` line a failed command printed (and nothing else on stderr)."""
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr
    assert "Traceback" not in done.stderr
    return lines[0]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
