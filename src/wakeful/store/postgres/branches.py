"""Branches on PostgreSQL (migration 0013): the transaction of a branching commit and the
reads that see a thread's history through its branches (``store/branching.py`` maps views).

A branching commit (``Commit.branch_from``) is the schema's ``commit()`` (or
``claim_and_commit()``) called inside a transaction that first locks the thread row and
reads its latest checkpoint: the call names that latest as the new checkpoint's parent, so
the function's own checks (token first, the receipt, the expected version, the rest) run
unchanged, while the checkpoint it stores keeps its real parent, the fork point. With the
row still locked, the branch's own checks follow (the fork point is in the history, the
kept message count fits its view) and the branch row and the thread's head are written; a
refusal rolls the whole transaction back. Only branching commits pay for this; every other
commit keeps its one call (and its group commit).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from wakeful.errors import InvalidCommit
from wakeful.records import Branch, CheckpointEntry, Message
from wakeful.store.branching import branch_of, page_ranges, view_length, view_segments
from wakeful.store.postgres import codec
from wakeful.store.postgres.connection import Conn, Database, bound_idle, utc

_LOCK = """
SELECT latest_checkpoint, message_count FROM @schema@.threads
 WHERE thread_id = %(thread)s FOR UPDATE
"""
_BRANCHES = """
SELECT number, parent, fork_point, old_head, checkpoint_id, messages, message_start,
       first_version, at
  FROM @schema@.branches WHERE thread_id = %(thread)s ORDER BY number
"""
_FORK = """
SELECT version FROM @schema@.checkpoints
 WHERE thread_id = %(thread)s AND checkpoint_id = %(fork)s
"""
_RECORD = """
INSERT INTO @schema@.branches (thread_id, number, parent, fork_point, old_head, checkpoint_id,
                               messages, message_start, first_version, at)
VALUES (%(thread)s, %(number)s, %(parent)s, %(fork)s, %(old)s, %(first)s, %(kept)s,
        %(start)s, %(version)s, @schema@.store_now())
"""
_HEAD = """
UPDATE @schema@.threads SET branch = %(number)s, message_offset = %(kept)s - %(start)s
 WHERE thread_id = %(thread)s
"""
_RANGE = """
SELECT body FROM @schema@.messages WHERE thread_id = %(thread)s AND pos >= %(first)s
 ORDER BY pos LIMIT %(count)s
"""
# The head's view of a thread that never branched, in one statement (one snapshot, one round
# trip: what every read of a conversation costs without time travel); ``branched`` tells the
# caller to read through the branches instead.
_PLAIN = """
SELECT b.branched, m.body
  FROM (SELECT EXISTS (SELECT 1 FROM @schema@.branches WHERE thread_id = %(thread)s)
               AS branched) b
  LEFT JOIN LATERAL (
       SELECT body, pos FROM @schema@.messages
        WHERE thread_id = %(thread)s AND pos >= %(first)s AND NOT b.branched
        ORDER BY pos LIMIT %(count)s) m ON true
 ORDER BY m.pos
"""
# Through a function that leaves the planner only the backward primary-key range (0013).
_HISTORY = """
SELECT o_body, o_at, o_version FROM @schema@.checkpoint_page(%(thread)s, %(below)s, %(limit)s)
"""
_VERSION_OF = """
SELECT version FROM @schema@.checkpoints
 WHERE thread_id = %(thread)s AND checkpoint_id = %(before)s
"""
_ONE = """
SELECT body, at, version FROM @schema@.checkpoints
 WHERE thread_id = %(thread)s AND checkpoint_id = %(id)s
"""


class Branching:
    """The branch half of ``PostgresStore``'s threads (``ThreadOps`` uses it)."""

    def __init__(self, db: Database) -> None:
        self._db = db

    async def _load(self, conn: Conn, thread_id: str) -> tuple[list[Branch], list[int]]:
        rows = await (await conn.execute(self._db.sql(_BRANCHES), {"thread": thread_id})).fetchall()
        records = [
            Branch(
                number=number,
                parent=parent,
                fork_point=fork,
                old_head=old,
                checkpoint_id=first,
                messages=kept,
                message_start=start,
                at=utc(at),
            )
            for number, parent, fork, old, first, kept, start, _, at in rows
        ]
        return records, [int(row[7]) for row in rows]

    async def commit(
        self,
        conn: Conn,
        thread_id: str,
        query: str,
        params: tuple[object, ...],
        parent_at: int,
        fork: str,
        kept: int,
        checkpoint_id: str,
    ) -> Any:
        """Inside the caller's transaction: the commit function call of a branching commit
        (``params[parent_at]`` is replaced by the thread's latest checkpoint), then the
        branch's checks and rows. Returns the function's row."""
        names: dict[str, Any] = {"thread": thread_id}
        locked = await (await conn.execute(self._db.sql(_LOCK), names)).fetchone()
        latest, stored = (None, 0) if locked is None else (locked[0], int(locked[1]))
        called = (*params[:parent_at], latest, *params[parent_at + 1 :])
        row = await (await conn.execute(query, called)).fetchone()
        assert row is not None
        replayed, version = row[-5], row[-4]
        if replayed:
            return row
        names["fork"] = fork
        found = await (await conn.execute(self._db.sql(_FORK), names)).fetchone()
        if found is None:
            raise InvalidCommit(
                thread_id,
                f"branch_from names checkpoint {fork!r}, which is not in the thread's "
                "history (never committed, dropped or pruned)",
            )
        records, firsts = await self._load(conn, thread_id)
        parent = branch_of(firsts, int(found[0]))
        shown = view_length(view_segments(records, parent), stored)
        if kept > shown:
            raise InvalidCommit(
                thread_id,
                f"branch_messages {kept} is more than the {shown} messages of the fork "
                "point's branch",
            )
        names.update(
            number=len(records) + 1,
            parent=parent,
            old=latest,
            first=checkpoint_id,
            kept=kept,
            start=stored,
            version=version,
        )
        await conn.execute(self._db.sql(_RECORD), names)
        await conn.execute(self._db.sql(_HEAD), names)
        return row

    # ------------------------------------------------------------ reads

    async def _snapshot_read(self, conn: Conn) -> None:
        """Make the transaction read one snapshot (several statements, one state), bounded
        like every transaction of several round trips (decision 0031): it holds no row lock,
        but a paused reader would hold back vacuum for as long as its snapshot lived."""
        await conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        await bound_idle(conn, self._db.idle_timeout)

    async def branches(self, thread_id: str) -> list[Branch]:
        async def op(conn: Conn) -> list[Branch]:
            return (await self._load(conn, thread_id))[0]

        return await self._db.run(op, idempotent=True)

    async def view(
        self, thread_id: str, branch: int | None, after: int, limit: int
    ) -> list[Message]:
        """A page of branch ``branch``'s message view (``None``: the head's)."""
        if not branch:
            names = {"thread": thread_id, "first": after, "count": limit}
            rows = await self._db.fetchall(_PLAIN, names, idempotent=True)
            if not rows or not rows[0][0]:
                return [codec.MESSAGE.decode(body) for _, body in rows if body is not None]
        rng = self._db.sql(_RANGE)

        async def op(conn: Conn) -> list[Message]:
            async with conn.transaction():
                await self._snapshot_read(conn)
                records, _ = await self._load(conn, thread_id)
                if not records and not branch:
                    ranges: Sequence[tuple[int, int | None]] = [(after, limit)]
                else:
                    number = len(records) if branch is None else branch
                    ranges = page_ranges(view_segments(records, number), after, limit)
                found: list[Message] = []
                for first, count in ranges:
                    names = {"thread": thread_id, "first": first, "count": count}
                    rows = await (await conn.execute(rng, names)).fetchall()
                    found += [codec.MESSAGE.decode(body) for (body,) in rows]
                return found

        return await self._db.run(op, idempotent=True)

    async def history(
        self, thread_id: str, before: str | None, limit: int
    ) -> list[CheckpointEntry]:
        async def op(conn: Conn) -> list[CheckpointEntry]:
            async with conn.transaction():
                await self._snapshot_read(conn)
                below = 2**62
                if before is not None:
                    names = {"thread": thread_id, "before": before}
                    row = await (await conn.execute(self._db.sql(_VERSION_OF), names)).fetchone()
                    if row is None:
                        return []
                    below = int(row[0])
                names2 = {"thread": thread_id, "below": below, "limit": limit}
                rows = await (await conn.execute(self._db.sql(_HISTORY), names2)).fetchall()
                if not rows:
                    return []
                _, firsts = await self._load(conn, thread_id)
                return [_entry(firsts, row) for row in rows]

        return await self._db.run(op, idempotent=True)

    async def get(self, thread_id: str, checkpoint_id: str) -> CheckpointEntry | None:
        async def op(conn: Conn) -> CheckpointEntry | None:
            async with conn.transaction():
                await self._snapshot_read(conn)
                names = {"thread": thread_id, "id": checkpoint_id}
                row = await (await conn.execute(self._db.sql(_ONE), names)).fetchone()
                if row is None:
                    return None
                _, firsts = await self._load(conn, thread_id)
                return _entry(firsts, row)

        return await self._db.run(op, idempotent=True)


def _entry(firsts: list[int], row: Any) -> CheckpointEntry:
    body, at, version = row
    return CheckpointEntry(
        checkpoint=codec.CHECKPOINT.decode(body),
        committed_at=utc(at),
        branch=branch_of(firsts, int(version)),
        order=int(version),
    )
