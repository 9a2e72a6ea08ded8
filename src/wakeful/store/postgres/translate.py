"""Driver errors to wakeful errors: the one place where psycopg's exceptions are interpreted.

Three kinds of failure come out of the driver:

- a refusal raised on purpose by one of the schema's functions, with a wakeful SQLSTATE
  (class ``WK``) and a JSON ``DETAIL``: mapped to the contract's error (``StaleClaim``,
  ``ThreadBusy``, ...). The transaction rolled back, so nothing changed;
- a transient conflict (serialization failure, deadlock, a unique violation lost to a
  concurrent insert): the transaction rolled back and the same call may simply run again;
  ``Database.run`` retries those a bounded number of times;
- a new connection refused by a server that was reached (no such database, login or
  password refused, no ``pg_hba`` entry): ``StoreRefused``, permanent (see ``connect_error``),
  unless the server said it cannot take the session *now* (starting up, replaying its WAL,
  shutting down, at its connection limit): ``StoreUnavailable``;
- the server could not be reached or dropped the connection (``OperationalError``,
  ``InterfaceError``, a pool timeout, the session ended by the server's
  ``idle_in_transaction_session_timeout``): ``StoreUnavailable``, retryable by the caller. A
  write that failed this way may or may not have been applied; a commit is safe to retry with
  the same operation id.
"""

from __future__ import annotations

import json
import re
from datetime import datetime
from typing import Any

import psycopg
import psycopg.errors
import psycopg_pool

from wakeful.errors import (
    InvalidCommit,
    InvalidState,
    NotFound,
    OperationConflict,
    StaleClaim,
    StoreRefused,
    StoreUnavailable,
    TenantMismatch,
    ThreadBusy,
    VersionConflict,
    WakefulError,
    WorkerSuperseded,
)

TRANSIENT = (
    psycopg.errors.SerializationFailure,
    psycopg.errors.DeadlockDetected,
    psycopg.errors.LockNotAvailable,
    psycopg.errors.UniqueViolation,
)
"""Errors after which the transaction rolled back and running it again is safe."""


SESSION_ENDED = ("08", "57P", "25P03")
"""SQLSTATE prefixes after which the session is gone: connection exceptions (08), the server
shutting down, crashing, refusing new sessions or ending an idle one (57P01-57P05), and the
end of a session left idle in a transaction longer than allowed (25P03)."""

NOT_NOW = re.compile(
    "|".join(
        (
            # 57P03 cannot_connect_now: starting up, replaying WAL, a standby not yet
            # consistent or not accepting connections, shutting down, crash recovery
            r"the database system is (starting up|shutting down|in recovery mode"
            r"|not yet accepting connections|not accepting connections)",
            r"terminating connection due to administrator command",  # 57P01 admin_shutdown
            r"terminating connection because of crash of another server process",  # 57P02
            # 53300 too_many_connections: server-wide, per role, per database, reserved slots
            r"sorry, too many clients already",
            r"too many connections for (role|database)",
            r"remaining connection slots are reserved",
            r"out of memory",  # 53200
            # PgBouncer: its own limits, or the server behind it not (yet) reachable
            r"no more connections allowed",
            r"pgbouncer cannot connect to server",
            r"server login has been failing",
        )
    ),
    re.IGNORECASE,
)
"""What a server that was reached says when it cannot take a session now but will later.
libpq reports a refused connection without its SQLSTATE, so the (English) message is
matched; a server whose ``lc_messages`` is another language has its refusals judged
permanent after the connect retries (``connection.REFUSAL_RETRIES``)."""

NOT_NOW_CODES = frozenset(("57P01", "57P02", "57P03", "53200", "53300"))


def is_transient(exc: BaseException) -> bool:
    return isinstance(exc, TRANSIENT)


def is_disconnect(exc: BaseException) -> bool:
    """The connection or the server is gone (as opposed to a refused statement)."""
    if isinstance(exc, psycopg_pool.PoolTimeout | psycopg.InterfaceError):
        return True
    if isinstance(exc, psycopg.OperationalError):
        return True
    return isinstance(exc, psycopg.Error) and (exc.sqlstate or "").startswith(SESSION_ENDED)


def refusal(exc: psycopg.Error) -> WakefulError | None:
    """The contract error for a refusal raised by a schema function, else ``None``."""
    return refused(exc.sqlstate or "", exc.diag.message_detail)


def refused(code: str, raw_detail: str | None) -> WakefulError | None:
    """The contract error for a refusal's SQLSTATE (class ``WK``) and JSON DETAIL, as a
    schema function raised them or ``commit_many`` reported them; else ``None``."""
    if not code.startswith("WK"):
        return None
    raw = raw_detail or "{}"
    try:
        detail: dict[str, Any] = json.loads(raw)
    except ValueError:
        detail = {}
    tid = str(detail.get("thread_id", ""))
    match code:
        case "WK001":
            return StaleClaim(tid, detail.get("token"), detail.get("current"))
        case "WK002":
            return OperationConflict(tid, str(detail.get("operation_id")))
        case "WK003":
            return VersionConflict(
                tid, detail.get("expected"), detail.get("actual"), str(detail.get("what"))
            )
        case "WK004":
            return InvalidCommit(tid, str(detail.get("problem")))
        case "WK005":
            return TenantMismatch(tid)
        case "WK006":
            return NotFound(str(detail.get("what")), str(detail.get("ident")))
        case "WK007":
            return InvalidState(
                str(detail.get("what")),
                str(detail.get("ident")),
                str(detail.get("state")),
                str(detail.get("problem")),
            )
        case "WK008":
            return WorkerSuperseded(
                str(detail.get("worker_id")),
                int(detail.get("generation", 0)),
                int(detail.get("current", 0)),
            )
        case "WK010":
            return ThreadBusy(
                tid,
                detail.get("holder"),
                detail.get("checkpoint_id"),
                _time(detail),
                run_id=detail.get("run_id"),
                dispatch_id=detail.get("dispatch_id"),
            )
    return None


def unavailable(exc: BaseException) -> StoreUnavailable:
    """``StoreUnavailable`` naming what the driver said, without connection secrets."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return StoreUnavailable(f"PostgreSQL: {type(exc).__name__}: {text}")


def connect_error(exc: BaseException, where: str, reached: bool) -> WakefulError:
    """Why a new connection to ``where`` failed. libpq reports a failed connection without a
    SQLSTATE, so permanence is judged by what was reached: when no server accepted a TCP (or
    Unix socket) connection the failure is transient (``StoreUnavailable``); when a server
    was reached and still refused the session (a database that does not exist, a refused
    login, a missing ``pg_hba`` entry) retrying the same URL will not help (``StoreRefused``).
    The caller tries a few times over about two seconds before calling a refusal
    permanent. A refusal that says the server cannot take the session *now* (``NOT_NOW``:
    starting up or replaying its WAL, shutting down, at its connection limit; SQLSTATE 57P01,
    57P02, 57P03, 53200, 53300) is ``StoreUnavailable`` however long it lasts: the same open
    succeeds once the server is ready."""
    text = _first_line(exc)
    if not reached:
        return StoreUnavailable(f"cannot reach {where} ({text})")
    if not_now(exc):
        return StoreUnavailable(f"{where} cannot take a session now ({text})")
    return StoreRefused(where, text)


def not_now(exc: BaseException) -> bool:
    """Whether a failed connection was refused for a reason that passes (``NOT_NOW``)."""
    code = getattr(exc, "sqlstate", None)
    if isinstance(code, str) and code in NOT_NOW_CODES:
        return True
    return NOT_NOW.search(str(exc)) is not None


def _first_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    if not lines:
        return type(exc).__name__
    # libpq: 'connection to server at "h" (addr), port p failed: FATAL:  database "x" ...'
    head = lines[0]
    _, sep, reason = head.rpartition(" failed: ")
    return " ".join((reason if sep else head).split())


def _time(detail: dict[str, Any]) -> datetime | None:
    value = detail.get("expires_at")
    if not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(value)
    except ValueError:
        return None
