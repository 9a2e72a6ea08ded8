"""``python -m tests.chaos [--trials N] [--jobs N] [--report docs/reliability.md]``: run the
chaos matrix, print every trial and the figures per cell, optionally write the report, and
exit non-zero on any violation. See ``tests.chaos.matrix`` for the environment variables."""

from __future__ import annotations

import argparse
import logging
import os
import shlex
import sys
import time
from pathlib import Path

from tests.chaos.harness import postgres_answers
from tests.chaos.matrix import env_int, plan, print_result, run
from tests.chaos.report import markdown, summary


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.chaos", description=__doc__)
    parser.add_argument("--trials", type=int, default=None, help="trials per cell")
    parser.add_argument("--jobs", type=int, default=None, help="trials at once")
    parser.add_argument("--report", type=Path, default=None, help="write the markdown here")
    args = parser.parse_args(argv)
    # The stores log recoveries they perform (torn tails, interrupted compactions): expected.
    logging.basicConfig(level=logging.ERROR)
    chosen = plan(args.trials)
    jobs = args.jobs if args.jobs is not None else env_int("CHAOS_JOBS", 1)
    skipped: list[str] = []
    if not postgres_answers() and any(cell[1] == "postgres" for cell in chosen.seeds):
        skipped = [f"{k}/{s}" for k, s in chosen.seeds if s == "postgres"]
        print(
            "!!! PostgreSQL does not answer: the PostgreSQL cells are NOT run: "
            + ", ".join(skipped),
            flush=True,
        )
        if os.environ.get("WAKEFUL_REQUIRE_SERVICES") == "1":
            return 2
    print(f"chaos: {chosen.total} trials, {jobs} at a time, base {chosen.base}", flush=True)
    started = time.monotonic()
    results = run(chosen, jobs=jobs, report=print_result)
    duration = time.monotonic() - started
    print()
    print(summary(results))
    print(f"duration {duration:.0f} s")
    failed = [r for r in results if r.violations]
    for r in failed:
        print_result(r)
    if args.report is not None:
        env = " ".join(
            f"{k}={os.environ[k]}"
            for k in ("CHAOS_TRIALS", "CHAOS_JOBS", "CHAOS_SEED", "CHAOS_ONLY")
            if os.environ.get(k)
        )
        command = " ".join(filter(None, [env, ".venv/bin/python -m tests.chaos", shlex.join(argv)]))
        args.report.write_text(markdown(results, command, duration, skipped), encoding="utf-8")
        print(f"wrote {args.report}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
