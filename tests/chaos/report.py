"""Figures of a chaos run: the summary printed at the end and ``docs/reliability.md``."""

from __future__ import annotations

import os
import platform
import subprocess
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime

from tests.chaos.checks import INVARIANTS
from tests.chaos.matrix import CELLS, MASK, cell_name
from tests.chaos.trials import TrialResult


@dataclass
class CellFigures:
    trials: int = 0
    hit: int = 0
    aimed: int = 0
    violations: Counter[str] = field(default_factory=Counter)
    seconds: list[float] = field(default_factory=list)
    seeds: list[int] = field(default_factory=list)
    faults: Counter[str] = field(default_factory=Counter)
    recoveries: Counter[str] = field(default_factory=Counter)
    outcomes: Counter[str] = field(default_factory=Counter)
    takeovers: int = 0
    fenced: int = 0
    stalled: int = 0
    locked_out: int = 0
    second: int = 0
    wakes: Counter[str] = field(default_factory=Counter)
    commits: int = 0
    claims: int = 0


def figures(results: list[TrialResult]) -> dict[tuple[str, str], CellFigures]:
    cells: dict[tuple[str, str], CellFigures] = defaultdict(CellFigures)
    for r in results:
        c = cells[(r.kind, r.store)]
        c.trials += 1
        if "hit" in r.notes:
            c.aimed += 1
            c.hit += bool(r.notes["hit"])
        c.violations.update(v.invariant for v in r.violations)
        c.seconds.append(r.duration)
        c.seeds.append(r.seed)
        c.faults.update(r.notes.get("points") or [])
        c.recoveries.update(r.notes.get("recoveries") or {})
        c.outcomes.update(r.notes.get("outcomes") or {})
        c.takeovers += int(r.notes.get("takeovers") or 0)
        c.fenced += int(r.notes.get("stale_refusals") or 0)
        c.stalled += bool(r.notes.get("stalled"))
        c.locked_out += int(r.notes.get("locked_out") or 0)
        c.second += bool(r.notes.get("second"))
        if r.kind == "writer_kill":
            c.commits += int(r.notes.get("commits") or 0)
            c.claims += int(r.notes.get("claims") or 0)
        wake = str(r.notes.get("wake", ""))
        if wake:
            c.wakes["while the successors ran" if "running" in wake else "after"] += 1
    return cells


def summary(results: list[TrialResult]) -> str:
    cells = figures(results)
    lines = [
        f"{'cell':<24} {'trials':>6} {'hit':>7} {'violations':>10} {'mean s':>7}  notes",
    ]
    for cell in CELLS:
        if cell not in cells:
            continue
        c = cells[cell]
        hit = f"{c.hit}/{c.aimed}" if c.aimed else "-"
        notes = ", ".join(f"{k}: {n}" for k, n in sorted(c.violations.items()))
        if c.stalled:
            notes += f"{', ' if notes else ''}SQLite lock stalls: {c.stalled}"
        mean = sum(c.seconds) / len(c.seconds)
        lines.append(
            f"{cell_name(cell):<24} {c.trials:>6} {hit:>7} {sum(c.violations.values()):>10} "
            f"{mean:>7.1f}  {notes}"
        )
    total = sum(c.trials for c in cells.values())
    bad = sum(sum(c.violations.values()) for c in cells.values())
    lines.append(f"{'total':<24} {total:>6} {'':>7} {bad:>10}")
    return "\n".join(lines)


def _postgres_version() -> str:
    try:
        done = subprocess.run(
            ["psql", "-h", "127.0.0.1", "-U", "postgres", "-tAc", "SHOW server_version"],
            capture_output=True,
            text=True,
            timeout=10,
        )
        return done.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def markdown(results: list[TrialResult], command: str, duration: float, skipped: list[str]) -> str:
    cells = figures(results)
    total = sum(c.trials for c in cells.values())
    bad = sum(sum(c.violations.values()) for c in cells.values())
    kinds: dict[str, int] = Counter()
    for (kind, _), c in cells.items():
        kinds[kind] += c.trials
    out: list[str] = []
    add = out.append
    add("# Reliability: the chaos matrix")
    add("")
    add(
        "wakeful's promises (no acknowledged work lost, nothing recorded twice, no write from "
        "a stale process, no tool run on arguments that did not validate, `never` tools at "
        "most once) are tested by a randomized matrix of fault trials against real "
        "processes. This page is written by the last full run; the code is in "
        "`tests/chaos/`."
    )
    add("")
    add("## The last full run")
    add("")
    add(f"- Command: `{command}`")
    add(f"- Date: {datetime.now(UTC):%Y-%m-%d %H:%M} UTC; duration {duration / 60:.1f} min")
    add(
        f"- Machine: {os.cpu_count()} cores, Linux {platform.release()}, Python "
        f"{platform.python_version()}, PostgreSQL {_postgres_version()}"
    )
    add(f"- **{total} trials, {bad} violations.**")
    if skipped:
        add(f"- Not run: {', '.join(skipped)}")
    add("")
    add("| fault kind | trials |")
    add("| --- | ---: |")
    for kind, n in sorted(kinds.items()):
        add(f"| {kind} | {n} |")
    add("")
    add("| fault kind / store | trials | fault hit | violations | mean s | max s | seeds |")
    add("| --- | ---: | ---: | ---: | ---: | ---: | --- |")
    for cell in CELLS:
        if cell not in cells:
            continue
        c = cells[cell]
        hit = f"{c.hit}/{c.aimed}" if c.aimed else "every trial"
        seeds = f"{min(c.seeds)}-{max(c.seeds)}"
        if len(c.seeds) > 1 and max(c.seeds) - min(c.seeds) != len(c.seeds) - 1:
            seeds = f"{len(c.seeds)} seeds in {seeds}"
        vio = sum(c.violations.values())
        detail = " (" + ", ".join(f"{k} {n}" for k, n in sorted(c.violations.items())) + ")"
        add(
            f"| {cell_name(cell)} | {c.trials} | {hit} | {vio}{detail if vio else ''} | "
            f"{sum(c.seconds) / len(c.seconds):.1f} | {max(c.seconds):.1f} | {seeds} |"
        )
    add("")
    add(
        "*Fault hit*: the process was still working when the fault struck (a random delay "
        "can outlast the work; an instrumented point may be reached by another worker). Seeds "
        f"are `cell << 24 | n` (n below {MASK + 1}), so a seed names its cell: replay one with "
        "`CHAOS_SEED=<seed> CHAOS_TRIALS=1 .venv/bin/python -m tests.chaos`."
    )
    add("")
    add("### What the faults exercised")
    add("")
    recoveries: Counter[str] = Counter()
    outcomes: Counter[str] = Counter()
    faults: dict[str, Counter[str]] = defaultdict(Counter)
    takeovers = fenced = stalled = locked_out = second = commits = claims = 0
    wakes: Counter[str] = Counter()
    for (kind, _), c in cells.items():
        recoveries += c.recoveries
        outcomes += c.outcomes
        faults[kind] += c.faults
        takeovers += c.takeovers
        fenced += c.fenced
        stalled += c.stalled
        locked_out += c.locked_out
        second += c.second
        wakes += c.wakes
        commits += c.commits
        claims += c.claims
    add("| fault kind | fault points (trials or rounds) |")
    add("| --- | --- |")
    for kind, counter in sorted(faults.items()):
        points = ", ".join(f"{p} {n}" for p, n in counter.most_common() if p)
        add(f"| {kind} | {points} |")
    add("")
    add(
        f"- Stream recoveries in committed assistant turns: "
        f"{', '.join(f'{k} {n}' for k, n in sorted(recoveries.items())) or 'none'}."
    )
    add(
        f"- Tool results: {', '.join(f'{k} {n}' for k, n in sorted(outcomes.items())) or 'none'} "
        "(`indeterminate`: a `never` call whose start was recorded before its process died or "
        "was fenced; `invalid`: planned invalid, incomplete or unknown-tool calls)."
    )
    add(
        f"- Worker trials: {takeovers} leases granted again without a settle of the previous "
        f"one (its holder was killed, paused or fenced); {fenced} runs or settles that "
        f"workers gave up because the store refused them as stale (`StaleClaim`); "
        f"{second} trials where a replacement worker was killed too."
    )
    if claims:
        add(
            f"- Writer trials: {commits} acknowledged commits under {claims} claims (each "
            "takeover of a lapsed claim is a new claim)."
        )
    if wakes:
        add(
            f"- Paused workers woken after their successors had finished: {wakes['after']} "
            f"(the store compared before and after); while the successors still ran: "
            f"{wakes['while the successors ran']}."
        )
    if stalled:
        add(
            f"- {stalled} SIGSTOP trials on SQLite stopped the worker while it held the "
            "database's write lock: every other process waited until SIGCONT, and "
            f"{locked_out} workers started meanwhile gave up opening the store (see the limits)."
        )
    add("")
    add("## Violations in this run")
    add("")
    failed = [r for r in results if r.violations]
    if not failed:
        add("None.")
    else:
        add("| seed | cell | fault | invariant | what |")
        add("| --- | --- | --- | --- | --- |")
        for r in sorted(failed, key=lambda r: (r.kind, r.store, r.seed)):
            fault = str(r.notes.get("fault") or ", ".join(r.notes.get("faults", [])))
            for v in r.violations[:3]:
                detail = v.detail.replace("|", "/").replace("\n", " ")[:160]
                add(f"| {r.seed} | {r.kind}/{r.store} | {fault} | {v.invariant} | {detail} |")
    add("")
    add(FINDINGS)
    add("## The fault kinds")
    add("")
    add("| kind | stores | what a trial does |")
    add("| --- | --- | --- |")
    for kind, stores, what in KINDS:
        add(f"| {kind} | {stores} | {what} |")
    add("")
    add(STATIC)
    add("## Invariants and how they are checked")
    add("")
    for key, text in INVARIANTS.items():
        if key in CHECKS:
            add(f"- **{text}** (`{key}`): {CHECKS[key]}")
    add("")
    add(LIMITS)
    return "\n".join(out) + "\n"


CHECKS: dict[str, str] = {
    "acknowledged": (
        "every child logs each store call that returned (commit receipts with their event "
        "numbers, types, message ids and staged messages; settles; claims granted), one "
        "fsynced line after the call returned. After recovery every acknowledged commit must "
        "be in the store whole: its checkpoint in the history, each event at the number its "
        "receipt gave with the same type, each message; an acknowledged `Done` settle stays "
        "done; every staged message is delivered (one `message` dispatch, consumed by one run "
        "or waiting in the inbox). Torn logs: after cutting the log at byte c and reopening, "
        "every thread is exactly at the last version acknowledged before c (version, message "
        "count, last event number and checkpoint id), also after a second reopen, and the "
        "recovered log followed by the torn bytes the opener kept beside it is exactly the "
        "log as cut (nothing destroyed). SQLite "
        "writer trials also run `PRAGMA integrity_check`."
    ),
    "duplicate": (
        "event numbers are contiguous; per run at most one `run.started` and one terminal "
        "event, per task one `task.completed` and one `fact`, per step one `step.completed`, "
        "per mark one `task.marked`; message ids are unique and each conversation is well "
        "formed (one user message per run; after each assistant turn exactly one result per "
        "committed call, no result for an uncommitted call, no turn before the previous "
        "turn's results); per message one dispatch, one inbox entry and one processing run; "
        "writer threads hold checkpoints, messages and events 1..V in order; and, from the "
        "side-effect ledgers, no task or tool call starts again under the same or a later "
        "token after its result was acknowledged."
    ),
    "stale": (
        "from all processes' ledgers: no acknowledged commit, renewal, settle or stream "
        "checkpoint put under token T was sent after a claim with a greater token on the same "
        "thread had been granted (times are CLOCK_MONOTONIC, shared by all processes); the "
        "tokens carried in a thread's events never decrease along the event numbers; and in "
        "SIGSTOP trials the whole store (events, messages, checkpoints, pending writes, "
        "inboxes, dispatches) is dumped after the successors finished and again after the "
        "paused worker was woken and stopped by itself: the two dumps are equal."
    ),
    "incomplete-call": (
        "every tool effect (fsynced before the tool returns) names its call; the call must be "
        "in a committed assistant turn with arguments that parse as a complete JSON object "
        'and validate (`{"n": int}`), and the tool must have received exactly those '
        "arguments. Calls planned with a wrong type, an extra field, cut JSON or an unknown "
        "tool, and calls cut by a dropped stream, never run and get an `invalid` result when "
        "committed."
    ),
    "replay": (
        "a `never` call has at most one effect (and an `ok` result only if it ran); every "
        "attempt of a `keyed` call used the same idempotency key, no two calls share a key, "
        "and the downstream system (an `O_EXCL` file per key) applied each key once. `safe` "
        "calls may run more than once by design and are not counted."
    ),
    "hand": (
        "`hand_kill` trials: every call an agent made through the remote hand (its tools pass "
        "`ctx`, so the call's idempotency key is the operation id) is compared with the "
        "hand's SQLite ledger read after the trial: an `ok` result must equal the ledger's "
        "recorded result; an `indeterminate` one must have no result in the ledger (the hand "
        "died mid-call, or the call never reached it) and exactly one `tool.indeterminate` "
        "event; a call is recorded `error` only as `HandUnavailable` (connection refused on "
        "every attempt) and then the ledger must not know it. From the hand tools' fsynced "
        "execution log, no operation runs twice (checked under `replay`)."
    ),
    "fail-closed": (
        "after flipping one byte (random position and mask) in a complete record of the log "
        "(never its final newline, which is indistinguishable from a torn append) or the "
        "snapshot, zero-filling a run of them that a complete line follows, or zero-filling "
        "the whole file, opening raises `CorruptStore` and every file of the root (all but "
        "the lock file, whose content is the opener's pid) is byte for byte unchanged."
    ),
    "liveness": (
        "not one of the five invariants but reported as a failure too: after the faults every "
        "dispatch is done, every run completed, every inbox is consumed and nothing is left "
        "staged."
    ),
    "harness": "an exception in the trial itself or an unexpected store error in a child.",
}

KINDS: tuple[tuple[str, str, str], ...] = (
    (
        "`worker_kill`",
        "file, SQLite, PostgreSQL",
        (
            "submits 1-3 agent threads (plans of 1-3 turns of 1-3 tool calls over `safe`, `keyed` "
            "and `never` tools, some invalid, some streams dropped mid-arguments) and 0-2 fan-out "
            "graphs that send messages to an inbox thread; runs workers (relay on) as processes; "
            "SIGKILLs the first one after a random delay or at an instrumented point "
            "(before/after a commit, before/after a settle, after a lease, mid-stream, "
            "before/after a tool's effect, inside a graph task, after a relay delivery; on the "
            "file store also the store's own crash hooks after a log write, after its fsync and "
            "at every compaction step); replacement workers finish the work"
        ),
    ),
    (
        "`worker_stop`",
        "SQLite, PostgreSQL",
        (
            "the same workload; the first worker is SIGSTOPped at a random moment or point; the "
            "others take its leases over once they expire (ttl 1 s) and finish; the store is "
            "dumped, the paused worker gets SIGCONT, finds itself fenced and stops; the store is "
            "dumped again"
        ),
    ),
    (
        "`relay_kill`",
        "file, SQLite, PostgreSQL",
        (
            "stages 2-4 source threads' outbox entries (up to 96 messages to 1-3 targets); 1-3 "
            "rounds of relay processes (two at once on SQLite and PostgreSQL) delivering in "
            "batches of 1-4, SIGKILLed after a random delay, after their n-th delivery, or (file) "
            "at the store's `relay.after_append`, `log.after_write` or `log.after_fsync` crash "
            "hooks; a last relay drains"
        ),
    ),
    (
        "`writer_kill`",
        "file, SQLite, PostgreSQL",
        (
            "1-3 rounds of writer processes (two at once on SQLite and PostgreSQL) competing for "
            "2-4 threads with 0.3 s claims they sometimes let lapse (so takeovers and stale "
            "commits happen), SIGKILLed at random moments or (file) at the log and compaction "
            "crash hooks"
        ),
    ),
    (
        "`pg_restart`",
        "PostgreSQL",
        (
            "a larger worker workload on a server of the trial's own, restarted (fast "
            "shutdown, start) at a random moment; the workers recover from "
            "`StoreUnavailable` on their own"
        ),
    ),
    (
        "`torn_log`",
        "file",
        (
            "a child commits 3-150 times (compaction sometimes on) and closes; the log is "
            "truncated at a random byte (anywhere, at a record boundary, one byte short of one, "
            "or inside the header) and reopened"
        ),
    ),
    (
        "`corrupt_log`",
        "file",
        (
            "the same child; in the log or the snapshot, one byte of a complete record is "
            "flipped, a run of bytes up to a complete line is zero-filled, or the whole file "
            "is; the open must fail closed"
        ),
    ),
    (
        "`hand_kill`",
        "SQLite",
        (
            "2-4 agent threads whose `keyed` and `never` tools run through a remote hand "
            "process (each hand call sleeps 0.05-0.4 s after logging its execution); the hand "
            "is SIGKILLed once or twice, after a random delay or in the middle of its n-th "
            "call, and restarted on the same port after 0.05-0.5 s or 1-6 s; one worker "
            "(not faulted) finishes the runs"
        ),
    ),
    (
        "`relay_replace`",
        "SQLite, PostgreSQL",
        (
            "two threads exchange outbox messages (one every 0.4 s) while the elected relay, "
            "a `wakeful relay` process with its default claim ttl, is SIGKILLed 3-6 times, "
            "each time 0.1-0.6 s after it delivered, and a replacement started at once; "
            "nothing else delivers: every message must arrive once, and the delivery lag's "
            "p99 stay below the documented bound (ttl + 2 s)"
        ),
    ),
    (
        "`nats_freeze`",
        "SQLite",
        (
            "two workers that wake only through a private `nats-server` (their polling floor "
            "is 20 s) run agent threads; the server is SIGSTOPped for 3-10 s or SIGKILLed and "
            "restarted after 1-5 s; every submit and message sent with the wake must return "
            "within the notify bound, and probe messages sent 5 s after the server is back "
            "must run within 3 s"
        ),
    ),
)
"""(kind, stores, what a trial does)"""

FINDINGS = """### Found and fixed: a second terminal event after an exhausted redelivery

Invariant 2, every store, worker trials in which a dispatch has a budget of one attempt
(seeds 39978448, 73532906, 73532909, 56755691, 57875711 and 57875714 of earlier runs; the
seeds replay the fault plan, not necessarily the interleaving that hit it). `Worker._execute`
handled `lease.exhausted` before it looked at whether the dispatch's run had already ended.
When a worker died after its run's terminal commit but before the settle, and the
redelivery was past `max_attempts`, the new claimant committed `run.indeterminate` for a run
that was already `completed` (the event stream then held two terminal events), or a second
`run.indeterminate` when the dead worker had itself been the exhausted claimant. Fixed in
0406d84 (a redelivery whose run ended is settled from the thread before the budget is looked
at; the exhausted event is idempotent by dispatch). In-process regression tests:
`tests/chaos/test_findings.py`.
"""

STATIC = """
Each trial runs in its own directory (and its own PostgreSQL database, cloned from a
migrated template) with fresh child processes; children report through fsynced JSON-lines
ledgers (`acks-*`, `effects-*`, `faults.jsonl`) and the parent checks after every process
is gone, by reading the store and those ledgers. Waiting is polling with deadlines; random
delays are only the moments at which faults strike.
"""

LIMITS = """## Limits and what is not covered

- **SIGSTOP on SQLite can stall everyone.** A worker stopped inside a write transaction (its
  writer thread was committing when the signal came) keeps the database's write lock: no
  other process can write until it is continued. That is liveness, not safety (the woken
  worker is then fenced like any other), and it is inherent to SQLite's single writer.
  Opening a SQLite store takes the write lock too (for its migration check), so a worker
  started meanwhile fails to open with `StoreUnavailable` after `busy_timeout` (5 s). The
  trials detect the stall (`BEGIN IMMEDIATE` fails while the successors are stuck or gone),
  wake the worker, replace the workers that could not open, and count it apart; safety is
  still checked. PostgreSQL has no such stall: a statement runs to its end on the server
  whatever happens to the client.
- The file store is one process at a time, so it has no SIGSTOP or concurrent-relay trials;
  its crash points are the store's own `crash_at` hooks plus SIGKILL.
- Power loss is not simulated (the kernel keeps what a killed process wrote); torn and
  corrupt logs stand in for what a power loss or a bad disk leaves.
- PostgreSQL restarts are few (each takes seconds and disturbs every other client of the
  server); backend kills mid-commit are covered by `tests/test_postgres_faults.py`.
- The HTTP server is not in the matrix. NATS wakes are (`nats_freeze`, a private server per
  trial); a PostgreSQL wake or LISTEN connection whose server freezes is covered by
  `tests/test_fleet_wake_faults.py` (through a TCP proxy: the shared server is never
  frozen), not by the matrix. The remote hand is (`hand_kill`), with the hand killed; a
  worker killed mid-call through the hand is covered by `tests/test_fleet_integration.py`,
  not by the matrix.
- Edge guarantees are tested outside the matrix. **Tenant binding:** the store fixes a
  thread's tenant with the first write naming one, atomically (decision 0016-tenant-binding);
  the conformance suite races first writes of two tenants through four handles on the same
  storage, and `tests/test_server_tenant_race.py` races two tenants' submits to 15 new
  threads through a real server and worker on SQLite and PostgreSQL (one `202`, one `404`,
  nothing of the loser stored). **The file log chain:** every record names its position and
  the hash of the one before it, so a lost, repeated, reordered or foreign record is
  `CorruptStore` with the files unchanged, and only a torn final write is cut, its bytes kept
  beside the log (decision 0016-file-log-chain; `tests/test_file_store_damage.py` tries every
  deletion, duplication, swap, zero-fill and cut of random logs). **Values:** NaN, Infinity
  and JSON nested deeper than 64 levels are refused at every boundary, so nothing stored can
  fail to read back (decision 0016-refuse-values-and-route-by-target).

## Running it

- In the test suite: `tests/chaos/test_chaos.py` (marked `slow`, PostgreSQL cells also
  `postgres`) runs `CHAOS_TRIALS` trials per cell, 1 by default.
- The full matrix: `make chaos` runs
  `CHAOS_TRIALS=40 CHAOS_JOBS=2 .venv/bin/python -m tests.chaos --report docs/reliability.md`
  and rewrites this page; it exits non-zero on any violation and prints, for each failing
  trial, its violations, its replay command and the directory it left behind.
- Environment: `CHAOS_TRIALS` (trials per cell; torn and corrupt logs run 4x as many,
  PostgreSQL restarts at most `CHAOS_PG_RESTARTS`, default 3), `CHAOS_SEED` (replay),
  `CHAOS_ONLY` (`kind` or `kind/store`, comma-separated), `CHAOS_JOBS` (trials at once).
"""
