"""Threads on PostgreSQL: claims, fenced commits, reads and maintenance (DESIGN §3.1-§3.2).

Each write is one call of a schema function (see ``sql/postgres/``) that locks the thread
row with ``SELECT ... FOR UPDATE`` and does every check of the contract, in the contract's
order, inside the same transaction; writes by an owner carry its token in their ``WHERE``.
A folded write (``Commit.release``, ``Commit.settle``, ``claim_and_commit``) is still one
call. Reads are single statements, so each sees one consistent snapshot.

Writes that waiters care about (a commit that added events, a deleted thread) are announced
after they returned, through the store's ``Notifier``: never inside the write's transaction.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from operator import attrgetter
from typing import Any, TypeVar

from wakeful.errors import InvalidCommit, ReplayUnavailable, StaleClaim, StoreUnavailable
from wakeful.ids import check_count, check_id, check_optional_id, check_seconds
from wakeful.records import (
    Branch,
    Checkpoint,
    CheckpointEntry,
    Claim,
    Commit,
    Event,
    Message,
    PruneReport,
    Receipt,
    RetentionPolicy,
    RunSegment,
    ThreadSnapshot,
    ThreadSummary,
)
from wakeful.store.postgres import codec
from wakeful.store.postgres.branches import Branching
from wakeful.store.postgres.codec import TextArray
from wakeful.store.postgres.connection import Conn, Database, big, no_nul, utc
from wakeful.store.postgres.group import GroupCommit
from wakeful.store.postgres.notify import Notifier
from wakeful.store.postgres.renewals import GroupRenew
from wakeful.store.segments import join_adjacent
from wakeful.store.validate import (
    EncodedCommit,
    check_outcome,
    check_policy,
    check_token,
    drop_refusal,
    encode_claim_and_commit,
    encode_commit,
    payload_hash,
)

T = TypeVar("T")

PRUNE_BATCH = 200
"""Threads per retention transaction: commits to them wait at most one batch."""

_CLAIM = "SELECT o_token, o_expires FROM @schema@.claim(%s, %s, %s, %s)"
_RELEASE = "SELECT @schema@.release(%s, %s)"
# Binary parameters (%b): text-format arrays of JSON cost an escape per quote character.
# The commit's own parameters, after the thread and the token (or holder and ttl).
_COMMIT_ARGS = """%b, %b, %b, %b, %b, %b, %b, %b,
       %b::text[], %b::text[], %b::text[], %b::text[], %b::text[], %b::text[],
       %b::text[], %b::text[], %b::text[], %b::text[], %b::text[],
       %b, %b, %b, %b::float8, %b"""
COMMIT = f"""
SELECT o_replayed, o_version, o_checkpoint, o_first_seq, o_event_count
  FROM @schema@.commit(%b, %b, {_COMMIT_ARGS})
"""
_CLAIM_AND_COMMIT = f"""
SELECT o_token, o_expires, o_replayed, o_version, o_checkpoint, o_first_seq, o_event_count
  FROM @schema@.claim_and_commit(%b, %b, %b::float8, {_COMMIT_ARGS})
"""
_READ = """
SELECT t.version, t.tenant, t.claim_holder, t.claim_token, t.claim_expires,
       t.message_count + t.message_offset, t.next_seq, t.event_floor, c.body,
       ARRAY(SELECT w.body FROM @schema@.writes w WHERE w.thread_id = t.thread_id
              ORDER BY w.version, w.idx), t.branch
  FROM @schema@.threads t
  LEFT JOIN @schema@.checkpoints c
    ON c.thread_id = t.thread_id AND c.checkpoint_id = t.latest_checkpoint
 WHERE t.thread_id = %s AND t.present
"""
# ``operation``, and the receipt a refused retry of an applied commit carries.
_OPERATION = """
SELECT payload_hash, version, checkpoint_id, first_seq, event_count
  FROM @schema@.receipts WHERE thread_id = %s AND operation_id = %s
"""
# One statement: the floor and the page come from the same snapshot.
_EVENTS = """
SELECT t.event_floor, e.seq, e.at, e.body
  FROM @schema@.threads t
  LEFT JOIN LATERAL (
       SELECT seq, at, body FROM @schema@.events
        WHERE thread_id = t.thread_id AND seq > %(after)s AND %(after)s >= t.event_floor - 1
        ORDER BY seq LIMIT %(limit)s) e ON true
 WHERE t.thread_id = %(thread)s AND t.present
 ORDER BY e.seq
"""
# Through a function that leaves the planner only index plans in page order (migration 0005).
_LIST = """
SELECT thread_id, tenant, version, latest_checkpoint, status, message_count + message_offset,
       next_seq - 1, updated_at
  FROM @schema@.list_threads(%s, %s, %s)
"""
_HISTORY = """
SELECT body, at FROM @schema@.checkpoints WHERE thread_id = %(thread)s {before}
 ORDER BY version DESC LIMIT %(limit)s
"""
_BEFORE = """
AND version < (SELECT version FROM @schema@.checkpoints
                WHERE thread_id = %(thread)s AND checkpoint_id = %(before)s)
"""
# ``runs``: up to %(count)s stretches below version %(below)s, newest first, each found from the
# one after it through the primary key (migration 0008): its latest row, then the oldest row
# kept from where it began.
_STRETCHES = """
WITH RECURSIVE walk(n, version, seg_first, checkpoint_id, at, run_id, status, graph, ordinal)
AS (
    SELECT 1, l.*
      FROM (SELECT version, seg_first, checkpoint_id, at, run_id, status, graph, ordinal
              FROM @schema@.checkpoints
             WHERE thread_id = %(thread)s AND version < %(below)s
             ORDER BY version DESC LIMIT 1) l
    UNION ALL
    SELECT w.n + 1, l.*
      FROM walk w
     CROSS JOIN LATERAL (SELECT version, seg_first, checkpoint_id, at, run_id, status, graph,
                                ordinal
                           FROM @schema@.checkpoints c
                          WHERE c.thread_id = %(thread)s AND c.version < w.seg_first
                          ORDER BY c.version DESC LIMIT 1) l
     WHERE w.n < %(count)s
)
SELECT w.n, w.checkpoint_id, w.at, w.run_id, w.status, w.graph, w.ordinal,
       f.version, f.checkpoint_id, f.at, f.ordinal
  FROM walk w
 CROSS JOIN LATERAL (SELECT version, checkpoint_id, at, ordinal FROM @schema@.checkpoints c
                      WHERE c.thread_id = %(thread)s AND c.version >= w.seg_first
                      ORDER BY c.version LIMIT 1) f
"""
_VERSION_OF = """
SELECT version FROM @schema@.checkpoints WHERE thread_id = %(thread)s AND checkpoint_id = %(before)s
"""
# ``Commit.drop_checkpoints``: run in the commit's transaction, after its function passed.
_PRESENT = """
SELECT checkpoint_id FROM @schema@.checkpoints
 WHERE thread_id = %(thread)s AND checkpoint_id = ANY(%(drop)s)
"""
_DROP = """
DELETE FROM @schema@.checkpoints WHERE thread_id = %(thread)s AND checkpoint_id = ANY(%(drop)s)
"""
_COMPACT = "SELECT @schema@.compact_events(%s, %s)"
_DELETE = "SELECT @schema@.delete_thread(%s)"
_PRUNE_THREADS = """
SELECT o_last, o_threads, o_checkpoints, o_events, o_receipts
  FROM @schema@.prune_threads(%s, %s, %s, %s, %s, %s, %s)
"""
_PRUNE_DISPATCHES = "SELECT @schema@.prune_dispatches(%s, %s)"


def _column(items: Sequence[T], part: Callable[[T], object]) -> TextArray | None:
    """One array parameter; ``None`` for none (dumping arrays is the costly part of a call)."""
    return TextArray([part(item) for item in items]) if items else None


def _texts(items: Sequence[object]) -> TextArray | None:
    return TextArray(items) if items else None


def _columns(items: Sequence[T], *parts: Callable[[T], object]) -> tuple[TextArray | None, ...]:
    return tuple(_column(items, part) for part in parts)


_TASK_ID, _CHECKPOINT_ID, _ID = attrgetter("task_id"), attrgetter("checkpoint_id"), attrgetter("id")
_OUTBOX_COLUMNS = (
    attrgetter("message_id"),
    attrgetter("target_thread"),
    attrgetter("correlation_id"),
)
_NO_OUTBOX: tuple[None, ...] = (None,) * (len(_OUTBOX_COLUMNS) + 1)


def _commit_params(encoded: EncodedCommit) -> tuple[object, ...]:
    """The parameters of a checked commit after its thread and token (``_COMMIT_ARGS``);
    the JSON bodies are cut from the commit's one encoding. A part the commit does not
    have is None, without a look at the encoding (a run's commits have few parts)."""
    commit = encoded.commit
    cp = commit.checkpoint
    writes, messages, outbox = commit.writes, commit.messages, commit.outbox
    status: str | None = None
    delay: float | None = None
    error: str | None = None
    if commit.settle is not None:
        status, delay, error = check_outcome(commit.settle.outcome)
        if error is not None:
            no_nul("retry error", error)
    return (
        commit.operation_id,
        # only a keyed operation is ever compared by its payload's hash
        payload_hash(commit) if commit.operation_id is not None else None,
        None if commit.expected_version is None else big(commit.expected_version),
        cp.id if cp else None,
        cp.parent if cp else None,
        cp.tenant if cp else None,
        cp.status if cp else None,
        encoded.checkpoint_text(),
        _column(writes, _TASK_ID),
        _column(writes, _CHECKPOINT_ID),
        _texts(encoded.write_texts()) if writes else None,
        _texts(encoded.event_texts()) if commit.events else None,
        _column(messages, _ID),
        _texts(encoded.message_texts()) if messages else None,
        *(
            (*_columns(outbox, *_OUTBOX_COLUMNS), _texts(encoded.outbox_payload_texts()))
            if outbox
            else _NO_OUTBOX
        ),
        _texts(commit.consume),
        commit.release,
        commit.settle.dispatch_id if commit.settle is not None else None,
        status,
        delay,
        error,
    )


_Branch = tuple[int, str, int, str]
"""A branching commit as ``Branching.commit`` takes it: where the checkpoint's parent is in
the call's parameters, the fork point, the kept message count and the new checkpoint id."""


def _branch_of(encoded: EncodedCommit, before: int) -> _Branch | None:
    """``_Branch`` of a checked commit whose call puts ``before`` parameters ahead of
    ``_commit_params`` (whose fifth is the checkpoint's parent)."""
    commit = encoded.commit
    if commit.branch_from is None:
        return None
    assert commit.checkpoint is not None
    return before + 4, commit.branch_from, commit.branch_messages, commit.checkpoint.id


def _receipt(
    thread_id: str,
    operation_id: str | None,
    version: int,
    checkpoint_id: str | None,
    first: int,
    count: int,
) -> Receipt:
    return Receipt(
        thread_id=thread_id,
        version=version,
        checkpoint_id=checkpoint_id,
        events=tuple(range(first, first + count)),
        operation_id=operation_id,
    )


class ThreadOps:
    """The thread half of ``PostgresStore``."""

    _db: Database
    _notifier: Notifier
    _group: GroupCommit
    _renewals: GroupRenew

    # ------------------------------------------------------------ claims

    async def claim(
        self, thread_id: str, holder: str, ttl: float, tenant: str | None = None
    ) -> Claim:
        check_id("thread_id", thread_id)
        check_id("holder", holder)
        ttl = check_seconds("ttl", ttl)
        check_optional_id("tenant", tenant)
        token, expires = await self._db.fetchone(_CLAIM, (thread_id, holder, ttl, tenant))
        return Claim(thread_id=thread_id, holder=holder, token=token, expires_at=utc(expires))

    async def renew(self, thread_id: str, token: int, ttl: float) -> Claim:
        check_id("thread_id", thread_id)
        check_token(token)
        ttl = check_seconds("ttl", ttl)
        return await self._renewals.renew(thread_id, token, ttl)  # grouped (renewals.py)

    async def release(self, thread_id: str, token: int) -> None:
        check_id("thread_id", thread_id)
        check_token(token)
        await self._db.fetchone(_RELEASE, (thread_id, big(token)))

    # ------------------------------------------------------------ commits

    async def commit(self, thread_id: str, commit: Commit) -> Receipt:
        encoded = encode_commit(thread_id, commit)
        params = (thread_id, big(encoded.commit.token), *_commit_params(encoded))
        # While the commit waits its turn (a thousand runs ending together queue theirs in
        # the group), only its parameters are held: not the checked copy and its JSON.
        operation_id, drops = encoded.commit.operation_id, encoded.commit.drop_checkpoints
        branch = _branch_of(encoded, 2)
        del encoded, commit
        try:
            replayed, version, checkpoint_id, first, count = await self._write(
                COMMIT, params, thread_id, drops, branch
            )
        except StaleClaim as exc:
            if operation_id is None:
                raise
            # params[3]: the payload hash (``_commit_params``)
            raise await self._stale_retry(exc, thread_id, operation_id, params[3]) from None
        if count and not replayed:
            self._notifier.notify(thread_id)
        return _receipt(thread_id, operation_id, version, checkpoint_id, first, count)

    async def claim_and_commit(
        self, thread_id: str, holder: str, ttl: float, commit: Commit
    ) -> tuple[Claim, Receipt]:
        # commit.token is ignored; the payload hash never covers the token
        ttl, encoded = encode_claim_and_commit(thread_id, holder, ttl, commit)
        params = (thread_id, holder, ttl, *_commit_params(encoded))
        operation_id, drops = encoded.commit.operation_id, encoded.commit.drop_checkpoints
        branch = _branch_of(encoded, 3)
        del encoded, commit
        row = await self._write(_CLAIM_AND_COMMIT, params, thread_id, drops, branch)
        token, expires, replayed, version, checkpoint_id, first, count = row
        if count and not replayed:
            self._notifier.notify(thread_id)
        claim = Claim(thread_id=thread_id, holder=holder, token=token, expires_at=utc(expires))
        return claim, _receipt(thread_id, operation_id, version, checkpoint_id, first, count)

    async def _stale_retry(
        self, exc: StaleClaim, thread_id: str, operation_id: str, digest: object
    ) -> StaleClaim:
        """``exc``, carrying the operation's receipt if the thread recorded it with this
        payload (``applied_receipt``). Read after the refusal, outside its transaction: a
        receipt is never changed once written, only removed (delete, prune), so what is found
        was applied. A failed read leaves the refusal as it was."""
        try:
            row = await self._db.fetchone(_OPERATION, (thread_id, operation_id), idempotent=True)
        except StoreUnavailable:
            return exc
        if row is None or row[0] != digest:
            return exc
        applied = _receipt(thread_id, operation_id, *row[1:])
        return StaleClaim(thread_id, exc.token, exc.current, applied)

    async def _write(
        self,
        template: str,
        params: tuple[object, ...],
        thread_id: str,
        drops: Sequence[str],
        branch: _Branch | None = None,
    ) -> Any:
        """One commit function call; with ``drop_checkpoints`` or ``branch_from``, in one
        transaction with the deletion of those checkpoints and the branch's own writes
        (``Branching.commit``; a refusal rolls everything back). That transaction takes
        a few round trips while it holds the thread's row lock, so it is bounded
        (``Database.transaction``): a client paused in it loses it after the store's
        ``idle_in_transaction_timeout``, and a claim waiting behind it goes through."""
        if not drops and branch is None:
            if template is COMMIT:
                return await self._group.commit(params)
            return await self._db.fetchone(template, params)
        query, present, delete = (self._db.sql(t) for t in (template, _PRESENT, _DROP))
        names = {"thread": thread_id, "drop": list(drops)}

        async def op(conn: Conn) -> Any:
            async with self._db.transaction(conn):
                if branch is None:
                    row = await (await conn.execute(query, params)).fetchone()
                else:
                    row = await Branching(self._db).commit(conn, thread_id, query, params, *branch)
                assert row is not None
                replayed, latest = row[-5], row[-3]
                if not replayed and drops:
                    found = {r[0] for r in await (await conn.execute(present, names)).fetchall()}
                    for dropped in drops:
                        if dropped == latest or dropped not in found:
                            raise InvalidCommit(thread_id, drop_refusal(dropped, latest))
                    await conn.execute(delete, names)
                return row

        return await self._db.run(op)

    # ------------------------------------------------------------ reads

    async def read(self, thread_id: str) -> ThreadSnapshot | None:
        check_id("thread_id", thread_id)
        row = await self._db.fetchone(_READ, (thread_id,), idempotent=True)
        if row is None:
            return None
        version, tenant, holder, token, expires, *rest = row
        return codec.snapshot(
            thread_id, codec.claim(thread_id, holder, token, expires), version, tenant, *rest
        )

    async def operation(self, thread_id: str, operation_id: str) -> Receipt | None:
        check_id("thread_id", thread_id)
        check_id("operation_id", operation_id)
        row = await self._db.fetchone(_OPERATION, (thread_id, operation_id), idempotent=True)
        return None if row is None else _receipt(thread_id, operation_id, *row[1:])

    async def messages(self, thread_id: str, after: int = 0, limit: int = 100) -> list[Message]:
        check_id("thread_id", thread_id)
        after = check_count("after", after, maximum=2**62)
        limit = check_count("limit", limit, minimum=1)
        return await Branching(self._db).view(thread_id, None, after, limit)

    async def branch_messages(
        self, thread_id: str, branch: int, after: int = 0, limit: int = 100
    ) -> list[Message]:
        check_id("thread_id", thread_id)
        branch = check_count("branch", branch, maximum=2**62)
        after = check_count("after", after, maximum=2**62)
        limit = check_count("limit", limit, minimum=1)
        return await Branching(self._db).view(thread_id, branch, after, limit)

    async def branches(self, thread_id: str) -> list[Branch]:
        check_id("thread_id", thread_id)
        return await Branching(self._db).branches(thread_id)

    async def history(
        self, thread_id: str, before: str | None = None, limit: int = 50
    ) -> list[CheckpointEntry]:
        check_id("thread_id", thread_id)
        check_optional_id("before", before)
        limit = check_count("limit", limit, minimum=1)
        return await Branching(self._db).history(thread_id, before, limit)

    async def get_checkpoint(self, thread_id: str, checkpoint_id: str) -> CheckpointEntry | None:
        check_id("thread_id", thread_id)
        check_id("checkpoint_id", checkpoint_id)
        return await Branching(self._db).get(thread_id, checkpoint_id)

    async def events_after(
        self, thread_id: str, after_seq: int = 0, limit: int = 100
    ) -> list[Event]:
        check_id("thread_id", thread_id)
        after_seq = check_count("after_seq", after_seq, maximum=2**62)
        limit = check_count("limit", limit, minimum=1)
        rows = await self._db.fetchall(
            _EVENTS, {"thread": thread_id, "after": after_seq, "limit": limit}, idempotent=True
        )
        if not rows:
            return []
        floor = rows[0][0]
        if after_seq < floor - 1:
            raise ReplayUnavailable(thread_id, after_seq, floor)
        return [
            codec.event(thread_id, seq, at, body) for _, seq, at, body in rows if seq is not None
        ]

    async def list_threads(
        self, tenant: str | None = None, after: str | None = None, limit: int = 100
    ) -> list[ThreadSummary]:
        check_optional_id("tenant", tenant)
        check_optional_id("after", after)
        limit = check_count("limit", limit, minimum=1)
        rows = await self._db.fetchall(_LIST, (tenant, after, limit), idempotent=True)
        return [
            ThreadSummary(
                thread_id=tid,
                tenant=owner,
                version=version,
                checkpoint_id=latest,
                status=status,
                message_count=count,
                last_seq=last,
                updated_at=utc(updated),
            )
            for tid, owner, version, latest, status, count, last, updated in rows
        ]

    async def checkpoints(
        self, thread_id: str, before: str | None = None, limit: int = 100
    ) -> list[tuple[Checkpoint, datetime]]:
        check_id("thread_id", thread_id)
        check_optional_id("before", before)
        limit = check_count("limit", limit, minimum=1)
        query = _HISTORY.format(before="" if before is None else _BEFORE)
        rows = await self._db.fetchall(
            query, {"thread": thread_id, "before": before, "limit": limit}, idempotent=True
        )
        return [(codec.CHECKPOINT.decode(body), utc(at)) for body, at in rows]

    async def runs(
        self, thread_id: str, before: str | None = None, limit: int = 20
    ) -> list[RunSegment]:
        check_id("thread_id", thread_id)
        check_optional_id("before", before)
        limit = check_count("limit", limit, minimum=1)
        below = 2**62
        if before is not None:
            row = await self._db.fetchone(
                _VERSION_OF, {"thread": thread_id, "before": before}, idempotent=True
            )
            if row is None:
                return []
            below = int(row[0])
        stretches: list[RunSegment] = []
        while True:
            # one more than a page: the last run of the page is whole only once a stretch of
            # another run id lies below it (stretches of one run id meet where what separated
            # them was removed; then another batch)
            rows = await self._db.fetchall(
                _STRETCHES,
                {"thread": thread_id, "below": below, "count": limit + 1},
                idempotent=True,
            )
            for row in sorted(rows):  # by n: the walk's order
                _, last_id, updated, run_id, status, graph, last_n = row[:7]
                first_v, first_id, started, first_n = row[7:]
                stretches.append(
                    RunSegment(
                        run_id=run_id,
                        status=status,
                        graph=graph,
                        first_id=first_id,
                        last_id=last_id,
                        started_at=utc(started),
                        updated_at=utc(updated),
                        checkpoints=last_n - first_n + 1,
                    )
                )
                below = first_v
            joined = join_adjacent(stretches)
            if len(rows) <= limit or len(joined) > limit:
                return joined[:limit]

    # ------------------------------------------------------------ maintenance

    async def compact_events(self, thread_id: str, before_seq: int) -> int:
        check_id("thread_id", thread_id)
        before_seq = check_count("before_seq", before_seq, maximum=2**62)
        (floor,) = await self._db.fetchone(_COMPACT, (thread_id, before_seq))
        return int(floor)

    async def delete_thread(self, thread_id: str) -> None:
        check_id("thread_id", thread_id)
        (deleted,) = await self._db.fetchone(_DELETE, (thread_id,))
        if deleted:
            self._notifier.notify(thread_id)

    async def prune(self, policy: RetentionPolicy) -> PruneReport:
        """Retention in bounded batches: one transaction per ``PRUNE_BATCH`` threads, then
        settled dispatches ``PRUNE_BATCH`` at a time. Safe while workers run; each batch is
        judged at its own transaction's time."""
        check_policy(policy)
        checkpoints = events = receipts = dispatches = 0
        thread_work = any(
            value is not None
            for value in (
                policy.checkpoint_max_age,
                policy.keep_checkpoints,
                policy.event_max_age,
                policy.keep_events,
                policy.receipt_max_age,
            )
        )
        after: str | None = None
        while thread_work:
            last, seen, cps, evs, rcs = await self._db.fetchone(
                _PRUNE_THREADS,
                (
                    after,
                    PRUNE_BATCH,
                    policy.checkpoint_max_age,
                    policy.keep_checkpoints,
                    policy.event_max_age,
                    policy.keep_events,
                    policy.receipt_max_age,
                ),
            )
            checkpoints, events, receipts = checkpoints + cps, events + evs, receipts + rcs
            if seen < PRUNE_BATCH:
                break
            after = last
        if policy.settled_dispatch_max_age is not None:
            while True:
                (dropped,) = await self._db.fetchone(
                    _PRUNE_DISPATCHES, (policy.settled_dispatch_max_age, PRUNE_BATCH)
                )
                dispatches += dropped
                if dropped < PRUNE_BATCH:
                    break
        return PruneReport(
            checkpoints=checkpoints, events=events, receipts=receipts, dispatches=dispatches
        )
