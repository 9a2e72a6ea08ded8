"""The PostgreSQL plans of the hot read and claim paths at a given size (issue 27), as
docs/postgres-store.md shows them.

Run ``python -m benchmarks.scale_plans [--size 1000000] [--max-events N] [--dsn URL]``.

Builds the ``benchmarks.scale_paths`` data set of ``--size`` committed threads in a scratch
database (set-based inserts, autovacuum off), then runs each hot path as the store runs it
(the schema's functions, the read statements of ``wakeful.store.postgres.threads``) under
``auto_explain`` with nested statements, once without statistics and once after
``VACUUM ANALYZE``, and prints every plan with costs and times removed (``actual rows`` and
``Buffers`` kept: the work a path does). Says whether the two states planned alike. The
database is dropped at the end. Not part of ``make bench``: it times nothing.
"""

from __future__ import annotations

import argparse
import re
import sys
import time

import psycopg

from benchmarks.common import DEFAULT_DSN, Database
from benchmarks.scale_data import BIG, QUIET
from benchmarks.scale_paths import analyze_postgres, build_postgres, shape_for
from wakeful.store.postgres.branches import _HISTORY, _PLAIN
from wakeful.store.postgres.threads import _EVENTS, _READ

S = '"wakeful"'


Probe = tuple[str, tuple[object, ...] | dict[str, object]]


def calls(size: int, events: int, messages: int) -> dict[str, Probe]:
    """The hot paths: (statement, parameters) each, as the store sends them."""
    middle = f"t{size // 2:08d}"
    return {
        "read": (_READ.replace("@schema@", S), (middle,)),
        "events tail": (
            _EVENTS.replace("@schema@", S),
            {"thread": BIG, "after": events - 100, "limit": 100},
        ),
        "messages tail": (
            _PLAIN.replace("@schema@", S),
            {"thread": BIG, "first": messages - 100, "count": 100},
        ),
        "history page, middle": (
            _HISTORY.replace("@schema@", S),
            {"thread": BIG, "below": 50, "limit": 50},
        ),
        "claim_next": (f"SELECT dispatch_id FROM {S}.claim_next('probe', 30, 1)", ()),
        "thread page, operator": (f"SELECT 1 FROM {S}.list_threads(NULL, NULL, 100)", ()),
        "thread page, tenant": (f"SELECT 1 FROM {S}.list_threads('tenant-3', NULL, 100)", ()),
        "pending page, operator": (
            f"SELECT 1 FROM {S}.list_dispatches(0, 'pending', NULL, NULL, 100)",
            (),
        ),
        "dispatch page, quiet tenant": (
            f"SELECT 1 FROM {S}.list_dispatches(0, NULL, NULL, '{QUIET}', 100)",
            (),
        ),
        "dispatch page, busy tenant": (
            f"SELECT 1 FROM {S}.list_dispatches(0, NULL, NULL, 'tenant-3', 100)",
            (),
        ),
        "a tenant's pending page": (
            f"SELECT 1 FROM {S}.list_dispatches(0, 'pending', NULL, 'tenant-3', 100)",
            (),
        ),
        "one thread's done dispatches": (
            f"SELECT 1 FROM {S}.list_dispatches(0, 'done', '{middle}', NULL, 100)",
            (),
        ),
        "queue_depths (metrics scrape)": (f"SELECT 1 FROM {S}.queue_depths(10000)", ()),
    }


_COSTS = re.compile(r"  \(cost=[^)]*\)| \(actual time=[\d.]+\.\.[\d.]+")
_PARAM = re.compile(r"'\d{4}-\d\d-\d\d [\d:.+]+'::timestamp with time zone")


def clean(plan: str) -> str:
    """A plan without costs, times or the clock's value (so two runs compare)."""
    lines: list[str] = []
    for line in plan.splitlines():
        # auto_explain's header and query text come before the top node, the first line
        # with actual rows
        if (not lines and "(actual" not in line) or not line.strip():
            continue
        line = _COSTS.sub(lambda m: "" if "cost" in m.group(0) else " (actual", line)
        lines.append(_PARAM.sub("now", line))
    return "\n".join(lines)


def plans(dsn: str, probes: dict[str, Probe]) -> dict[str, str]:
    """Every plan auto_explain reports while each probe runs (each rolled back), innermost
    statements first; the outer call of a function is dropped."""
    out: dict[str, str] = {}
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("LOAD 'auto_explain'")
        for setting in (
            "auto_explain.log_min_duration = 0",
            "auto_explain.log_analyze = on",
            "auto_explain.log_buffers = on",
            "auto_explain.log_timing = off",
            "auto_explain.log_nested_statements = on",
            "auto_explain.log_level = notice",
            "client_min_messages = notice",
        ):
            conn.execute(f"SET {setting}")
        for name, (query, params) in probes.items():
            notes: list[str] = []

            def note(diagnostic: psycopg.errors.Diagnostic, notes: list[str] = notes) -> None:
                notes.append(diagnostic.message_primary or "")

            conn.add_notice_handler(note)
            for _ in range(2):  # the first call warms caches and sets hint bits
                notes.clear()
                with conn.transaction(force_rollback=True):
                    conn.execute(query, params or None)
            conn._notice_handlers.clear()
            # the caller's own statement, when it calls a function, is a function scan
            outer = [n for n in notes if f"Query Text: {query}" in n and "Function Scan" in n]
            found = [clean(n) for n in notes if n not in outer]
            out[name] = "\n".join(p for p in found if p)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.scale_plans")
    parser.add_argument("--dsn", default=DEFAULT_DSN, help="server (admin DSN)")
    parser.add_argument("--size", type=int, default=1_000_000, help="committed threads")
    parser.add_argument("--max-events", type=int, default=10_000_000, help="big thread cap")
    args = parser.parse_args(argv if argv is not None else [])
    shape = shape_for(args.size, args.max_events)
    db = Database(args.dsn, f"wakeful_plans_{args.size}")
    try:
        started = time.perf_counter()
        dsn = build_postgres(db, shape)
        print(f"-- built {shape} in {time.perf_counter() - started:.0f} s", flush=True)
        probes = calls(args.size, shape.events, shape.messages)
        before = plans(dsn, probes)
        analyze_postgres(dsn)
        after = plans(dsn, probes)
    finally:
        db.drop()
    for name, plan in after.items():
        same = "the same without statistics" if plan == before[name] else "DIFFERS"
        print(f"\n-- {name} (after VACUUM ANALYZE; {same})\n{plan}")
        if plan != before[name]:
            print(f"-- {name}, without statistics:\n{before[name]}")


if __name__ == "__main__":
    main(sys.argv[1:])
