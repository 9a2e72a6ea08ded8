"""The dispatch queue and the worker registry on PostgreSQL (DESIGN §3.3).

``claim_next`` is one call of the schema's ``claim_next`` function: candidates are locked
with ``FOR UPDATE SKIP LOCKED`` in priority then enqueue order, each candidate's thread row
is locked with ``SKIP LOCKED`` as well and its claim re-checked, and the thread claim is
granted in the same transaction. Settling, cancelling and the operator actions lock the
thread row before the dispatch row, the one lock order of the schema.
"""

from __future__ import annotations

import uuid
from typing import Any

from wakeful.concurrency import KeyUse
from wakeful.errors import DispatchConflict, InvalidInput, NotFound, StoreUnavailable
from wakeful.ids import check_count, check_id, check_seconds
from wakeful.records import (
    Claim,
    Dispatch,
    DispatchStatus,
    Lease,
    Outcome,
    WorkerIdentity,
    WorkerInfo,
)
from wakeful.store.kinds import CANCEL_PRIORITY, DISPATCH_KINDS
from wakeful.store.pins import check_migration
from wakeful.store.postgres import codec
from wakeful.store.postgres.codec import DISPATCH_COLUMNS, DISPATCH_WIDTH
from wakeful.store.postgres.connection import Database, big, no_nul, utc
from wakeful.store.postgres.notify import Notifier
from wakeful.store.validate import (
    check_outcome,
    check_text,
    check_token,
)
from wakeful.store.validate_queue import (
    FENCING,
    QUEUE_DEPTH_STATUSES,
    check_depth_limit,
    check_dispatch,
    check_listing,
    check_version,
    same_request,
)

_ENQUEUE = (
    f"SELECT {DISPATCH_COLUMNS} "
    f"FROM @schema@.enqueue(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"
)
# a debounced submission (issue 39): folded into the scheduled dispatch of its key, or enqueued
_ENQUEUE_DEBOUNCED = (
    f"SELECT {DISPATCH_COLUMNS} FROM @schema@.enqueue_debounced("
    f"%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"
)
# the claim's due step, before claim_next(thread_id=...) reads the thread's range
_PROMOTE_DUE = "SELECT @schema@.promote_due(@schema@.store_now(), 100)"
# enqueue with a concurrency key (migration 19): enqueue, then the key on the row it inserted
_ENQUEUE_KEYED = (
    f"SELECT {DISPATCH_COLUMNS} FROM @schema@.enqueue_keyed"
    f"(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"
)
_KEY_USE = "SELECT o_key, o_limit, o_admitted, o_waiting FROM @schema@.concurrency_use()"
_LEASED_COLUMNS = ", ".join(f"(o_dispatch).{c.strip()}" for c in DISPATCH_COLUMNS.split(","))
# The dispatches leased, each with its thread as read right after the grants.
_CLAIM_NEXT = f"""
SELECT {_LEASED_COLUMNS}, o_version, o_tenant, o_message_count, o_next_seq, o_event_floor,
       o_checkpoint, o_writes
  FROM @schema@.claim_next_read(%s, %s, %s, %s, %s)
"""
# claim_next(thread_id=...): one statement locks the thread's first available dispatch and
# then its thread row (both SKIP LOCKED, the order of claim_next()), re-checks the claim on
# the locked row, and grants the claim and the lease as claim_next() does; a walk of the
# thread's own index range (dispatches_by_thread_status), whatever the rest of the queue
# holds. The lease's snapshot is read by the next statement of the same transaction, so it
# sees every commit made before the grant (this statement's snapshot may predate a commit
# that released the thread just before the lock was taken).
_CLAIM_ON_THREAD = f"""
WITH k AS MATERIALIZED (
    SELECT @schema@.store_now() AS n
), cand AS MATERIALIZED (
    SELECT x.dispatch_id, x.thread_id, x.tenant
      FROM @schema@.dispatches x, k
     WHERE x.thread_id = %(thread)s
       AND (x.status = 'pending' OR (x.status = 'leased' AND x.lease_expires < k.n))
       -- pinned rows to their version's workers, unpinned ones to those taking starts
       AND CASE WHEN x.pinned_version IS NULL THEN %(starts)s
                ELSE x.pinned_version = %(version)s END
     ORDER BY x.priority DESC, x.seq
     LIMIT 1
       FOR UPDATE OF x SKIP LOCKED
), held AS MATERIALIZED (
    SELECT y.thread_id, y.epoch, y.version, y.tenant, y.claim_token, y.claim_expires
      FROM @schema@.threads y
     WHERE y.thread_id = (SELECT c.thread_id FROM cand c)
       FOR UPDATE SKIP LOCKED
), g AS MATERIALIZED (
    -- the tenant the lease fixes on an unbound thread, else the thread's own (unchanged)
    SELECT c.dispatch_id, c.thread_id, h.epoch + 1 AS token,
           CASE WHEN h.version = 0 AND h.tenant IS NULL THEN c.tenant ELSE h.tenant END
               AS tenant,
           k.n AS n, k.n + make_interval(secs => %(ttl)s) AS expires
      FROM cand c JOIN held h ON h.thread_id = c.thread_id, k
     WHERE NOT (h.claim_token IS NOT NULL AND h.claim_expires >= k.n)
), claims AS (
    UPDATE @schema@.threads y
       SET present = true, epoch = g.token, claim_holder = %(holder)s, claim_token = g.token,
           claim_expires = g.expires, tenant = g.tenant
      FROM g
     WHERE y.thread_id = g.thread_id
)
UPDATE @schema@.dispatches x
   SET status = 'leased', attempts = x.attempts + 1, token = g.token, holder = %(holder)s,
       lease_until = g.expires, lease_expires = g.expires, updated_at = g.n,
       pinned_version = CASE WHEN x.kind = 'cancel' THEN x.pinned_version
                             ELSE coalesce(x.pinned_version, %(version)s::text) END
  FROM g
 WHERE x.thread_id = g.thread_id AND x.dispatch_id = g.dispatch_id
RETURNING {", ".join(f"x.{c.strip()}" for c in DISPATCH_COLUMNS.split(","))}
"""
_LEASED_THREAD = """
SELECT t.version, t.tenant, t.message_count + t.message_offset, t.next_seq, t.event_floor, c.body,
       ARRAY(SELECT w.body FROM @schema@.writes w WHERE w.thread_id = t.thread_id
              ORDER BY w.version, w.idx)
  FROM @schema@.threads t
  LEFT JOIN @schema@.checkpoints c
    ON c.thread_id = t.thread_id AND c.checkpoint_id = t.latest_checkpoint
 WHERE t.thread_id = %s
"""
_SETTLE = f"SELECT {DISPATCH_COLUMNS} FROM @schema@.settle(%s, %s, %s, %s, %s)"
_CANCEL = f"SELECT {DISPATCH_COLUMNS} FROM @schema@.cancel(%s, %s, %s, %s, %s, %s)"
_QUARANTINE = f"SELECT {DISPATCH_COLUMNS} FROM @schema@.quarantine(%s)"
_REQUEUE = f"SELECT {DISPATCH_COLUMNS} FROM @schema@.requeue(%s)"
_PURGE = "SELECT @schema@.purge(%s)"
_RELEASE_PINS = f"SELECT {DISPATCH_COLUMNS} FROM @schema@.release_pins(%s, %s)"
_MIGRATE_RUNS = f"SELECT {DISPATCH_COLUMNS} FROM @schema@.migrate_runs(%s, %s, %s)"
_GET = f"SELECT {DISPATCH_COLUMNS} FROM @schema@.dispatches WHERE dispatch_id = %s"
_CURSOR = "SELECT seq FROM @schema@.dispatches WHERE dispatch_id = %s"
# Through functions that leave the planner only index plans in page order (migration 0005).
_LIST = f"""
SELECT {DISPATCH_COLUMNS} FROM @schema@.list_dispatches(%s, %s, %s, %s, %s)
"""
_DEPTHS = "SELECT o_status, o_count FROM @schema@.queue_depths(%s)"
_CANCEL_BUDGET = Dispatch(dispatch_id="cancel", thread_id="t", kind="cancel").max_attempts
"""A cancel dispatch gets the default retry budget, as in the reference store."""
_REGISTER = "SELECT @schema@.register_worker(%s, %s, %s)"
_HEARTBEAT = "SELECT @schema@.heartbeat(%s, %s, %s)"
_WORKER_COLUMNS = (
    "worker_id, incarnation_id, generation, registered_at, last_heartbeat, stopped_at, version"
)
_RETIRE = f"SELECT {_WORKER_COLUMNS} FROM @schema@.retire_worker(%s, %s, %s)"
_WORKERS = f"SELECT {_WORKER_COLUMNS} FROM @schema@.workers ORDER BY worker_id"


class QueueOps:
    """The queue half of ``PostgresStore``."""

    _db: Database
    _notifier: Notifier

    async def enqueue(self, dispatch: Dispatch) -> Dispatch:
        d = check_dispatch(dispatch)
        if d.kind not in DISPATCH_KINDS:
            raise InvalidInput("kind", f"must be one of {sorted(DISPATCH_KINDS)}")
        if d.max_attempts >= 2**63:
            raise InvalidInput("max_attempts", "must fit in 64 bits")
        params: tuple[object, ...] = (
            d.dispatch_id,
            d.thread_id,
            d.kind,
            codec.text(d.payload),
            d.priority,
            d.available_at,
            d.max_attempts,
            d.dedupe_key,
            d.tenant,
            d.if_busy,
            # the cancel intent an "interrupt" or "rollback" makes of the busy run, if any
            f"cancel-{uuid.uuid4().hex}" if d.if_busy in FENCING else None,
            CANCEL_PRIORITY,
            _CANCEL_BUDGET,
        )
        sql, args = _ENQUEUE, tuple[object, ...](params)
        if d.debounce_key is not None:
            sql, args = _ENQUEUE_DEBOUNCED, (d.debounce_key, *params)
        elif d.concurrency_key is not None:
            sql, args = _ENQUEUE_KEYED, (*params, d.concurrency_key, d.concurrency_limit)
        for _ in range(3):
            row = await self._db.fetchone(sql, args)
            if row is None:
                continue  # the conflicting dispatch was purged meanwhile: try again
            stored = codec.dispatch(row)
            if same_request(stored, d):
                return stored
            key = "dispatch_id" if stored.dispatch_id == d.dispatch_id else "dedupe_key"
            raise DispatchConflict(d.dispatch_id, stored.dispatch_id, key)
        raise StoreUnavailable(f"enqueue of {d.dispatch_id!r} kept racing with purges")

    async def claim_next(
        self,
        holder: str,
        ttl: float,
        limit: int = 1,
        thread_id: str | None = None,
        *,
        version: str | None = None,
        take_starts: bool = True,
    ) -> list[Lease]:
        check_id("holder", holder)
        check_version(version)
        ttl = check_seconds("ttl", ttl)
        limit = check_count("limit", limit, minimum=1, maximum=1000)
        starts = bool(take_starts)
        if thread_id is not None:
            check_id("thread_id", thread_id)
            return await self._claim_on_thread(holder, ttl, thread_id, version, starts)
        rows = await self._db.fetchall(_CLAIM_NEXT, (holder, ttl, limit, version, starts))
        leases = []
        for row in rows:
            d = codec.dispatch(row[:DISPATCH_WIDTH])
            assert d.token is not None and d.holder is not None and d.lease_until is not None
            claim = Claim(
                thread_id=d.thread_id, holder=d.holder, token=d.token, expires_at=d.lease_until
            )
            leases.append(
                Lease(
                    dispatch=d,
                    claim=claim,
                    exhausted=d.attempts > d.max_attempts,
                    snapshot=codec.snapshot(d.thread_id, claim, *row[DISPATCH_WIDTH:]),
                )
            )
        return leases

    async def _claim_on_thread(
        self, holder: str, ttl: float, thread_id: str, version: str | None, starts: bool
    ) -> list[Lease]:
        promote = self._db.sql(_PROMOTE_DUE)
        grant = self._db.sql(_CLAIM_ON_THREAD)
        read = self._db.sql(_LEASED_THREAD)
        params = {"thread": thread_id, "holder": holder, "ttl": ttl}
        params |= {"version": version, "starts": starts}

        async def op(conn: Any) -> tuple[Any, Any]:
            # three round trips in one transaction: bounded like every such (decision 0031)
            async with self._db.transaction(conn):
                await conn.execute(promote)  # (its own statement: the grant must see it)
                row = await (await conn.execute(grant, params)).fetchone()
                if row is None:
                    return None, None
                return row, await (await conn.execute(read, (thread_id,))).fetchone()

        row, thread = await self._db.run(op)
        if row is None:
            return []
        d = codec.dispatch(row)
        assert d.token is not None and d.holder is not None and d.lease_until is not None
        claim = Claim(thread_id=thread_id, holder=d.holder, token=d.token, expires_at=d.lease_until)
        return [
            Lease(
                dispatch=d,
                claim=claim,
                exhausted=d.attempts > d.max_attempts,
                snapshot=codec.snapshot(thread_id, claim, *thread),
            )
        ]

    async def settle(self, dispatch_id: str, token: int, outcome: Outcome) -> Dispatch:
        check_id("dispatch_id", dispatch_id)
        check_token(token)
        status, delay, error = check_outcome(outcome)
        if error is not None:
            no_nul("retry error", error)
        row = await self._db.fetchone(
            _SETTLE, (dispatch_id, big(token), status, float(delay), error)
        )
        return codec.dispatch(row)

    async def cancel(self, thread_id: str, reason: str) -> Dispatch:
        check_id("thread_id", thread_id)
        no_nul("reason", check_text("reason", reason))
        row = await self._db.fetchone(
            _CANCEL,
            (
                thread_id,
                reason,
                f"cancel-{uuid.uuid4().hex}",
                codec.text({"reason": reason}),
                CANCEL_PRIORITY,
                _CANCEL_BUDGET,
            ),
        )
        return codec.dispatch(row)

    async def get_dispatch(self, dispatch_id: str) -> Dispatch | None:
        check_id("dispatch_id", dispatch_id)
        row = await self._db.fetchone(_GET, (dispatch_id,), idempotent=True)
        return None if row is None else codec.dispatch(row)

    async def list_dispatches(
        self,
        status: DispatchStatus | None = None,
        thread_id: str | None = None,
        after: str | None = None,
        limit: int = 100,
        tenant: str | None = None,
    ) -> list[Dispatch]:
        limit = check_listing(status, thread_id, after, limit, tenant)
        floor = 0
        if after is not None:
            found = await self._db.fetchone(_CURSOR, (after,), idempotent=True)
            if found is None:
                raise NotFound("dispatch cursor", after)
            floor = found[0]
        rows = await self._db.fetchall(
            _LIST, (floor, status, thread_id, tenant, limit), idempotent=True
        )
        return [codec.dispatch(row) for row in rows]

    async def concurrency_keys(self) -> list[KeyUse]:
        rows = await self._db.fetchall(_KEY_USE, (), idempotent=True)
        return [KeyUse(key=k, limit=n, admitted=a, waiting=w) for k, n, a, w in rows]

    async def queue_depths(self, limit: int = 10_000) -> dict[DispatchStatus, int]:
        limit = check_depth_limit(limit)
        rows = await self._db.fetchall(_DEPTHS, (limit,), idempotent=True)
        counts = {status: int(count) for status, count in rows}
        return {status: counts.get(status, 0) for status in QUEUE_DEPTH_STATUSES}

    async def quarantine(self, dispatch_id: str) -> Dispatch:
        check_id("dispatch_id", dispatch_id)
        return codec.dispatch(await self._db.fetchone(_QUARANTINE, (dispatch_id,)))

    async def requeue(self, dispatch_id: str) -> Dispatch:
        check_id("dispatch_id", dispatch_id)
        return codec.dispatch(await self._db.fetchone(_REQUEUE, (dispatch_id,)))

    async def purge(self, dispatch_id: str) -> None:
        check_id("dispatch_id", dispatch_id)
        await self._db.fetchone(_PURGE, (dispatch_id,))

    async def release_pins(self, pin_grace: float, limit: int = 100) -> list[Dispatch]:
        pin_grace = check_seconds("pin_grace", pin_grace)
        limit = check_count("limit", limit, minimum=1, maximum=1000)
        rows = await self._db.fetchall(_RELEASE_PINS, (pin_grace, limit))
        return [codec.dispatch(row) for row in rows]

    async def migrate_runs(
        self, from_version: str, to_version: str, limit: int = 100
    ) -> list[Dispatch]:
        args = check_migration(from_version, to_version, limit)
        rows = await self._db.fetchall(_MIGRATE_RUNS, args)
        moved = [codec.dispatch(row) for row in rows]
        for thread_id in {d.thread_id for d in moved}:
            self._notifier.notify(thread_id)  # the run.migrated event, announced once committed
        return moved

    # ------------------------------------------------------------ workers

    async def register_worker(
        self, worker_id: str, *, version: str | None = None
    ) -> WorkerIdentity:
        check_id("worker_id", worker_id)
        check_version(version)
        incarnation = uuid.uuid4().hex
        (generation,) = await self._db.fetchone(_REGISTER, (worker_id, incarnation, version))
        return WorkerIdentity(
            worker_id=worker_id, incarnation_id=incarnation, generation=generation
        )

    async def heartbeat(self, identity: WorkerIdentity) -> None:
        check_id("worker_id", identity.worker_id)
        await self._db.fetchone(
            _HEARTBEAT,
            (identity.worker_id, identity.incarnation_id, big(identity.generation)),
        )

    async def retire_worker(self, identity: WorkerIdentity) -> WorkerInfo:
        check_id("worker_id", identity.worker_id)
        row = await self._db.fetchone(
            _RETIRE, (identity.worker_id, identity.incarnation_id, big(identity.generation))
        )
        return _worker_info(row)

    async def list_workers(self) -> list[WorkerInfo]:
        rows = await self._db.fetchall(_WORKERS, None, idempotent=True)
        return [_worker_info(row) for row in rows]


def _worker_info(row: Any) -> WorkerInfo:
    wid, inc, gen, registered, beat, stopped, version = row
    return WorkerInfo(
        worker_id=wid,
        incarnation_id=inc,
        generation=gen,
        registered_at=utc(registered),
        last_heartbeat=utc(beat),
        stopped_at=None if stopped is None else utc(stopped),
        version=version,
    )
