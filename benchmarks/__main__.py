"""``make bench``: run the benchmarks, judge them against their targets, write the report.

``python -m benchmarks`` runs every module, each in its own subprocess (a crash or a hang
ends that module only), within a total time budget; each module repeats its measurements
(``--rounds``, default 3) and reports medians. Then it writes ``benchmarks/results.json``,
prints one table of ratios with PASS/MISS against each target, and renders
``docs/benchmarks.md`` with ``docs/benchmarks.png``.

``python -m benchmarks dispatch scale`` runs only those modules and prints their tables;
the results file and the docs are rewritten only with ``--write``. A module runs on its own,
with its options, as ``python -m benchmarks.dispatch --help``.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.common import DEFAULT_DSN, Result

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results.json"


@dataclass(frozen=True)
class Module:
    name: str
    timeout: float
    """Seconds before the module is killed (it reports as timed out)."""
    args: tuple[str, ...] = ()
    postgres: bool = False
    """Takes ``--dsn``."""


PLAN = (
    # Sizes are cut from the modules' own defaults where needed to keep the whole run under
    # ten minutes on a loaded 2-CPU machine; every measurement still runs --rounds times.
    Module("memory_store", 60),
    Module("file_store", 120),
    Module("sqlite_store", 150, ("--n", "1000")),
    Module("postgres_store", 200, ("--n", "1000"), postgres=True),
    Module("runtime_graph", 180, ("--runs", "150")),  # sequential and 8 threads
    Module("telemetry_cost", 150, ("--runs", "480")),  # 20 blocks of 24 runs per mode
    Module("streaming", 90),
    Module("dispatch", 300, ("--n", "1000", "--n-single", "300"), postgres=True),
    Module("agents", 240, ("--n", "400"), postgres=True),
    Module("scale", 150, postgres=True),
    # 1,000 / 100,000 / 1,000,000 threads (issue 27's acceptance): about 7 minutes, most of
    # it building the million (SQLite 46 s, PostgreSQL 140-190 s with 10M events).
    Module("scale_paths", 900, postgres=True),
    Module("live_stream", 180, postgres=True),
    # issue 36: interrupt/rollback to the new run running, SQLite and PostgreSQL, wakes on
    Module("busy_threads", 150, ("--n", "40"), postgres=True),
    Module("langgraph_saver", 240, ("--runs", "120"), postgres=True),
    # Issue 42: the framework wrappers beside the frameworks' DBOS integrations (skipped
    # without dbos), 3-step runs on SQLite and PostgreSQL.
    Module("frameworks", 300, ("--runs", "60"), postgres=True),
    Module("console", 240),
    # Issue 38: 2,000 due now fired batched then one by one; 10,000 due at once (two
    # firer processes, two ticks 30 s apart) and 10,000 spread over a minute (PostgreSQL);
    # 2,000 due at once on SQLite. Mostly waiting for the ticks.
    Module("schedules", 480, postgres=True),
    # Issue 39: two workers against one 120 rpm key for 60 s (mostly waiting), once per
    # round; then 12 interleaved pairs of 100 agent runs with and without a roomy limit.
    Module("flow_control", 420, postgres=True),
    # Issue 24's experiment: its targets at N = 1000 with its 18.1 s streams; N = 100 and
    # 5,000 (every run ended exactly once) with 6 s streams. One round: waiting, mostly.
    # Issue 41: three failovers of a private synchronous pair under load (about a minute),
    # and the capacity steps on a private server (per-operation costs, then saturation).
    Module("failover", 150, postgres=True),
    Module("capacity", 240, ("--steps", "25,50,100,200,400", "--seconds", "4"), postgres=True),
    Module(
        "concurrency",
        480,
        ("--n", "100,1000:18.1,5000", "--seconds", "6", "--single-round"),
        postgres=True,
    ),
)
ALL = [m.name for m in PLAN]
SKIPPED_EXIT = 3
"""A child's exit status when its module cannot be imported (an optional extra is missing)."""


# ---------------------------------------------------------------- one module (the child)


def child(name: str, out: Path, argv: list[str]) -> int:
    try:
        module = importlib.import_module(f"benchmarks.{name}")
    except ModuleNotFoundError as exc:
        out.write_text(json.dumps({"skipped": f"{exc.name} is not installed"}))
        print(f"{name}: not available ({exc})", file=sys.stderr)
        return SKIPPED_EXIT
    results: list[Result] = module.main(argv)
    out.write_text(json.dumps({"results": [r.to_json() for r in results]}))
    return 0


# ---------------------------------------------------------------- the orchestrator


@dataclass
class Outcome:
    name: str
    status: str
    """ok, failed, timeout, skipped or not run."""
    seconds: float
    detail: str = ""
    results: tuple[Result, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "seconds": round(self.seconds, 1),
            "detail": self.detail,
        }


def run_module(module: Module, rounds: int, dsn: str, timeout: float) -> Outcome:
    args = [*module.args, "--rounds", str(rounds)]
    if module.postgres:
        args += ["--dsn", dsn]
    print(f"\n== {module.name} {' '.join(args)}", flush=True)
    with tempfile.TemporaryDirectory(prefix="wakeful-bench-run-") as tmp:
        out = Path(tmp) / "results.json"
        command = [sys.executable, "-m", "benchmarks", "--child", module.name, str(out), *args]
        start = time.monotonic()
        # A session of its own: on timeout the module and every process it started go.
        proc = subprocess.Popen(command, cwd=ROOT, start_new_session=True)
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            return Outcome(module.name, "timeout", time.monotonic() - start, f"{timeout:.0f} s")
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        seconds = time.monotonic() - start
        data = json.loads(out.read_text()) if out.exists() else {}
    if code == SKIPPED_EXIT:
        return Outcome(module.name, "skipped", seconds, str(data.get("skipped", "")))
    if code != 0:
        return Outcome(module.name, "failed", seconds, f"exit status {code}")
    results = tuple(Result.from_json(r) for r in data["results"])
    return Outcome(module.name, "ok", seconds, results=results)


def summary_rows(results: list[Result]) -> list[list[str]]:
    from benchmarks.common import format_ratio, format_target, format_value

    rows = []
    for r in results:
        if r.anchor is None and not r.skipped:
            continue
        anchor = r.anchor or ""
        if r.anchor_value is not None:
            anchor += f" ({format_value(r.anchor_value, r.unit)})"
        rows.append(
            [
                r.benchmark,
                r.name,
                format_value(r.value, r.unit),
                anchor,
                format_ratio(r),
                format_target(r),
                r.verdict or "-",
            ]
        )
    return rows


def print_table(headers: list[str], rows: list[list[str]]) -> None:
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(headers)]
    print("  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)))
    print("  ".join("-" * w for w in widths))
    for row in rows:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)))


def orchestrate(args: argparse.Namespace) -> int:
    from benchmarks import report

    names = args.names or ALL
    unknown = sorted(set(names) - set(ALL))
    if unknown:
        print(f"unknown benchmarks {unknown}; known: {', '.join(ALL)}", file=sys.stderr)
        return 2
    started = time.time()
    deadline = time.monotonic() + args.budget
    machine = report.machine_facts(args.dsn)
    outcomes: list[Outcome] = []
    for module in PLAN:
        if module.name not in names:
            continue
        left = deadline - time.monotonic()
        if left < 15:
            outcomes.append(Outcome(module.name, "not run", 0.0, "over the time budget"))
            continue
        outcomes.append(run_module(module, args.rounds, args.dsn, min(module.timeout, left)))
    results = [r for o in outcomes for r in o.results]
    elapsed = time.time() - started
    print(f"\n== summary: ratios against each anchor ({args.rounds} rounds, medians)")
    rows = summary_rows(results)
    if rows:
        print_table(
            ["benchmark", "measurement", "ours", "anchor", "ratio", "target", "verdict"], rows
        )
    verdicts = [r.verdict for r in results]
    print(
        f"\n{verdicts.count('PASS')} PASS, {verdicts.count('MISS')} MISS, "
        f"{verdicts.count('SKIP')} SKIP; {elapsed:.0f} s"
    )
    for o in outcomes:
        if o.status != "ok":
            print(f"{o.name}: {o.status} {o.detail}".rstrip())
    generated = time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(started))
    if args.merge and RESULTS.exists():
        data = merged(
            json.loads(RESULTS.read_text(encoding="utf-8")), outcomes, results, generated, machine
        )
    elif args.write or args.merge or not args.names:
        data = {
            "generated": generated,
            "seconds": round(elapsed, 1),
            "rounds": args.rounds,
            "machine": machine,
            "modules": {
                o.name: {**o.to_json(), "generated": generated, "machine": report.summary(machine)}
                for o in outcomes
            },
            "results": [r.to_json() for r in results],
        }
    if args.write or args.merge or not args.names:
        RESULTS.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
        report.render(data, ROOT / "docs" / "benchmarks.md", ROOT / "docs" / "benchmarks.png")
        print(f"wrote {RESULTS.relative_to(ROOT)}, docs/benchmarks.md, docs/benchmarks.png")
    failed = [o for o in outcomes if o.status in ("failed", "timeout")]
    return 1 if failed else 0


def merged(
    data: dict[str, Any],
    outcomes: list[Outcome],
    results: list[Result],
    generated: str,
    machine: dict[str, Any],
) -> dict[str, Any]:
    """``data`` (an earlier results file) with the modules of this run replaced by what they
    reported now; every module keeps the date it was measured on and the machine it was
    measured on (``report.summary``; an older file's modules: the file's machine), and the
    file's own date becomes this run's."""
    from benchmarks import report

    ran = {o.name for o in outcomes}
    earlier = report.summary(data.get("machine", {}))
    modules = {
        name: {"generated": data["generated"], "machine": earlier, **m}
        for name, m in data.get("modules", {}).items()
        if name not in ran
    }
    here = report.summary(machine)
    modules.update(
        {o.name: {**o.to_json(), "generated": generated, "machine": here} for o in outcomes}
    )
    order = {m.name: i for i, m in enumerate(PLAN)}
    kept = [r for r in data.get("results", []) if r["benchmark"] not in ran]
    fresh = [r.to_json() for r in results]
    return {
        **data,
        "generated": generated,
        "seconds": round(sum(m.get("seconds", 0.0) for m in modules.values()), 1),
        "modules": dict(sorted(modules.items(), key=lambda kv: order.get(kv[0], len(order)))),
        "results": sorted([*kept, *fresh], key=lambda r: order.get(r["benchmark"], len(order))),
    }


def main(argv: list[str]) -> int:
    if argv[:1] == ["--child"]:
        try:
            return child(argv[1], Path(argv[2]), argv[3:])
        except Exception:
            traceback.print_exc()
            return 1
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks", description=__doc__.splitlines()[0] if __doc__ else None
    )
    parser.add_argument("names", nargs="*", help=f"benchmarks to run (default: all): {ALL}")
    parser.add_argument("--rounds", type=int, default=3, help="repeats per measurement")
    parser.add_argument("--dsn", default=DEFAULT_DSN, help="PostgreSQL server (admin DSN)")
    parser.add_argument(
        "--budget", type=float, default=720, help="seconds for the whole run (default 720)"
    )
    parser.add_argument(
        "--write", action="store_true", help="write results.json and the docs for a partial run"
    )
    parser.add_argument(
        "--merge",
        action="store_true",
        help="replace only the modules of this run in results.json (each keeps its own date)",
    )
    return orchestrate(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
