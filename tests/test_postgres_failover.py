"""Failover (issue 41): three times under a steady load, the primary of a private
synchronous pair is killed with SIGKILL and its standby promoted; the store, two worker
processes and their wakes all use one multi-host URL with
``target_session_attrs=read-write`` and find the new primary without a restart. Every
acknowledged commit and submission is on the last primary, every run ends once, the
``replay="never"`` tool ran at most once per run (once per completed run), and the seconds
from each kill to the first commit on the new primary are printed (the ``failover``
benchmark runs the same scenario: ``python -m benchmarks.failover``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests import failover_scenario
from tests.pgcluster import require_binaries

pytestmark = [pytest.mark.postgres, pytest.mark.slow]


@pytest.mark.timeout(240)
@pytest.mark.asyncio
async def test_three_failovers_under_load_lose_no_acknowledged_commit(tmp_path: Path) -> None:
    require_binaries()
    report = await failover_scenario.run(tmp_path, rounds=3)
    print("failover:", json.dumps(report.summary()))
    assert len(report.kill_to_commit) == 3
    assert len(report.submitted) > 20 and len(report.ledger) == len(report.submitted)
    assert sum(report.endings.values()) == len(report.submitted)
    assert sum(s["done"] for s in report.worker_stats) >= report.endings.get("run.completed", 0)
    assert all(0 < s < 30 for s in report.kill_to_commit), report.kill_to_commit
