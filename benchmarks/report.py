"""The machine facts of a benchmark run and the rendering of ``docs/benchmarks.md`` and
``docs/benchmarks.png`` from ``benchmarks/results.json``'s data.

``python -m benchmarks.report`` re-renders the docs from the results file."""

from __future__ import annotations

import importlib
import json
import os
import platform
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path
from typing import Any

from benchmarks.common import DEFAULT_DSN, Result, format_ratio, format_target, format_value

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = (
    "wakeful",
    "msgspec",
    "psycopg",
    "psycopg-pool",
    "aiosqlite",
    "langgraph",
    "langgraph-checkpoint",
    "langgraph-checkpoint-sqlite",
    "langgraph-checkpoint-postgres",
    "pgqueuer",
    "asyncpg",
    "procrastinate",
    "matplotlib",
)

METHOD = {
    "memory_store": (
        "The reference backend's overhead, a ceiling for the others: commits (a checkpoint "
        "plus an event) and claim + commit + release cycles per second, in process."
    ),
    "file_store": (
        "Against the raw rate of the same disk: appends of the store's average record size "
        "with one `fsync` each, sequential commits (a ~1.5 kB checkpoint and an event, fenced "
        "by a claim), and 16 concurrent writers sharing fsyncs through group commit, "
        "interleaved in slices within each round. Then the replay speed of opening a ~100 MB "
        "log and the open time after compaction (one measurement each; `scale` repeats the "
        "opens)."
    ),
    "sqlite_store": (
        "wakeful's SQLite store (WAL, `synchronous=FULL`) beside LangGraph's `SqliteSaver.put` "
        "(WAL, `synchronous=FULL`) and `AsyncSqliteSaver.aput` of the same ~1.5 kB payload on "
        "the same disk, sequential and 8 concurrent writers, interleaved round by round. "
        "The ceiling rows (`benchmarks/sqlite_ceiling.py`) are the fastest fenced group commit "
        "the stack allows at 8 writers (raw `sqlite3` on a writer thread, three statements a "
        "commit, one fsync for 8), without any check of a commit, with the least check of "
        "its types, and with the contract's validation (`encode_commit`), "
        "and on the event loop's own thread (not allowed): the bound of the 3x target "
        "([decision 0022](decisions/0022-server-cost-per-dispatch.md))."
    ),
    "postgres_store": (
        "wakeful's PostgreSQL store beside a raw autocommit one-row `INSERT` of the same JSON "
        "and LangGraph's `PostgresSaver.put`, in a fresh database on the same server, "
        "sequential and 16 concurrent clients, `synchronous_commit=on`."
    ),
    "runtime_graph": (
        "A 3-node linear graph with durability `sync` (each run: 4 durable writes: the claim "
        "with the admission commit, the checkpoints after steps 1 and 2, the final checkpoint "
        "with the release; LangGraph's `SqliteSaver` makes 9 SQLite commits per run) on the "
        "memory, file and SQLite stores, beside LangGraph's `InMemorySaver` and `SqliteSaver` "
        "running the same graph, sequentially and from 8 concurrent threads (wakeful: 8 tasks "
        "on one runtime; LangGraph: 8 OS threads on one compiled graph whose `SqliteSaver` "
        "shares one connection, as LangGraph documents it), each run on a fresh thread id."
    ),
    "telemetry_cost": (
        "The `runtime_graph` graph on the memory and SQLite stores with tracing off "
        "(`telemetry.configure(enabled=False)`), with the OpenTelemetry API and no SDK (the "
        "default), and with the SDK recording every span (11 per run) into an in-memory "
        "exporter through a `BatchSpanProcessor`, the modes taking turns run by run; ratios "
        "paired block by block against the tracing-off runs interleaved with them. CPU time on "
        "a shared machine cannot judge 1 %: decision 0018 counts instructions (`--probe`)."
    ),
    "streaming": (
        "Deltas per second through the agent's model node from a provider pacing 10,000 "
        "deltas/s, with stream checkpoints on vs off (file and SQLite stores)."
    ),
    "dispatch": (
        "Two worker processes drain pre-submitted dispatches of a one-node graph with an async "
        "no-op node (claim with the thread's snapshot, admission commit, result + checkpoint "
        "commit that also settles: all durable) at 1 and 10 runs "
        "per worker, on SQLite and PostgreSQL; two pgqueuer processes (asyncpg driver) and two "
        "procrastinate processes drain the same number of no-op jobs from the same server, "
        "each system in a fresh database. Time: from the go signal to the later worker's "
        "drain returning; each job is checked to have run exactly once. Recovery: SIGKILL of "
        "the worker running a long node (ttl 2 s, renew every 0.5 s, poll every 0.25 s) "
        "until the other worker process re-enters the node. Per job at 10 per worker, for "
        "all three systems: PostgreSQL transactions (`pg_stat_database`), the server's CPU "
        "(the database's backends, `/proc/<pid>/schedstat`) and the worker processes' CPU "
        "(`benchmarks/pgcost.py`)."
    ),
    "agents": (
        "The comparison users face (issue 22): a 3-node graph whose state is durable after "
        "each step, 2 worker processes x 10 concurrent jobs on one PostgreSQL server: "
        "wakeful's fleet against pgqueuer and procrastinate jobs that run the same graph "
        'with LangGraph\'s `AsyncPostgresSaver` (`durability="sync"`), each system in a '
        "fresh database. Jobs/s from the go signal to the later process done; each job is "
        "checked to have run its three steps once and to end in a durable checkpoint; "
        "transactions, server CPU and worker CPU per job as in `dispatch`."
    ),
    "flow_control": (
        "Issue 39's rate limits on PostgreSQL. Accuracy: two worker processes keep 4 agent "
        "runs each going against a loopback OpenAI-compatible server, every model call "
        "taking from one `RateLimit(requests_per_minute=120)`; the server counts the "
        "requests of the 60 s from the first (the bucket's one second of burst adds 2). "
        "Cost: agent runs of one model call against the instant loopback model, 8 at a "
        "time, with a limit that is never reached, in 12 pairs of 100-run batches "
        "interleaved with the same agent without it; the figure is the median of the pairs' "
        "ratios (a ratio of medians across rounds measures the shared machine's load). "
        "Then the limit's store calls per model call (one: the take pays the previous "
        "call's reconcile, [decision 0047](decisions/0047-limit-fold-and-waiters.md)) and "
        "their time, 8 at a time and on one connection against a take plus a reconcile."
    ),
    "frameworks": (
        "Issue 42: a 3-step agent run (a model call asking for a tool, the tool, a model call "
        "answering; an instant in-process model), sequential, a fresh thread per run, through "
        "`WakefulAgent` (PydanticAI) and `WakefulRunner` (Agents SDK, `get_response`) on "
        "SQLite and PostgreSQL, beside the same agent under the framework's DBOS integration "
        "(`DBOSDurability` in a `@DBOS.workflow`, `DBOSRunner.run` in one; the tool a "
        "`@DBOS.step`) on a SQLite file and a PostgreSQL database of the same server, each "
        "DBOS measurement in a process of its own. Without `dbos` installed the DBOS side is "
        "skipped (docs/pydantic-ai.md has the venv)."
    ),
    "langgraph_saver": (
        'The same 3-node linear LangGraph graph (`durability="sync"`, a fresh thread per '
        'run) on `WakefulSaver` (default `fencing="auto"`: each run claims its thread '
        "before its first node, one durable write more than LangGraph's savers make, then 9 "
        "fenced commits) beside LangGraph's `SqliteSaver` (`graph.invoke`; concurrent: OS "
        "threads) and `AsyncSqliteSaver` on the same disk, and `AsyncPostgresSaver` (pool "
        "of 16) on the same server, sequential and 8 (SQLite) or 16 (PostgreSQL) concurrent "
        "threads. `InMemorySaver` (no storage) shows what LangGraph itself costs. Then a "
        "long thread (issue 35): a chat graph appending a 100-byte message per turn, "
        "written for 10, 100 and 1,000 turns by a process of its own (the writer's peak "
        "RSS), and per round a new process's first `aget_tuple` (the latest checkpoint): "
        "its time and its process's peak RSS, each against the same at 10 turns "
        "([decision 0030](decisions/0030-langgraph-saver-fencing-and-channel-versions.md))."
    ),
    "concurrency": (
        "One worker holding N runs (100, 1,000, 5,000), each an agent turn streaming a "
        "600-character reply as 150 deltas (over 18.1 s at N = 1,000, the issue's experiment; "
        "6 s at 100 and 5,000), with stream checkpoints and "
        "`ClaimPolicy(ttl=30, renew_every=10)`, on SQLite and PostgreSQL, beside a plain "
        "asyncio script streaming the same replies and storing nothing, each in a fresh "
        "process: wall against the stream's length, CPU against the baseline's, peak RSS "
        "against the baseline's + 40 KB a run, event-loop lag p99 (a 10 ms ticker), "
        "transactions per second, and runs ended exactly once (issue 24)."
    ),
    "scale": (
        "Commit cost on a thread holding 1, 100 or 10,000 messages on each store (must stay "
        "flat; judged as 10k/1 <= 1.5x), file store open time vs log size, and `tracemalloc` "
        "bytes retained per idle thread (10,000 threads) in the memory and file stores."
    ),
    "scale_paths": (
        "Issue 27: every read and claim path on SQLite and PostgreSQL at 1k, 100k and 1M "
        "threads (a thread with 10M events, 100k pending and 10k leased dispatches; data built "
        "with set-based inserts), with and without `ANALYZE`. The sizes take turns call by "
        "call; flatness (largest / smallest <= 1.5x) is judged on CPU per call (the client "
        "process plus the database's backends), wall time is reported beside it and judged "
        "only against the absolute limits (a tenant page and a metrics scrape <= 20 ms). "
        "[Decision 0027](decisions/0027-flat-reads.md) says why."
    ),
    "schedules": (
        "Issue 38: schedule ticks fired by the workers' own firing loop "
        "([decision 0044](decisions/0044-batch-firing-and-tool-sleep.md)). On PostgreSQL: "
        "2,000 schedules due now fired by one firer in batches (one statement per 100) and "
        "one by one (decision 0038's three round trips a tick); 10,000 interval schedules due "
        "at the same second, fired by two firer processes, for each round's tick (the "
        "previous round's runs ended, so the overlap check reads them); 10,000 cron "
        "schedules with a seconds field, a 60th due each second of one minute. On SQLite, "
        "2,000 due at once, one firer. A tick's lateness: its dispatch's `created_at` minus "
        "the tick, by the store's clock. The 1 s p99 of the issue is judged on PostgreSQL."
    ),
}


# ---------------------------------------------------------------- machine facts


def fsync_latency(samples: int = 200) -> dict[str, float]:
    """Milliseconds for one 200-byte append + fsync in the temp directory."""
    with tempfile.TemporaryDirectory(prefix="wakeful-bench-fsync-") as tmp:
        fd = os.open(Path(tmp) / "probe", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            times = []
            for _ in range(samples):
                start = time.perf_counter()
                os.write(fd, b"x" * 200)
                os.fsync(fd)
                times.append((time.perf_counter() - start) * 1e3)
        finally:
            os.close(fd)
    times.sort()
    return {
        "median_ms": round(statistics.median(times), 3),
        "p99_ms": round(times[int(len(times) * 0.99) - 1], 3),
    }


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _memory_gb() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 1e6, 1)
    except OSError:
        pass
    return None


def _postgres(dsn: str) -> dict[str, str]:
    try:
        import psycopg

        with psycopg.connect(dsn, connect_timeout=5) as conn:
            row = conn.execute(
                "SELECT current_setting('server_version'), current_setting('synchronous_commit'),"
                " current_setting('fsync')"
            ).fetchone()
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}
    assert row is not None
    return {"version": row[0], "synchronous_commit": row[1], "fsync": row[2]}


def _git() -> dict[str, str]:
    def git(*args: str) -> str:
        done = subprocess.run(
            ["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=10, check=False
        )
        return done.stdout.strip()

    try:
        return {
            "commit": git("rev-parse", "--short", "HEAD"),
            "dirty": str(bool(git("--no-optional-locks", "status", "--porcelain"))),
        }
    except (OSError, subprocess.SubprocessError):
        return {}


def summary(machine: dict[str, Any]) -> dict[str, Any]:
    """What a module's section names of the machine it was measured on: its CPU, its disk's
    fsync latency and the wakeful commit measured (figures from another CPU or disk compare
    with each other, not with the rest of the page)."""
    return {
        "cpu_model": machine.get("cpu_model"),
        "fsync_median_ms": machine.get("fsync", {}).get("median_ms"),
        "commit": machine.get("git", {}).get("commit"),
    }


def machine_facts(dsn: str = DEFAULT_DSN) -> dict[str, Any]:
    versions = {}
    for package in PACKAGES:
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[package] = "not installed"
    return {
        "cpus": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "cpu_model": _cpu_model(),
        "memory_gb": _memory_gb(),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "platform": platform.platform(),
        "python": platform.python_version(),
        "sqlite": sqlite3.sqlite_version,
        "fsync": fsync_latency(),
        "postgres": _postgres(dsn),
        "git": _git(),
        "packages": versions,
    }


# ---------------------------------------------------------------- rendering


def _table(headers: list[str], rows: list[list[str]]) -> list[str]:
    def cell(text: str) -> str:
        return text.replace("|", "\\|")

    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows]
    return lines


def _anchor(r: Result) -> str:
    if r.anchor is None:
        return "-"
    if r.anchor_value is None:
        return r.anchor
    return f"{r.anchor}: {format_value(r.anchor_value, r.unit)}"


def _verdict(r: Result) -> str:
    verdict = r.verdict
    return f"**{verdict}**" if verdict in ("PASS", "MISS") else (verdict or "-")


def _samples(r: Result) -> str:
    if len(r.samples) < 2:
        return "-"
    return ", ".join(format_value(s, "") for s in r.samples)


def _measured_elsewhere(modules: dict[str, Any], machine: dict[str, Any]) -> set[str]:
    """The modules whose recorded machine (``summary``) has another CPU than the page's."""
    return {
        name
        for name, m in modules.items()
        if m.get("machine") and m["machine"].get("cpu_model") != machine.get("cpu_model")
    }


def render_markdown(data: dict[str, Any], png: str | None) -> str:
    results = [Result.from_json(r) for r in data["results"]]
    machine = data["machine"]
    verdicts = [r.verdict for r in results]
    lines = [
        "# Benchmarks",
        "",
        f"Generated by `python -m benchmarks` (`make bench`) on {data['generated']} in "
        f"{data['seconds']:.0f} s; every figure is the median of {data['rounds']} rounds. "
        "Do not edit by hand: rerun it (see [Reproduce](#reproduce)).",
        "",
    ]
    dates = {m.get("generated", data["generated"]) for m in data.get("modules", {}).values()}
    if len(dates) > 1:
        lines += [
            "Stitched with `--merge` from module runs on different dates: each module's "
            "section says when it was measured if that is not the date above, and on which "
            "machine if not on the one under [Machine](#machine).",
            "",
        ]
    lines += [
        f"**{verdicts.count('PASS')} targets met, {verdicts.count('MISS')} missed, "
        f"{verdicts.count('SKIP')} skipped.**",
        "",
        "## Targets",
        "",
        "Each target compares our figure with an anchor measured in the same run on the same "
        "machine (or a fixed limit): ratio = ours / anchor. Several targets are bounded by "
        "the number of durable writes each side makes (fsyncs, WAL flushes) rather than by "
        "our code: [decision 0005](decisions/0005-benchmark-bounds.md) counts them.",
        "",
    ]
    targeted = [r for r in results if r.target is not None or r.skipped]
    modules = data.get("modules", {})
    elsewhere = _measured_elsewhere(modules, machine)
    lines += _table(
        ["benchmark", "measurement", "ours", "anchor", "ratio", "target", "verdict"],
        [
            [r.benchmark + (" (another machine)" if r.benchmark in elsewhere else ""), r.name,
             format_value(r.value, r.unit), _anchor(r), format_ratio(r), format_target(r),
             _verdict(r)]
            for r in targeted
        ],
    )  # fmt: skip
    troubled = {name: m for name, m in modules.items() if m["status"] != "ok"}
    if troubled:
        lines += ["", "Modules that did not report:", ""]
        lines += [
            f"- `{name}`: {m['status']} {m['detail']}".rstrip() for name, m in troubled.items()
        ]
    if png:
        lines += ["", f"![runs/s and dispatches/s per store beside the anchors]({png})"]
    lines += ["", "## Machine", ""]
    fsync = machine.get("fsync", {})
    postgres = machine.get("postgres", {})
    pg = (
        f"{postgres['version']} (synchronous_commit={postgres['synchronous_commit']}, "
        f"fsync={postgres['fsync']})"
        if "version" in postgres
        else postgres.get("error", "-")
    )
    git = machine.get("git", {})
    facts = [
        ["CPUs", f"{machine.get('cpus')} ({machine.get('cpus_usable')} usable): "
                 f"{machine.get('cpu_model')}"],
        ["memory", f"{machine.get('memory_gb')} GB"],
        ["load average at start", ", ".join(str(x) for x in machine.get("load_average", []))],
        ["fsync (200 B append + fsync)", f"median {fsync.get('median_ms')} ms, "
                                         f"p99 {fsync.get('p99_ms')} ms"],
        ["platform", str(machine.get("platform"))],
        ["Python", str(machine.get("python"))],
        ["SQLite", str(machine.get("sqlite"))],
        ["PostgreSQL", pg],
        ["wakeful commit", f"{git.get('commit', '?')}"
                           f"{' (with local changes)' if git.get('dirty') == 'True' else ''}"],
    ]  # fmt: skip
    facts += [[name, version] for name, version in machine.get("packages", {}).items()]
    lines += _table(["fact", "value"], facts)
    lines += [
        "",
        "## Method",
        "",
        "Each module runs in its own subprocess (one crash or hang ends that module only) "
        "and repeats every measurement; rounds interleave the configurations compared, so "
        "a slow spell of the (shared, virtual) disk or CPU hits all of them alike, and the "
        "median of the rounds is reported. Every anchor is measured in the same run, on the "
        "same machine, disk and server, with the same payload. Every wakeful commit is "
        "durable when acknowledged (fsync / `synchronous_commit=on`). Benchmarks fail loudly "
        "on wrong results (a dispatch not executed, executed twice, or not recorded) but "
        "never on speed. An anchor whose package is not installed is reported as skipped.",
        "",
    ]
    by_module: dict[str, list[Result]] = {}
    for r in results:
        by_module.setdefault(r.benchmark, []).append(r)
    for name in [*METHOD, *(m for m in by_module if m not in METHOD)]:
        if name not in by_module and name not in modules:
            continue
        status = modules.get(name, {})
        seconds = f" ({status['seconds']:.0f} s)" if "seconds" in status else ""
        if "generated" in status and status["generated"] != data["generated"]:
            seconds += f", measured {status['generated']}"
        if name in elsewhere:
            measured_on = status["machine"]
            seconds += (
                f" on another machine: {measured_on.get('cpu_model')}, fsync median "
                f"{measured_on.get('fsync_median_ms')} ms, wakeful {measured_on.get('commit')}"
            )
        lines += [f"### {name}{seconds}", "", METHOD.get(name, ""), ""]
        if name not in by_module:
            lines += [f"Not reported: {status.get('status')} {status.get('detail', '')}", ""]
            continue
        lines += _table(
            ["measurement", "median", "rounds", "anchor", "ratio", "target", "verdict", "note"],
            [
                [r.name, format_value(r.value, r.unit), _samples(r), _anchor(r),
                 format_ratio(r), format_target(r), _verdict(r),
                 "; ".join(x for x in (r.note, r.skipped or "") if x) or "-"]
                for r in by_module[name]
            ],
        )  # fmt: skip
        lines.append("")
    if NOTES.exists():  # measurements made outside this runner, kept until a run replaces them
        lines += [NOTES.read_text(encoding="utf-8").rstrip(), ""]
    lines += [
        "## Reproduce",
        "",
        "```bash",
        "make bench                                    # installs the bench extra, runs all",
        ".venv/bin/python -m benchmarks                # the same: results.json and this page",
        ".venv/bin/python -m benchmarks dispatch scale # some modules (prints only; --write)",
        ".venv/bin/python -m benchmarks.dispatch --n 2000 --rounds 3   # one module, options",
        ".venv/bin/python -m benchmarks.report         # re-render this page from results.json",
        "```",
        "",
        "The PostgreSQL benchmarks need a server they may create and drop databases on "
        f"(`--dsn`, default `{DEFAULT_DSN}`); every scratch database and directory is "
        "removed at the end. The whole run takes under 12 minutes on a 2-CPU machine "
        "(`--budget` seconds, default 720; a module over it is reported as not run).",
        "",
    ]
    return "\n".join(lines)


def _find(results: list[Result], benchmark: str, name: str) -> Result | None:
    for r in results:
        if r.benchmark == benchmark and r.name == name:
            return r
    return None


def render_png(data: dict[str, Any], path: Path) -> bool:
    """Runs/s of the graph benchmark and dispatches/s at 10 per worker, ours beside the
    anchors. False (nothing written) when matplotlib is not installed or nothing ran."""
    try:
        # imported by name: matplotlib is a benchmark-only extra, absent when CI type-checks
        matplotlib = importlib.import_module("matplotlib")
        matplotlib.use("Agg")
        plt = importlib.import_module("matplotlib.pyplot")
    except ImportError:
        return False
    results = [Result.from_json(r) for r in data["results"]]
    panels: list[tuple[str, list[tuple[str, float, bool]]]] = []
    graph: list[tuple[str, float, bool]] = []
    for store in ("memory", "file", "sqlite"):
        r = _find(results, "runtime_graph", f"wakeful {store}")
        if r is not None and r.value is not None:
            graph.append((f"wakeful\n{store}", r.value, True))
    for saver in ("InMemorySaver", "SqliteSaver"):
        r = _find(results, "runtime_graph", f"langgraph {saver}")
        if r is not None and r.value is not None:
            graph.append((f"LangGraph\n{saver}", r.value, False))
    if graph:
        panels.append(("3-node graph, durability sync: runs/s", graph))
    dispatch: list[tuple[str, float, bool]] = []
    sqlite_rate = _find(results, "dispatch", "wakeful sqlite, 2 processes x 10 runs")
    if sqlite_rate is not None and sqlite_rate.value is not None:
        dispatch.append(("wakeful\nSQLite", sqlite_rate.value, True))
    prefix = "wakeful postgres, 2 processes x 10 runs vs "
    for anchor in ("pgqueuer", "procrastinate"):
        r = _find(results, "dispatch", prefix + anchor)
        if r is None:
            continue
        if anchor == "pgqueuer" and r.value is not None:
            dispatch.append(("wakeful\nPostgreSQL", r.value, True))
        if r.anchor_value is not None:
            dispatch.append((anchor, r.anchor_value, False))
    if dispatch:
        panels.append(("dispatches/s, 2 worker processes x 10", dispatch))
    if not panels:
        return False
    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4.2), squeeze=False)
    for ax, (title, bars) in zip(axes[0], panels, strict=True):
        labels = [b[0] for b in bars]
        values = [b[1] for b in bars]
        colors = ["#2b6cb0" if ours else "#a0aec0" for _, _, ours in bars]
        drawn = ax.bar(labels, values, color=colors)
        ax.bar_label(drawn, labels=[f"{v:,.0f}" for v in values], fontsize=8)
        ax.set_title(title, fontsize=10)
        if max(values) > 20 * min(values):
            ax.set_yscale("log")
        else:
            ax.set_ylim(0, max(values) * 1.12)
        ax.tick_params(axis="x", labelsize=8)
        ax.spines[["top", "right"]].set_visible(False)
    fig.suptitle(f"wakeful (blue) beside the anchors (grey), medians; {data['generated']}",
                 fontsize=9)  # fmt: skip
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


NOTES = ROOT / "benchmarks" / "notes.md"
"""Hand-written sections (figures measured by a module's own command line, not by this
runner), rendered after the modules' sections."""


def render(data: dict[str, Any], markdown: Path, png: Path) -> None:
    drawn = render_png(data, png)
    markdown.write_text(render_markdown(data, png.name if drawn else None), encoding="utf-8")


def main(argv: list[str] | None = None) -> None:
    data = json.loads((ROOT / "benchmarks" / "results.json").read_text(encoding="utf-8"))
    render(data, ROOT / "docs" / "benchmarks.md", ROOT / "docs" / "benchmarks.png")
    print("rendered docs/benchmarks.md and docs/benchmarks.png", file=sys.stderr)


if __name__ == "__main__":
    main(sys.argv[1:])
