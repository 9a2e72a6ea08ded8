"""The garbage-collector settings of a worker process (``wakeful worker --gc``): parsed as
documented, applied only when asked, and refused clearly when malformed."""

from __future__ import annotations

import gc
import subprocess
from collections.abc import Iterator

import pytest

from tests.cli_support import ROOT, WAKEFUL, cli_env
from wakeful.fleet import gctune


@pytest.fixture
def restored() -> Iterator[None]:
    before = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*before)


def test_the_settings_parse_as_documented() -> None:
    assert gctune.parse("worker") == gctune.WORKER_THRESHOLD == (10_000, 10, 10)
    assert gctune.parse("python") is None
    assert gctune.parse("5000,20,30") == (5000, 20, 30)
    for bad in ("", "1,2", "1,2,x", "-1,2,3", "fast"):
        with pytest.raises(ValueError, match="three thresholds"):
            gctune.parse(bad)


def test_tune_sets_the_thresholds_and_freezes_start_up(restored: None) -> None:
    kept = [object() for _ in range(10)]  # noqa: F841 (alive through the freeze)
    gctune.tune((12_345, 11, 12))
    assert gc.get_threshold() == (12_345, 11, 12)
    assert gc.get_freeze_count() > 0


def test_python_leaves_the_collector_alone(restored: None) -> None:
    gc.set_threshold(700, 10, 10)
    gctune.tune(None)
    assert gc.get_threshold() == (700, 10, 10) and gc.get_freeze_count() == 0


def test_the_command_refuses_a_malformed_setting(tmp_path: object) -> None:
    url = f"sqlite:///{tmp_path}/w.db"
    done = subprocess.run(
        [WAKEFUL, "worker", "--app", "tests.cli_app:registry", "--gc", "1,2"],
        cwd=ROOT,
        env=cli_env(url),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and "--gc" in done.stderr, done.stderr
