"""The matrix: which fault kinds run against which stores, how many trials each, their seeds,
and running them (in parallel when asked; PostgreSQL restarts, each on a server of its own, alone).

Seeds: a trial's seed is ``cell << 24 | n``, so the seed alone names the cell (fault kind and
store) and the trial. ``CHAOS_SEED=S CHAOS_TRIALS=1`` replays exactly trial ``S``.

Environment:
  ``CHAOS_TRIALS``  trials per cell (default 1); torn and corrupt logs, which are cheap, run
                    ``CHEAP_FACTOR`` times as many, PostgreSQL restarts at most
                    ``CHAOS_PG_RESTARTS`` (default 3);
  ``CHAOS_SEED``    replay: only the seed's cell, ``CHAOS_TRIALS`` trials from that seed;
  ``CHAOS_ONLY``    comma-separated ``kind`` or ``kind/store`` filters;
  ``CHAOS_JOBS``    trials run at once (default 1);
  ``CHAOS_EXHAUSTION`` ``0`` turns off the one-attempt budgets of some worker dispatches.
"""

from __future__ import annotations

import os
import random
import tempfile
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from tests.chaos.harness import Stores, postgres_answers
from tests.chaos.trials import TrialResult, run_trial

CELLS: tuple[tuple[str, str], ...] = (
    ("worker_kill", "file"),
    ("worker_kill", "sqlite"),
    ("worker_kill", "postgres"),
    ("worker_stop", "sqlite"),
    ("worker_stop", "postgres"),
    ("relay_kill", "file"),
    ("relay_kill", "sqlite"),
    ("relay_kill", "postgres"),
    ("writer_kill", "file"),
    ("writer_kill", "sqlite"),
    ("writer_kill", "postgres"),
    ("pg_restart", "postgres"),
    ("torn_log", "file"),
    ("corrupt_log", "file"),
    ("hand_kill", "sqlite"),
    ("relay_replace", "sqlite"),
    ("relay_replace", "postgres"),
    ("nats_freeze", "sqlite"),
)
"""Append only: a cell's index is part of its seeds."""

SHIFT = 24
MASK = (1 << SHIFT) - 1
CHEAP = ("torn_log", "corrupt_log")
CHEAP_FACTOR = 4


def cell_name(cell: tuple[str, str]) -> str:
    return f"{cell[0]}/{cell[1]}"


def cell_of(seed: int) -> tuple[str, str]:
    return CELLS[seed >> SHIFT]


def replay_command(seed: int) -> str:
    extra = "CHAOS_EXHAUSTION=0 " if os.environ.get("CHAOS_EXHAUSTION") == "0" else ""
    return f"{extra}CHAOS_SEED={seed} CHAOS_TRIALS=1 .venv/bin/python -m tests.chaos"


@dataclass(frozen=True)
class Plan:
    """Which seeds run, per cell."""

    seeds: dict[tuple[str, str], list[int]]
    base: int

    @property
    def total(self) -> int:
        return sum(len(s) for s in self.seeds.values())


def env_int(name: str, default: int) -> int:
    value = os.environ.get(name, "").strip()
    return int(value) if value else default


def selected(cell: tuple[str, str], only: str) -> bool:
    if not only.strip():
        return True
    wanted = {w.strip() for w in only.split(",") if w.strip()}
    return cell[0] in wanted or cell_name(cell) in wanted


def plan(trials: int | None = None, cells: Iterable[tuple[str, str]] = CELLS) -> Plan:
    trials = env_int("CHAOS_TRIALS", 1) if trials is None else trials
    replay = os.environ.get("CHAOS_SEED", "").strip()
    if replay:
        seed = int(replay)
        cell = cell_of(seed)
        chosen = {c: [seed + i for i in range(trials)] for c in cells if c == cell}
        return Plan(chosen, seed & MASK)
    base = random.SystemRandom().randrange(1 << (SHIFT - 1))
    only = os.environ.get("CHAOS_ONLY", "")
    restarts = env_int("CHAOS_PG_RESTARTS", 3)
    seeds: dict[tuple[str, str], list[int]] = {}
    for cell in cells:
        if not selected(cell, only):
            continue
        count = trials * CHEAP_FACTOR if cell[0] in CHEAP else trials
        if cell[0] == "pg_restart":
            count = min(trials, restarts)
        index = CELLS.index(cell)
        seeds[cell] = [(index << SHIFT) | ((base + i) & MASK) for i in range(count)]
    return Plan(seeds, base)


def run(
    chosen: Plan,
    base_dir: Path | None = None,
    jobs: int | None = None,
    report: Callable[[TrialResult], None] | None = None,
) -> list[TrialResult]:
    """Run every trial of ``chosen``; PostgreSQL cells are skipped (loudly, by the caller)
    when the server does not answer."""
    jobs = max(1, env_int("CHAOS_JOBS", 1) if jobs is None else jobs)
    pg = postgres_answers()
    work = [
        (cell, seed)
        for cell, seeds in chosen.seeds.items()
        for seed in seeds
        if pg or cell[1] != "postgres"
    ]
    random.Random(chosen.base).shuffle(work)  # interleave the cells; fixed by the seeds
    alone = [w for w in work if w[0][0] == "pg_restart"]
    shared = [w for w in work if w[0][0] != "pg_restart"]
    stores = Stores()
    lock = threading.Lock()
    results: list[TrialResult] = []
    owned = base_dir is None
    base = Path(tempfile.mkdtemp(prefix="wakeful-chaos-")) if base_dir is None else base_dir

    def one(item: tuple[tuple[str, str], int]) -> None:
        (kind, store), seed = item
        result = run_trial(kind, store, seed, stores, base)
        with lock:
            results.append(result)
            if report is not None:
                report(result)

    try:
        if jobs == 1:
            for item in shared:
                one(item)
        else:
            with ThreadPoolExecutor(jobs) as pool:
                list(pool.map(one, shared))
        for item in alone:
            one(item)
    finally:
        stores.close()
        if owned and all(not r.violations for r in results):
            import shutil

            shutil.rmtree(base, ignore_errors=True)
    return results


def print_result(result: TrialResult) -> None:
    status = "ok  " if not result.violations else "FAIL"
    fault = result.notes.get("fault") or ", ".join(result.notes.get("faults", []))
    hit = result.notes.get("hit")
    aimed = "" if hit is None else "hit" if hit else "not hit"
    print(
        f"[{status}] {result.kind}/{result.store} seed={result.seed} "
        f"{result.duration:5.1f}s {fault} {aimed}".rstrip(),
        flush=True,
    )
    for v in result.violations:
        print(f"       {v.invariant}: {v.detail}")
    if result.violations:
        print(f"       replay: {replay_command(result.seed)}")
        print(f"       files: {result.directory}", flush=True)
