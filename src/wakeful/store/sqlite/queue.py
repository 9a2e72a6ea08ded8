"""The dispatch queue and the worker registry in SQL.

Write functions run inside the writer's ``BEGIN IMMEDIATE`` transaction: ``claim_next``
selects available dispatches and grants their thread claims while holding the database's
write lock, so two processes can never lease the same dispatch or claim the same thread.
"""

from __future__ import annotations

import sqlite3
import uuid
from datetime import datetime, timedelta

import msgspec

from wakeful.errors import (
    DispatchConflict,
    InvalidCommit,
    InvalidState,
    NotFound,
    StaleClaim,
    WorkerSuperseded,
)
from wakeful.records import (
    Dispatch,
    DispatchStatus,
    Lease,
    Outcome,
    WorkerIdentity,
    WorkerInfo,
)
from wakeful.store.intents import cancel_intent
from wakeful.store.keyslots import key_of_resume
from wakeful.store.pins import live_versions, pin_of_resume
from wakeful.store.sqlite import reads
from wakeful.store.sqlite.admission import admission, admit, slot_holder
from wakeful.store.sqlite.claims import (
    current_token,
    end_claim,
    epoch_of,
    grant_claim,
)
from wakeful.store.sqlite.codec import DISPATCH_COLUMNS, dispatch_of, from_us, to_us
from wakeful.store.sqlite.due import debounced, promote_due
from wakeful.store.sqlite.fair import fair_tag
from wakeful.store.sqlite.rows import insert as insert
from wakeful.store.sqlite.rows import retire_for as retire_for
from wakeful.store.sqlite.tenants import bind_tenant, check_tenant
from wakeful.store.validate import (
    check_outcome,
)
from wakeful.store.validate_queue import (
    QUEUE_DEPTH_STATUSES,
    RUN_KINDS,
    same_request,
)

_BY_ID = f"SELECT {DISPATCH_COLUMNS} FROM dispatches WHERE dispatch_id = ?"


def get(conn: sqlite3.Connection, dispatch_id: str) -> Dispatch | None:
    row = conn.execute(_BY_ID, (dispatch_id,)).fetchone()
    return None if row is None else dispatch_of(row)


def _existing(conn: sqlite3.Connection, dispatch_id: str) -> Dispatch:
    found = get(conn, dispatch_id)
    if found is None:
        raise NotFound("dispatch", dispatch_id)
    return found


def enqueue(conn: sqlite3.Connection, now: datetime, d: Dispatch) -> Dispatch:
    check_tenant(conn, d.thread_id, d.tenant)
    existing = get(conn, d.dispatch_id)
    if existing is None and d.dedupe_key is not None:
        row = conn.execute(
            f"SELECT {DISPATCH_COLUMNS} FROM dispatches WHERE dedupe_key = ?", (d.dedupe_key,)
        ).fetchone()
        existing = None if row is None else dispatch_of(row)
    if existing is not None:
        if same_request(existing, d):
            return existing
        key = "dispatch_id" if existing.dispatch_id == d.dispatch_id else "dedupe_key"
        raise DispatchConflict(d.dispatch_id, existing.dispatch_id, key)
    due = d.available_at or now
    stored = Dispatch(
        dispatch_id=d.dispatch_id,
        thread_id=d.thread_id,
        kind=d.kind,
        payload=d.payload,
        priority=d.priority,
        available_at=due,
        max_attempts=d.max_attempts,
        dedupe_key=d.dedupe_key,
        created_at=now,
        updated_at=now,
        tenant=d.tenant,
        if_busy=d.if_busy,
        pinned_version=pin_of_resume(slot_holder(conn, d.thread_id))
        if d.kind == "resume"
        else None,
        debounce_key=d.debounce_key,
        concurrency_key=d.concurrency_key,
        concurrency_limit=d.concurrency_limit,
    )
    if d.kind == "resume":
        stored = key_of_resume(stored, slot_holder(conn, d.thread_id))
    intent = None
    if d.debounce_key is not None and due > now:
        folded = debounced(conn, now, stored)
        if folded is not None:
            return folded
    if due > now:
        stored = msgspec.structs.replace(stored, status="scheduled")  # admitted when due
    elif stored.kind in RUN_KINDS:
        stored, intent = admission(conn, now, stored)
    if intent is not None:
        # the cancellation first: it holds the slot when the busy run's rows retire
        retire_for(conn, now, intent)
    if stored.status == "pending":
        stored = msgspec.structs.replace(
            stored, fair_tag=fair_tag(conn, stored.priority, stored.tenant)
        )
    insert(conn, stored)
    bind_tenant(conn, stored.thread_id, stored.tenant)
    if stored.kind == "resume" and stored.status != "scheduled":  # (when due if delayed)
        # a resume takes over from the dispatches parked while the run waited for input
        conn.execute(
            "UPDATE dispatches SET status = 'done', updated_at = ? "
            "WHERE thread_id = ? AND status = 'awaiting'",
            (to_us(now), stored.thread_id),
        )
    if stored.concurrency_key is not None and stored.status == "pending":
        # the key's trigger may have made it wait (migration 12)
        return _existing(conn, stored.dispatch_id)
    return stored


# Available: pending (the due step moved delayed work on), or leased with a lapsed lease
# (``lease_expires``, kept by triggers from the thread's claim: migration 0003), on a thread
# without a live claim;
# priority then enqueue order. Two index walks merged here: the pending range in claim order
# stops after ``limit`` threads, and the lapsed range holds only the leases whose claim ended,
# so neither steps over live leases. INDEXED BY: the planner may not sort the range instead.
_LIVE = "LEFT JOIN threads AS t ON t.thread_id = d.thread_id"
_FREE = "(t.token IS NULL OR t.expires_at < :now)"
_DUE = (
    f"SELECT d.priority, d.fair_tag, d.seq, d.thread_id FROM dispatches AS d "
    f"INDEXED BY dispatches_due {_LIVE} WHERE d.status = 'pending' AND d.pinned_version IS NULL "
    f"AND {_FREE} ORDER BY d.priority DESC, d.fair_tag, d.seq"
)
# the pending rows pinned to the claimer's version (issue 40): one range of their own index
_PINNED = (
    f"SELECT d.priority, d.fair_tag, d.seq, d.thread_id FROM dispatches AS d "
    f"INDEXED BY dispatches_pinned {_LIVE} WHERE d.status = 'pending' "
    f"AND d.pinned_version = :version AND {_FREE} "
    f"ORDER BY d.priority DESC, d.fair_tag, d.seq"
)
# only a crash leaves rows here, so the version filter walks few
_LAPSED = (
    f"SELECT d.priority, d.fair_tag, d.seq, d.thread_id FROM dispatches AS d "
    f"INDEXED BY dispatches_lapsing {_LIVE} "
    f"WHERE d.status = 'leased' AND d.lease_expires < :now AND {_FREE} "
    f"AND CASE WHEN d.pinned_version IS NULL THEN :starts ELSE d.pinned_version IS :version END "
    f"ORDER BY d.priority DESC, d.fair_tag, d.seq"
)

# One thread's first available dispatch (``claim_next(thread_id=...)``): a walk of the
# thread's own index range, however long the rest of the queue is.
_DUE_ON_THREAD = (
    f"SELECT d.seq, d.thread_id FROM dispatches AS d INDEXED BY dispatches_by_thread_status "
    f"{_LIVE} WHERE d.thread_id = :thread AND (d.status = 'pending' "
    f"OR (d.status = 'leased' AND d.lease_expires < :now)) AND {_FREE} "
    f"AND CASE WHEN d.pinned_version IS NULL THEN :starts ELSE d.pinned_version IS :version END "
    f"ORDER BY d.priority DESC, d.fair_tag, d.seq LIMIT 1"
)


def _available(
    conn: sqlite3.Connection, now: datetime, limit: int, version: str | None, take_starts: bool
) -> list[tuple[int, str]]:
    """Up to ``limit`` (seq, thread) of available dispatches in claim order, one per thread:
    the sources' ranges merged by (priority, fair tag, seq)."""
    params = {"now": to_us(now), "version": version, "starts": take_starts}
    queries = [_DUE, _LAPSED] if take_starts else [_LAPSED]
    if version is not None:
        queries.append(_PINNED)
    cursors = [conn.execute(q, params) for q in queries]
    chosen: list[tuple[int, str]] = []
    threads: set[str] = set()
    try:
        heads = [c.fetchone() for c in cursors]
        while len(chosen) < limit:
            live = [i for i, row in enumerate(heads) if row is not None]
            if not live:
                break
            i = min(live, key=lambda j: (-heads[j][0], heads[j][1], heads[j][2]))
            row, heads[i] = heads[i], cursors[i].fetchone()
            if row[3] not in threads:
                threads.add(row[3])
                chosen.append((row[2], row[3]))
    finally:
        for c in cursors:
            c.close()
    return chosen


def claim_next(
    conn: sqlite3.Connection,
    now: datetime,
    holder: str,
    ttl: float,
    limit: int,
    thread_id: str | None = None,
    version: str | None = None,
    take_starts: bool = True,
) -> list[Lease]:
    promote_due(conn, now)
    if thread_id is None:
        chosen = _available(conn, now, limit, version, take_starts)
    else:
        params = {"now": to_us(now), "thread": thread_id, "version": version}
        params["starts"] = take_starts
        chosen = [(seq, tid) for seq, tid in conn.execute(_DUE_ON_THREAD, params)]
    expires = now + timedelta(seconds=ttl)
    leases = []
    for seq, thread_id in chosen:
        claim = grant_claim(conn, thread_id, holder, expires)
        row = conn.execute(
            f"UPDATE dispatches SET status = 'leased', attempts = attempts + 1, token = ?, "
            f"holder = ?, lease_until = ?, lease_expires = ?, updated_at = ?, {_PIN} "
            f"WHERE seq = ? RETURNING {DISPATCH_COLUMNS}",
            (claim.token, holder, to_us(expires), to_us(expires), to_us(now), version, seq),
        ).fetchone()
        d = dispatch_of(row)
        bind_tenant(conn, thread_id, d.tenant)
        leases.append(
            Lease(
                dispatch=d,
                claim=claim,
                exhausted=d.attempts > d.max_attempts,
                snapshot=reads.read(conn, thread_id),  # in the granting transaction
            )
        )
    return leases


# a lease by a versioned worker pins an unpinned dispatch, except a cancel (wakeful.store.pins)
_PIN = (
    "pinned_version = CASE WHEN kind = 'cancel' THEN pinned_version "
    "ELSE coalesce(pinned_version, ?) END"
)


def release_pins(
    conn: sqlite3.Connection, now: datetime, pin_grace: float, limit: int
) -> list[Dispatch]:
    """``release_pins``: per pinned version without a live worker, its pending rows (one
    range of ``dispatches_pinned``) and lapsed leases, up to ``limit`` in all."""
    alive = live_versions(_workers(conn, "", ()), now, pin_grace)
    pinned = [
        v
        for (v,) in conn.execute(
            "SELECT DISTINCT pinned_version FROM dispatches INDEXED BY dispatches_pinned "
            "WHERE status = 'pending' AND pinned_version IS NOT NULL"
        )
    ]
    pinned += [
        v
        for (v,) in conn.execute(
            "SELECT DISTINCT pinned_version FROM dispatches INDEXED BY dispatches_lapsing "
            "WHERE status = 'leased' AND lease_expires < ? AND pinned_version IS NOT NULL",
            (to_us(now),),
        )
    ]
    released: list[Dispatch] = []
    for version in sorted(set(pinned) - alive):
        rows = conn.execute(
            f"UPDATE dispatches SET released_from = pinned_version, pinned_version = NULL, "
            f"updated_at = ? WHERE seq IN (SELECT seq FROM dispatches WHERE pinned_version = ? "
            f"AND (status = 'pending' OR (status = 'leased' AND lease_expires < ?)) "
            f"ORDER BY seq LIMIT ?) RETURNING {DISPATCH_COLUMNS}",
            (to_us(now), version, to_us(now), limit - len(released)),
        ).fetchall()
        released += [dispatch_of(row) for row in rows]
        if len(released) >= limit:
            break
    return released


def settleable(status: str, leased_token: int | None, token: int, epoch: int) -> bool:
    """Whether ``token`` may settle a dispatch: the dispatch is leased with it and no claim
    was granted on its thread since (takeover, cancel and delete advance the epoch)."""
    return status == "leased" and leased_token == token and epoch == token


def settle(
    conn: sqlite3.Connection, now: datetime, dispatch_id: str, token: int, outcome: Outcome
) -> Dispatch:
    """``settle``: fenced, ends the thread's claim, records the (checked) outcome."""
    d = _existing(conn, dispatch_id)
    if not settleable(d.status, d.token, token, epoch_of(conn, d.thread_id)):
        raise StaleClaim(d.thread_id, token, current_token(conn, d.thread_id))
    end_claim(conn, d.thread_id, token)
    return dispatch_of(settle_lease(conn, now, dispatch_id, outcome))


def check_commit_settle(
    conn: sqlite3.Connection, thread_id: str, token: int, dispatch_id: str
) -> None:
    """Step 5 of a commit that carries a settle, for the holder of claim ``token``: the
    dispatch exists, is this thread's, and ``settleable``. The commit's fencing (or the claim
    ``claim_and_commit`` just granted) already established that the thread's epoch is
    ``token``, so that is not read again."""
    row = conn.execute(
        "SELECT thread_id, status, token FROM dispatches WHERE dispatch_id = ?", (dispatch_id,)
    ).fetchone()
    if row is None:
        raise NotFound("dispatch", dispatch_id)
    owner, status, leased_token = row
    if owner != thread_id:
        raise InvalidCommit(
            thread_id,
            f"it settles dispatch {dispatch_id!r}, which belongs to thread {owner!r}",
        )
    if not settleable(status, leased_token, token, token):
        raise StaleClaim(thread_id, token, token)


def settle_lease(
    conn: sqlite3.Connection, now: datetime, dispatch_id: str, outcome: Outcome
) -> tuple[object, ...]:
    """Record ``outcome`` on a dispatch that ``settleable`` admitted (the caller ends the
    thread's claim in the same transaction); returns the dispatch's new row."""
    status, delay, error = check_outcome(outcome)
    if status == "pending":
        status = "scheduled" if delay > 0 else "pending"  # a backoff, a sleep: by due time
        row: tuple[object, ...] = conn.execute(
            f"UPDATE dispatches SET status = '{status}', token = NULL, holder = NULL, "
            f"lease_until = NULL, available_at = ?, last_error = ?, updated_at = ? "
            f"WHERE dispatch_id = ? RETURNING {DISPATCH_COLUMNS}",
            (to_us(now + timedelta(seconds=delay)), error, to_us(now), dispatch_id),
        ).fetchone()
    else:
        row = conn.execute(
            f"UPDATE dispatches SET status = ?, lease_until = NULL, updated_at = ? "
            f"WHERE dispatch_id = ? RETURNING {DISPATCH_COLUMNS}",
            (status, to_us(now), dispatch_id),
        ).fetchone()
        if status == "done":
            admit(conn, str(row[1]), now)  # the run slot it held is free
    return row


def cancel(conn: sqlite3.Connection, now: datetime, thread_id: str, reason: str) -> Dispatch:
    row = conn.execute(
        f"SELECT {DISPATCH_COLUMNS} FROM dispatches "
        f"WHERE thread_id = ? AND kind = 'cancel' AND status = 'pending' ORDER BY seq LIMIT 1",
        (thread_id,),
    ).fetchone()
    if row is not None:
        return dispatch_of(row)
    intent = cancel_intent(thread_id, reason, now)
    retire_for(conn, now, intent)
    return intent


def quarantine(conn: sqlite3.Connection, now: datetime, dispatch_id: str) -> Dispatch:
    d = _existing(conn, dispatch_id)
    if d.status == "quarantined":
        return d
    live = False
    if d.status == "leased":
        row = conn.execute(
            "SELECT token, expires_at FROM threads WHERE thread_id = ?", (d.thread_id,)
        ).fetchone()
        live = row is not None and row[0] == d.token and row[1] >= to_us(now)
    held = d.released_from is not None  # on_version_change="hold" (issue 40)
    if d.status not in ("pending", "leased") or live or not (d.exhausted or held):
        raise InvalidState(
            "dispatch",
            dispatch_id,
            f"{d.status} after {d.attempts} of {d.max_attempts} attempts"
            + (" with a live lease" if live else ""),
            "only exhausted work that no worker holds can be quarantined",
        )
    row = conn.execute(
        f"UPDATE dispatches SET status = 'quarantined', lease_until = NULL, updated_at = ? "
        f"WHERE dispatch_id = ? RETURNING {DISPATCH_COLUMNS}",
        (to_us(now), dispatch_id),
    ).fetchone()
    return dispatch_of(row)


def requeue(conn: sqlite3.Connection, now: datetime, dispatch_id: str) -> Dispatch:
    d = _existing(conn, dispatch_id)
    if d.status != "quarantined":
        raise InvalidState("dispatch", dispatch_id, d.status, "only quarantined work is requeued")
    conn.execute(
        "UPDATE dispatches SET status = 'pending', attempts = 0, token = NULL, holder = NULL, "
        "lease_until = NULL, available_at = ?, updated_at = ?, released_from = NULL "
        "WHERE dispatch_id = ?",
        (to_us(now), to_us(now), dispatch_id),
    )
    return _existing(conn, dispatch_id)  # as the key's trigger left it (waiting_key)


def purge(conn: sqlite3.Connection, now: datetime, dispatch_id: str) -> None:
    d = _existing(conn, dispatch_id)
    if d.status not in ("quarantined", "done"):
        raise InvalidState(
            "dispatch", dispatch_id, d.status, "only quarantined or done work can be purged"
        )
    conn.execute("DELETE FROM dispatches WHERE dispatch_id = ?", (dispatch_id,))
    if d.status == "quarantined":
        admit(conn, d.thread_id, now)  # it held its thread's run slot


# Each filter combination has an index holding its rows in enqueue order (seq is the rowid,
# so the unfiltered listing walks the table itself): a page reads what it returns.
def list_dispatches(
    conn: sqlite3.Connection,
    status: str | None,
    thread_id: str | None,
    after: str | None,
    limit: int,
    tenant: str | None = None,
) -> list[Dispatch]:
    floor = 0
    if after is not None:
        row = conn.execute("SELECT seq FROM dispatches WHERE dispatch_id = ?", (after,)).fetchone()
        if row is None:
            raise NotFound("dispatch cursor", after)
        floor = row[0]
    sql = f"SELECT {DISPATCH_COLUMNS} FROM dispatches WHERE seq > ?"
    params: list[object] = [floor]
    if status is not None:
        sql += " AND status = ?"
        params.append(status)
    if thread_id is not None:
        sql += " AND thread_id = ?"
        params.append(thread_id)
    if tenant is not None:
        sql += " AND owner = ? AND (tenant IS NULL OR tenant = ?)"
        params.extend((tenant, tenant))
    sql += " ORDER BY seq LIMIT ?"
    params.append(limit)
    return [dispatch_of(row) for row in conn.execute(sql, params)]


_DEPTH = (
    "SELECT count(*) FROM (SELECT 1 FROM dispatches INDEXED BY dispatches_by_status "
    "WHERE status = ? LIMIT ?)"
)


def queue_depths(conn: sqlite3.Connection, limit: int) -> dict[DispatchStatus, int]:
    """Open dispatches by status, each counted up to ``limit`` over its index range."""
    return {
        status: conn.execute(_DEPTH, (status, limit)).fetchone()[0]
        for status in QUEUE_DEPTH_STATUSES
    }


def register_worker(
    conn: sqlite3.Connection, now: datetime, worker_id: str, version: str | None = None
) -> WorkerIdentity:
    row = conn.execute(
        "SELECT generation FROM workers WHERE worker_id = ?", (worker_id,)
    ).fetchone()
    identity = WorkerIdentity(
        worker_id=worker_id,
        incarnation_id=uuid.uuid4().hex,
        generation=(0 if row is None else row[0]) + 1,
    )
    conn.execute(
        "INSERT INTO workers (worker_id, incarnation_id, generation, registered_at, "
        "last_heartbeat, version) VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (worker_id) DO UPDATE "
        "SET incarnation_id = excluded.incarnation_id, generation = excluded.generation, "
        "registered_at = excluded.registered_at, last_heartbeat = excluded.last_heartbeat, "
        "stopped_at = NULL, version = excluded.version",
        (worker_id, identity.incarnation_id, identity.generation, to_us(now), to_us(now), version),
    )
    return identity


def heartbeat(conn: sqlite3.Connection, now: datetime, identity: WorkerIdentity) -> None:
    _current_worker(conn, identity)
    conn.execute(
        "UPDATE workers SET last_heartbeat = ? WHERE worker_id = ?",
        (to_us(now), identity.worker_id),
    )


def retire_worker(conn: sqlite3.Connection, now: datetime, identity: WorkerIdentity) -> WorkerInfo:
    _current_worker(conn, identity)
    conn.execute(
        "UPDATE workers SET stopped_at = coalesce(stopped_at, ?) WHERE worker_id = ?",
        (to_us(now), identity.worker_id),
    )
    return _workers(conn, "WHERE worker_id = ?", (identity.worker_id,))[0]


def _current_worker(conn: sqlite3.Connection, identity: WorkerIdentity) -> None:
    """``NotFound`` or ``WorkerSuperseded`` unless ``identity`` is the registered incarnation."""
    row = conn.execute(
        "SELECT incarnation_id, generation FROM workers WHERE worker_id = ?",
        (identity.worker_id,),
    ).fetchone()
    if row is None:
        raise NotFound("worker", identity.worker_id)
    if (row[1], row[0]) != (identity.generation, identity.incarnation_id):
        raise WorkerSuperseded(identity.worker_id, identity.generation, row[1])


def list_workers(conn: sqlite3.Connection) -> list[WorkerInfo]:
    return _workers(conn, "ORDER BY worker_id", ())


def workers_of(conn: sqlite3.Connection, version: str) -> list[WorkerInfo]:
    """The registered workers of ``version``."""
    return _workers(conn, "WHERE version = ?", (version,))


def _workers(conn: sqlite3.Connection, where: str, args: tuple[str, ...]) -> list[WorkerInfo]:
    return [
        WorkerInfo(
            worker_id=worker_id,
            incarnation_id=incarnation,
            generation=generation,
            registered_at=from_us(registered),
            last_heartbeat=from_us(beat),
            stopped_at=None if stopped is None else from_us(stopped),
            version=version,
        )
        for worker_id, incarnation, generation, registered, beat, stopped, version in conn.execute(
            "SELECT worker_id, incarnation_id, generation, registered_at, last_heartbeat, "
            f"stopped_at, version FROM workers {where}",
            args,
        )
    ]
