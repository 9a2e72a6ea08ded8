"""A private PgBouncer for tests, in front of the shared PostgreSQL.

``PgBouncer.start(mode)`` runs ``/usr/sbin/pgbouncer`` (or the one on the PATH) on a free
loopback port with its own config in a temp dir, every database name forwarded to
127.0.0.1:5432 as the ``postgres`` role (``auth_type = any``), in ``pool_mode`` ``mode``.
PostgreSQL refuses no one here; PgBouncer only connects to it as a client. Missing
``pgbouncer`` skips the test loudly, or fails it under ``WAKEFUL_REQUIRE_SERVICES=1``
(``tests/services.py``). Server processes never run as root: as ``postgres`` when the tests
do.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.services import POSTGRES_HOST, POSTGRES_PORT, POSTGRES_USER, services_required


def missing(tool: str, how: str) -> None:
    """Skip loudly (fail under WAKEFUL_REQUIRE_SERVICES=1): ``tool`` is not installed."""
    message = f"!!! {tool} is not installed: the tests that need it are NOT run. {how}"
    if services_required():
        pytest.fail(message + " WAKEFUL_REQUIRE_SERVICES=1 makes this a failure.")
    pytest.skip(message)


def pgbouncer_binary() -> str:
    found = shutil.which("pgbouncer") or (
        "/usr/sbin/pgbouncer" if Path("/usr/sbin/pgbouncer").exists() else None
    )
    if found is None:
        missing("pgbouncer", "Install it (Debian: apt-get install pgbouncer; .ci/run does).")
    assert found is not None
    return found


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def as_server_user() -> list[str]:
    """The prefix that runs a server process as ``postgres`` when the tests run as root."""
    return ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []


def hand_to_server_user(path: Path) -> None:
    if os.geteuid() == 0:
        entry = pwd.getpwnam("postgres")
        for p in [path, *path.rglob("*")]:
            os.chown(p, entry.pw_uid, entry.pw_gid)


def wait_port(port: int, deadline: float = 20.0) -> None:
    end = time.monotonic() + deadline
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            if time.monotonic() > end:
                raise
            time.sleep(0.05)


CONFIG = """\
[databases]
* = host={host} port={pg_port} user={user}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {port}
unix_socket_dir =
auth_type = any
pool_mode = {mode}
max_client_conn = 1000
default_pool_size = {pool_size}
min_pool_size = 0
server_reset_query =
ignore_startup_parameters = extra_float_digits,options
logfile = {dir}/pgbouncer.log
pidfile = {dir}/pgbouncer.pid
admin_users = {user}
"""


@dataclass
class PgBouncer:
    """A running PgBouncer; ``url(dbname)`` reaches ``dbname`` on the shared server."""

    port: int
    directory: Path
    process: subprocess.Popen[bytes]

    @classmethod
    def start(cls, mode: str = "transaction", pool_size: int = 20) -> PgBouncer:
        binary = pgbouncer_binary()
        directory = Path(tempfile.mkdtemp(prefix="wakeful-pgbouncer-"))
        port = free_port()
        (directory / "pgbouncer.ini").write_text(
            CONFIG.format(
                host=POSTGRES_HOST,
                pg_port=POSTGRES_PORT,
                user=POSTGRES_USER,
                port=port,
                mode=mode,
                pool_size=pool_size,
                dir=directory,
            )
        )
        hand_to_server_user(directory)
        process = subprocess.Popen(
            [*as_server_user(), binary, str(directory / "pgbouncer.ini")],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,  # it logs to its logfile
        )
        try:
            wait_port(port)
        except OSError:
            process.kill()
            process.wait(timeout=10)
            log = directory / "pgbouncer.log"
            raise RuntimeError(
                f"pgbouncer did not start: {log.read_text()[-2000:] if log.exists() else ''}"
            ) from None
        return cls(port, directory, process)

    def url(self, dbname: str) -> str:
        return f"postgresql://{POSTGRES_USER}@127.0.0.1:{self.port}/{dbname}"

    def stop(self) -> None:
        if self.process.poll() is None:
            # runuser forwards SIGTERM to pgbouncer; SIGINT would wait for clients
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        shutil.rmtree(self.directory, ignore_errors=True)
