"""What a PostgreSQL server says about itself, for ``/readyz`` and ``wakeful doctor``: its
role (primary or standby), its replication (the standbys it streams to, and whether
commits wait for them; or, on a standby, where it receives from and how far behind it
replays), the pooler found in front of it, and the skew between this host's clock and the
server's.

One statement (``REPORT``) reads everything; on a role without ``pg_monitor`` the standbys'
states and lags read as unknown (``pg_stat_replication`` hides them), which the report says.
Clock skew: the server's ``clock_timestamp()`` against the midpoint of this host's clock
before and after the round trip, so the error is at most half the round trip (reported
beside it). Claims are judged by the server's clock only (docs/postgres-store.md), so skew
costs nothing in correctness; it matters for reading times across hosts (logs, a claim's
``expires_at`` compared with a host's clock) and, with several nodes, between nodes.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any

from psycopg.rows import TupleRow

from wakeful.store.postgres.connection import Conn

REPORT = """
SELECT pg_is_in_recovery(), current_setting('server_version'),
       current_setting('synchronous_standby_names'), current_setting('synchronous_commit'),
       extract(epoch FROM clock_timestamp())::float8,
       (SELECT coalesce(json_agg(json_build_object(
                 'name', application_name, 'state', state, 'sync_state', sync_state,
                 'write_lag', extract(epoch FROM write_lag),
                 'flush_lag', extract(epoch FROM flush_lag),
                 'replay_lag', extract(epoch FROM replay_lag))), '[]')
          FROM pg_stat_replication),
       (SELECT json_build_object('status', status, 'host', sender_host, 'port', sender_port)
          FROM pg_stat_wal_receiver LIMIT 1),
       CASE WHEN pg_is_in_recovery()
            THEN extract(epoch FROM clock_timestamp() - pg_last_xact_replay_timestamp())
       END
"""

SKEW_WARNING = 1.0
"""Seconds of clock skew past which the report warns."""


@dataclass(frozen=True)
class ServerReport:
    """One look at the server. ``replication``: ``none`` (a primary streaming to nobody),
    ``synchronous`` (commits wait for a standby that is attached and synchronous),
    ``asynchronous`` (standbys attached, none synchronous: a failover can lose the last
    acknowledged commits), ``waiting`` (commits wait for a synchronous standby that is not
    attached: they block), ``unknown`` (standbys attached, their states hidden from this
    role), or ``standby`` (this server replays another's WAL)."""

    role: str
    server_version: str
    replication: str
    synchronous_standby_names: str
    synchronous_commit: str
    standbys: list[dict[str, Any]]
    receiving_from: dict[str, Any] | None
    replay_delay: float | None
    """On a standby: seconds since the last replayed transaction committed on the primary
    (grows while the primary is idle too)."""
    pooler: str
    clock_skew: float
    """The server's clock minus this host's, in seconds."""
    round_trip: float
    warnings: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


async def inspect(conn: Conn, pooler: str = "unknown", listens: bool | None = None) -> ServerReport:
    """Read the report on ``conn`` (one statement). ``pooler``: the mode found when the
    connection's pool was opened (``wakeful.store.postgres.pooler``); ``listens``: whether
    the store's LISTEN connection is on (``None``: no store, as for ``wakeful doctor``)."""
    before = time.time()
    cur = await conn.execute(REPORT)
    row: TupleRow | None = await cur.fetchone()
    after = time.time()
    assert row is not None
    in_recovery, version, sync_names, sync_commit, server_now, standbys, receiver, delay = row
    skew = float(server_now) - (before + after) / 2
    return build(
        standby=bool(in_recovery),
        version=str(version),
        sync_names=str(sync_names),
        sync_commit=str(sync_commit),
        standbys=list(standbys or []),
        receiver=receiver,
        delay=None if delay is None else float(delay),
        pooler=pooler,
        skew=skew,
        round_trip=after - before,
        listens=listens,
    )


def build(
    *,
    standby: bool,
    version: str,
    sync_names: str,
    sync_commit: str,
    standbys: list[dict[str, Any]],
    receiver: dict[str, Any] | None,
    delay: float | None,
    pooler: str,
    skew: float,
    round_trip: float,
    listens: bool | None = None,
) -> ServerReport:
    warnings = []
    if standby:
        replication = "standby"
        warnings.append("this server is a standby: writes are refused (read-only)")
    else:
        replication = _replication(standbys, sync_names, sync_commit)
        if replication == "asynchronous":
            warnings.append(
                "no standby is synchronous: a failover can lose the commits acknowledged "
                "in the replication lag (docs/postgres-store.md, Failover)"
            )
        elif replication == "waiting":
            warnings.append(
                "synchronous_standby_names is set but no synchronous standby is attached: "
                "every commit waits"
            )
        elif replication == "unknown":
            warnings.append("standbys are attached but this role cannot see their state")
    if pooler == "transaction" and listens is None:
        warnings.append(
            "behind a transaction pooler: LISTEN needs a direct URL (wake_url, --wake-url)"
        )
    elif pooler == "transaction" and not listens:
        warnings.append(
            "behind a transaction pooler without wake_url: event waits poll instead of "
            "listening (give the server's own URL as wake_url or --wake-url)"
        )
    if abs(skew) > SKEW_WARNING + round_trip / 2:
        warnings.append(f"this host's clock is {skew:+.3f} s off the server's")
    return ServerReport(
        role="standby" if standby else "primary",
        server_version=version,
        replication=replication,
        synchronous_standby_names=sync_names,
        synchronous_commit=sync_commit,
        standbys=standbys,
        receiving_from=receiver,
        replay_delay=delay,
        pooler=pooler,
        clock_skew=round(skew, 6),
        round_trip=round(round_trip, 6),
        warnings=warnings,
    )


def _replication(standbys: list[dict[str, Any]], sync_names: str, sync_commit: str) -> str:
    states = [s.get("sync_state") for s in standbys]
    if bool(sync_names.strip()) and sync_commit not in ("off", "local"):  # commits wait
        if any(state in ("sync", "quorum") for state in states):
            return "synchronous"
        if standbys and all(state is None for state in states):
            return "unknown"
        return "waiting"
    return "asynchronous" if standbys else "none"
