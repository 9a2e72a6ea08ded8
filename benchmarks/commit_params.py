"""Client CPU to build and dump the parameters of one ``commit_many`` call (PostgreSQL).

Run ``python -m benchmarks.commit_params [--commits 10] [--rounds 7]``. Ten commits shaped
like a no-op dispatch's final commit (a checkpoint, two events, a settle, an operation id)
are encoded once; then, timed by ``time.thread_time`` over 500 calls per round, (1)
``_commit_params`` for each plus ``batch_params`` plus psycopg's binary dump of the result
(what ``GroupCommit`` does per batch before the round trip), (2) ``batch_params`` and the
dump alone, (3) one commit's ``commit()`` parameters and their dump. No server is needed.
To compare two versions of the source, alternate runs with ``PYTHONPATH=<checkout>/src``.
Decision 0022, sixth round.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from datetime import UTC, datetime

from psycopg.adapt import PyFormat, Transformer

from wakeful.records import Checkpoint, Commit, Done, EventDraft, Settle
from wakeful.store.postgres.group import batch_params
from wakeful.store.postgres.threads import _commit_params
from wakeful.store.validate import encode_commit

CALLS = 500


def _commit(i: int) -> Commit:
    checkpoint = Checkpoint(
        id=f"cp-{i}",
        parent=None,
        run_id=f"run-{i}",
        status="completed",
        state={"n": i},
        created_at=datetime.now(UTC),
    )
    return Commit(
        token=3,
        checkpoint=checkpoint,
        events=(EventDraft(type="run.started"), EventDraft(type="run.finished")),
        operation_id=f"op-{i}",
        settle=Settle(dispatch_id=f"d{i}", outcome=Done()),
    )


def _timed(name: str, call: Callable[[], object], rounds: int) -> None:
    per_call = []
    for _ in range(rounds):
        start = time.thread_time()
        for _ in range(CALLS):
            call()
        per_call.append((time.thread_time() - start) / CALLS * 1e6)
    print(f"{name}: best {min(per_call):.1f} µs, median {statistics.median(per_call):.1f} µs")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--commits", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    encoded = [encode_commit(f"t{i}", _commit(i)) for i in range(args.commits)]
    rows = [(f"t{i}", 3, *_commit_params(e)) for i, e in enumerate(encoded)]
    dumper = Transformer()

    def dump(params: list[object] | tuple[object, ...]) -> None:
        dumper.dump_sequence(params, [PyFormat.BINARY] * len(params))

    def whole() -> None:
        dump(batch_params([(f"t{i}", 3, *_commit_params(e)) for i, e in enumerate(encoded)]))

    def single() -> None:
        dump(("t0", 3, *_commit_params(encoded[0])))

    _timed(f"commit_many, {args.commits} commits: parameters + batch + dump", whole, args.rounds)
    _timed(
        f"commit_many, {args.commits} commits: batch + dump",
        lambda: dump(batch_params(rows)),
        args.rounds,
    )
    _timed("commit(), 1 commit: parameters + dump", single, args.rounds)


if __name__ == "__main__":
    main()
