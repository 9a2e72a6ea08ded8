"""Where issue 40's claim spends the server's time in a no-op drain (decision 0035, "Measured
on a quiet machine": the ~8 % after issue 36).

Run ``python -m benchmarks.claim_sources [--n 4000] [--batch 10] [--rounds 5] [--dsn URL]``.

One fresh database at the current schema. Beside the shipped ``claim_next_read`` it
creates, from the shipped function's own text (``pg_get_functiondef``), three variants in
the same schema: ``nopin`` without the candidate source pinned to the claimer's version,
``noset`` without the pin a lease writes, ``neither`` (close to the claim before issue
40: two sources, no pin), and ``gated``: decision 0035's proposal, a wrapper that probes
for work pinned to the claimer's version and calls ``nopin`` when there is none (the
wrapper's own call is counted: the proposal inside the function would cost less).
``--n`` start dispatches are enqueued (a fresh thread each, as
the no-op drain), then drained in phases of ``--n / (4 * rounds)`` dispatches, each phase
through one claim function (``--batch`` per call, then a ``settle`` of each lease as
``Done``, all in SQL), the phases cycling through the four functions ``--rounds`` times so
that the machine's load falls on each alike. Measured per phase, with
``track_functions = 'pl'`` in the drain's session: the claim function's and ``settle``'s
server time per dispatch (``pg_stat_user_functions``, so neither the client nor the
network counts); reported as the median over the rounds per function. Nothing is timed
but server time; the result is a comparison of the variants, on the same data, in the
same run.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import uuid
from typing import Any

import psycopg

from benchmarks.common import DEFAULT_DSN, Database
from wakeful import open_store
from wakeful.records import Dispatch

VERSION = "bench-v1"
SCHEMA = "wakeful"
PINNED_CTE = """    ), pinned AS MATERIALIZED (
        SELECT x.dispatch_id, x.thread_id, x.priority, x.seq, x.status, x.available_at,
               x.tenant
          FROM @s.dispatches x
         WHERE x.status = 'pending' AND x.pinned_version = p_version
           AND x.available_at <= n
           AND NOT coalesce((SELECT y.claim_token IS NOT NULL AND y.claim_expires >= n
                               FROM @s.threads y WHERE y.thread_id = x.thread_id), false)
         ORDER BY x.pinned_version, x.priority DESC, x.seq
         LIMIT p_limit
           FOR UPDATE OF x SKIP LOCKED
"""


def variant(text: str, name: str, pinned: bool, pin_set: bool) -> str:
    """The shipped function's definition renamed to ``name``, without the pinned source
    (``pinned=False``) and/or without the pin a lease writes (``pin_set=False``)."""
    out = text.replace(f"{SCHEMA}.claim_next_read(", f"{SCHEMA}.{name}(", 1)
    if not pinned:
        cte = PINNED_CTE.replace("@s", f'"{SCHEMA}"')
        assert cte in out, "the pinned source is not as this benchmark knows it"
        out = out.replace(cte, "")
        out = out.replace("UNION ALL SELECT * FROM pinned", "")
        out = out.replace("(SELECT count(*) FROM pinned)", "0::bigint")
    if not pin_set:
        for indent in ("                   ", "               "):
            pin = f",\n{indent}pinned_version = CASE WHEN x.kind = 'cancel' THEN x.pinned_version\n"
            start = out.find(pin)
            while start != -1:
                end = out.index("END", start) + len("END")
                out = out[:start] + out[end:]
                start = out.find(pin)
    return out


VARIANTS = {
    "shipped": (True, True),
    "nopin": (False, True),
    "noset": (True, False),
    "neither": (False, False),
    "gated": (True, True),
}

GATED = """
CREATE FUNCTION {s}.claim_gated(p_holder text, p_ttl double precision, p_limit integer,
                                p_version text, p_starts boolean)
RETURNS SETOF {s}.claim_next_read_result
LANGUAGE plpgsql AS $fn$
BEGIN
    -- the proposal of decision 0035 (issue 40 finished): the pinned source only when the
    -- claimer's version has pinned work, one probe of dispatches_pinned and one of the lapsed
    IF EXISTS (SELECT FROM {s}.dispatches x
                WHERE x.status = 'pending' AND x.pinned_version = p_version)
       OR EXISTS (SELECT FROM {s}.dispatches x
                   WHERE x.status = 'leased' AND x.lease_expires < {s}.store_now()
                     AND x.pinned_version = p_version) THEN
        RETURN QUERY SELECT * FROM {s}.claim_next_read(p_holder, p_ttl, p_limit, p_version,
                                                       p_starts);
    ELSE
        RETURN QUERY SELECT * FROM {s}.claim_nopin(p_holder, p_ttl, p_limit, p_version,
                                                   p_starts);
    END IF;
END
$fn$
"""
RESULT_TYPE = """
CREATE TYPE {s}.claim_next_read_result AS (
    o_dispatch {s}.dispatches, o_version bigint, o_tenant text, o_message_count bigint,
    o_next_seq bigint, o_event_floor bigint, o_checkpoint text, o_writes text[])
"""


async def drain_phase(
    conn: psycopg.AsyncConnection[Any], function: str, count: int, batch: int
) -> int:
    """Claim and settle up to ``count`` dispatches through ``function``; how many."""
    done = 0
    while done < count:
        cur = await conn.execute(
            f"SELECT (r.o_dispatch).dispatch_id, (r.o_dispatch).token "
            f"FROM {SCHEMA}.{function}(%s, %s, %s, %s, true) r",
            ("bench-holder", 30.0, min(batch, count - done), VERSION),
        )
        leased = await cur.fetchall()
        if not leased:
            break
        for dispatch_id, token in leased:
            await conn.execute(
                f"SELECT 1 FROM {SCHEMA}.settle(%s, %s, 'done', 0, NULL)", (dispatch_id, token)
            )
        done += len(leased)
    return done


async def function_times(conn: psycopg.AsyncConnection[Any]) -> dict[str, tuple[int, float]]:
    await conn.execute("SELECT pg_stat_force_next_flush()")
    await conn.execute("SELECT pg_stat_clear_snapshot()")
    cur = await conn.execute(
        "SELECT funcname, calls, total_time FROM pg_stat_user_functions WHERE schemaname = %s",
        (SCHEMA,),
    )
    return {name: (calls, total) for name, calls, total in await cur.fetchall()}


async def measure(dsn: str, n: int, batch: int, rounds: int) -> dict[str, dict[str, float]]:
    async with await open_store(dsn) as store:
        await store.register_worker("bench-worker", version=VERSION)
        for i in range(n):
            await store.enqueue(
                Dispatch(dispatch_id=f"d{i:06}", thread_id=f"t{i:06}", kind="start")
            )
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        cur = await conn.execute(
            "SELECT pg_get_functiondef(p.oid) FROM pg_proc p JOIN pg_namespace s "
            "ON s.oid = p.pronamespace WHERE s.nspname = %s AND p.proname = 'claim_next_read' "
            "AND p.pronargs = 5",
            (SCHEMA,),
        )
        (shipped,) = await cur.fetchone() or ("",)
        for name, (pinned, pin_set) in VARIANTS.items():
            if name not in ("shipped", "gated"):
                await conn.execute(variant(shipped, f"claim_{name}", pinned, pin_set))
        await conn.execute(RESULT_TYPE.replace("{s}", SCHEMA))
        await conn.execute(GATED.replace("{s}", SCHEMA))
        await conn.execute("SET track_functions = 'pl'")
        per_phase = max(n // (len(VARIANTS) * rounds), batch)
        samples: dict[str, dict[str, list[float]]] = {
            v: {"claim": [], "settle": []} for v in VARIANTS
        }
        names = list(VARIANTS)
        for name in names:  # warm up: each function planned and cached once, uncounted
            function = "claim_next_read" if name == "shipped" else f"claim_{name}"
            await drain_phase(conn, function, batch, batch)
        for r in range(rounds):
            for name in names[r % len(names) :] + names[: r % len(names)]:  # rotated
                function = "claim_next_read" if name == "shipped" else f"claim_{name}"
                before = await function_times(conn)
                done = await drain_phase(conn, function, per_phase, batch)
                after = await function_times(conn)
                if done == 0:
                    continue
                for part, fn in (("claim", function), ("settle", "settle")):
                    spent = after.get(fn, (0, 0.0))[1] - before.get(fn, (0, 0.0))[1]
                    samples[name][part].append(1000.0 * spent / done)  # us per dispatch
        return {
            name: {part: statistics.median(values) for part, values in parts.items() if values}
            for name, parts in samples.items()
        }


async def main(args: argparse.Namespace) -> None:
    db = Database(args.dsn, f"wk_claims_{uuid.uuid4().hex[:8]}").create()
    try:
        results = await measure(db.dsn, args.n, args.batch, args.rounds)
    finally:
        db.drop()
    print(f"server time per dispatch, us (median of {args.rounds} phases each)")
    print(f"{'claim function':<16}{'claim':>10}{'settle':>10}")
    for variant_name, parts in results.items():
        print(
            f"{variant_name:<16}{parts.get('claim', 0.0):>10.1f}{parts.get('settle', 0.0):>10.1f}"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m benchmarks.claim_sources")
    parser.add_argument("--n", type=int, default=4000)
    parser.add_argument("--batch", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--dsn", default=DEFAULT_DSN)
    asyncio.run(main(parser.parse_args()))
