"""``make demo`` runs the crash-and-recover story and every guarantee holds."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.slow
def test_the_crash_and_recover_demo_passes() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "wakeful.demo"], capture_output=True, text=True, timeout=180
    )
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert "killed worker-a with SIGKILL" in out
    assert "resumed, R1" in out
    assert out.count("    ok   ") == 7 and "FAIL" not in out
