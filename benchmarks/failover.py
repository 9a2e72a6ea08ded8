"""Failover: seconds from a SIGKILL of the primary to the first commit acknowledged by the
promoted standby, under a steady load (issue 41).

``python -m benchmarks.failover [--rounds 3]`` runs the scenario of
``tests/failover_scenario.py`` once with ``--rounds`` failovers: a private primary and
synchronous standby (initdb, pg_basebackup, on free loopback ports, as the ``postgres``
OS user when run as root), two worker processes and this process's load on one multi-host
URL, the primary killed and the standby promoted (``pg_promote``) each round. Reported: the
median, each sample, and the promotion alone. The kill-to-commit figure includes psycopg's
reconnection (the pool's backoff after its connections broke) and the load's 50 ms retry
pause; it excludes any failure detection, which here is instant (the test promotes at once,
where a real cluster manager waits for its own timeout first). Needs PostgreSQL's server
binaries; ``--dsn`` is accepted and ignored (the servers are private).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
from pathlib import Path

from benchmarks.common import Result


def main(argv: list[str] | None = None) -> list[Result]:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.failover")
    parser.add_argument("--rounds", type=int, default=3, help="failovers in the run")
    parser.add_argument("--dsn", default=None, help="ignored: the servers are private")
    args = parser.parse_args(argv)
    from tests import failover_scenario  # the scenario lives beside its test

    with tempfile.TemporaryDirectory(prefix="wakeful-failover-") as directory:
        report = asyncio.run(failover_scenario.run(Path(directory), rounds=args.rounds))
    summary = report.summary()
    print(json.dumps(summary, indent=2))
    samples = tuple(report.kill_to_commit)
    return [
        Result(
            "failover",
            "kill to first acknowledged commit",
            statistics.median(samples),
            "s",
            higher_is_better=False,
            samples=samples,
            note=f"{summary['runs_acknowledged']} runs, every one ended once",
        ),
        Result(
            "failover",
            "kill to promoted",
            statistics.median(report.kill_to_promoted),
            "s",
            higher_is_better=False,
            samples=tuple(report.kill_to_promoted),
        ),
    ]


if __name__ == "__main__":
    main()
