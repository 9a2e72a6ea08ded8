"""Which driver errors are worth retrying (issue 35, item 6): a server that cannot take a
session *now* (starting up, replaying its WAL, shutting down, at its connection limit) is
``StoreUnavailable`` (retryable, CLI exit 5), not ``StoreRefused`` (exit 6).

The translator is tested with psycopg's own error classes and libpq's message text; the open
path against a loopback server speaking the PostgreSQL protocol that refuses every session
with the startup packet's reply a real server sends (a server replaying its WAL cannot be
made cheaply on demand)."""

from __future__ import annotations

import socket
import socketserver
import struct
import threading
from collections.abc import Iterator

import psycopg
import psycopg.errors
import pytest

from tests.cli_support import cli
from wakeful.errors import StoreRefused, StoreUnavailable
from wakeful.store import open_store
from wakeful.store.postgres import connection
from wakeful.store.postgres.translate import connect_error, is_disconnect, is_transient

WHERE = "PostgreSQL at 127.0.0.1:5432/app"


def _libpq(fatal: str, detail: str | None = None) -> psycopg.OperationalError:
    """A refused connection as psycopg raises it: no SQLSTATE, libpq's text."""
    text = (
        f'connection failed: connection to server at "127.0.0.1", port 5432 failed: FATAL:  {fatal}'
    )
    if detail:
        text += f"\nDETAIL:  {detail}"
    return psycopg.OperationalError(text)


@pytest.mark.parametrize(
    ("fatal", "detail"),
    [
        (
            "the database system is not yet accepting connections",
            "Consistent recovery state has not been yet reached.",
        ),
        ("the database system is starting up", None),
        ("the database system is shutting down", None),
        ("the database system is in recovery mode", None),
        ("the database system is not accepting connections", "Hot standby mode is disabled."),
        ("sorry, too many clients already", None),
        ("remaining connection slots are reserved for roles with the SUPERUSER attribute", None),
        ('too many connections for role "app"', None),
        ("terminating connection due to administrator command", None),
        ("terminating connection because of crash of another server process", None),
    ],
)
def test_a_server_that_cannot_take_a_session_now_is_unavailable(
    fatal: str, detail: str | None
) -> None:
    error = connect_error(_libpq(fatal, detail), WHERE, reached=True)
    assert isinstance(error, StoreUnavailable) and error.retryable
    assert fatal in str(error) and WHERE in str(error)


@pytest.mark.parametrize(
    "fatal",
    [
        'database "app" does not exist',
        'password authentication failed for user "app"',
        'no pg_hba.conf entry for host "10.0.0.1", user "app", database "app", no encryption',
        'role "app" does not exist',
    ],
)
def test_a_refusal_that_retrying_cannot_fix_stays_refused(fatal: str) -> None:
    error = connect_error(_libpq(fatal), WHERE, reached=True)
    assert isinstance(error, StoreRefused) and not error.retryable


@pytest.mark.parametrize("code", ["57P01", "57P02", "57P03", "53300"])
def test_a_refusal_with_its_sqlstate_is_judged_by_it(code: str) -> None:
    # the message in another language: only the SQLSTATE says what happened
    error = connect_error(psycopg.errors.lookup(code)("FATAL: le système..."), WHERE, True)
    assert isinstance(error, StoreUnavailable)


def test_an_unreachable_server_is_unavailable() -> None:
    error = connect_error(psycopg.OperationalError("Connection refused"), WHERE, reached=False)
    assert isinstance(error, StoreUnavailable)


@pytest.mark.parametrize(
    "code", ["08006", "08001", "57P01", "57P02", "57P03", "57P04", "57P05", "25P03", "57014"]
)
def test_a_session_the_server_ended_is_a_disconnect(code: str) -> None:
    # 25P03: the server ended a session left idle in a transaction (see
    # test_postgres_idle_bound); an InternalError, not an OperationalError
    assert is_disconnect(psycopg.errors.lookup(code)("gone"))


@pytest.mark.parametrize("code", ["40001", "40P01", "55P03", "23505"])
def test_a_rolled_back_conflict_is_retried_in_place(code: str) -> None:
    # (Database.run asks is_transient first: some of these are OperationalErrors too)
    assert is_transient(psycopg.errors.lookup(code)("conflict"))


# ---------------------------------------------------------------- a server that refuses


def _message(kind: bytes, body: bytes) -> bytes:
    return kind + struct.pack("!I", len(body) + 4) + body


class RefusingServer(socketserver.ThreadingTCPServer):
    """A loopback 'PostgreSQL' that answers every session's startup packet with the
    ``FATAL`` error set by ``refuse``, as a starting (or misconfigured) server does."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Refusing)
        self.port = int(self.server_address[1])
        self.error = b""

    def refuse(self, code: str, message: str) -> str:
        """Refuse with SQLSTATE ``code`` and ``message`` from now on; the URL to open."""
        fields = {b"S": "FATAL", b"V": "FATAL", b"C": code, b"M": message}
        self.error = b"".join(k + v.encode() + b"\0" for k, v in fields.items()) + b"\0"
        return f"postgresql://app@127.0.0.1:{self.port}/app?sslmode=disable&connect_timeout=5"


class _Refusing(socketserver.BaseRequestHandler):
    server: RefusingServer

    def handle(self) -> None:
        sock = self.request
        while True:
            head = sock.recv(8, socket.MSG_WAITALL)
            if len(head) < 8:  # a bare TCP probe (is anything listening?)
                return
            length, code = struct.unpack("!II", head)
            if code in (80877103, 80877104):  # SSLRequest, GSSENCRequest: not here
                sock.sendall(b"N")
                continue
            sock.recv(length - 8, socket.MSG_WAITALL)  # the startup packet's parameters
            sock.sendall(_message(b"E", self.server.error))
            return


@pytest.fixture
def refusing() -> Iterator[RefusingServer]:
    server = RefusingServer()
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


@pytest.mark.asyncio
async def test_opening_while_the_server_replays_its_wal_is_unavailable(
    refusing: RefusingServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(connection, "REFUSAL_RETRIES", (0.01,))
    url = refusing.refuse("57P03", "the database system is not yet accepting connections")
    with pytest.raises(StoreUnavailable, match="not yet accepting connections"):
        async with open_store(url):
            pass
    url = refusing.refuse("3D000", 'database "app" does not exist')
    with pytest.raises(StoreRefused, match="does not exist"):
        async with open_store(url):
            pass


def test_the_cli_exits_5_while_the_server_starts_up(refusing: RefusingServer) -> None:
    url = refusing.refuse("57P03", "the database system is starting up")
    done = cli("threads", "list", store=url)
    assert done.returncode == 5, done.stderr
    assert "the database system is starting up" in done.stderr
