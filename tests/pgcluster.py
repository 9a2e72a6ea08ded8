"""A private PostgreSQL primary and synchronous standby for the failover test and benchmark.

``Node.init(port)`` runs ``initdb`` into a temp dir, ``Node.standby_of(primary, port)``
runs ``pg_basebackup -R`` from a primary (``primary_conninfo`` and ``standby.signal``
written), ``start``/``kill``/``promote`` do what they say: ``kill`` is SIGKILL to the
postmaster and every backend at once (the server's whole process tree). Servers run as the
``postgres`` OS user when the tests run as root, on loopback ports of their own, never
touching the shared server. Missing binaries skip the test loudly (fail under
``WAKEFUL_REQUIRE_SERVICES=1``).

The primary requires a synchronous standby (``synchronous_standby_names = '*'``,
``synchronous_commit = on``): a commit is acknowledged only once the standby has flushed
its WAL. ``fsync = off`` on both: the test kills processes, never the machine, and the OS
keeps what was written.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import psycopg

from tests.pgbouncer import as_server_user, free_port, hand_to_server_user, missing


def pg_bin(name: str) -> str:
    """``name`` from the newest /usr/lib/postgresql/*/bin, else the PATH."""
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    if found:
        return found[-1]
    on_path = shutil.which(name)
    if on_path is None:
        missing(name, "Install PostgreSQL's server binaries (Debian: postgresql).")
    assert on_path is not None
    return on_path


def require_binaries() -> None:
    for name in ("initdb", "postgres", "pg_basebackup"):
        pg_bin(name)


PRIMARY_CONF = """
listen_addresses = '127.0.0.1'
port = {port}
unix_socket_directories = '{dir}'
wal_level = replica
max_wal_senders = 8
max_replication_slots = 8
hot_standby = on
synchronous_standby_names = '*'
synchronous_commit = on
fsync = off
full_page_writes = off
max_connections = 60
shared_buffers = 32MB
wal_sender_timeout = 5s
wal_receiver_timeout = 5s
wal_receiver_status_interval = 1s
logging_collector = off
"""


@dataclass
class Node:
    """One server: its data directory and port, and its process while running."""

    root: Path
    port: int
    process: subprocess.Popen[bytes] | None = None

    @property
    def data(self) -> Path:
        return self.root / "data"

    def url(self, dbname: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{dbname}"

    @classmethod
    def init(cls, port: int | None = None, extra_conf: str = "") -> Node:
        """A new primary; ``extra_conf`` lines override ``PRIMARY_CONF`` (later wins)."""
        node = cls(Path(tempfile.mkdtemp(prefix="wakeful-pg-")), port or free_port())
        hand_to_server_user(node.root)
        subprocess.run(
            [
                *as_server_user(),
                pg_bin("initdb"),
                "-D",
                str(node.data),
                "-A",
                "trust",
                "-U",
                "postgres",
                "--no-sync",
            ],
            check=True,
            capture_output=True,
            timeout=120,
        )
        node.configure()
        with (node.data / "postgresql.conf").open("a") as f:
            f.write(extra_conf)
        with (node.data / "pg_hba.conf").open("a") as f:
            f.write("host replication all 127.0.0.1/32 trust\n")
        return node

    def configure(self) -> None:
        with (self.data / "postgresql.conf").open("a") as f:
            f.write(PRIMARY_CONF.format(port=self.port, dir=self.root))

    @classmethod
    def standby_of(cls, primary: Node, root: Path | None = None, port: int | None = None) -> Node:
        """A fresh copy of ``primary`` (``pg_basebackup -R``) that follows it."""
        node = cls(root or Path(tempfile.mkdtemp(prefix="wakeful-pg-")), port or free_port())
        if node.data.exists():
            shutil.rmtree(node.data)
        hand_to_server_user(node.root)
        subprocess.run(
            [
                *as_server_user(),
                pg_bin("pg_basebackup"),
                "-h",
                "127.0.0.1",
                "-p",
                str(primary.port),
                "-U",
                "postgres",
                "-D",
                str(node.data),
                "-R",
                "-X",
                "stream",
                "-c",
                "fast",
                "--no-sync",
            ],
            check=True,
            capture_output=True,
            timeout=120,
        )
        with (node.data / "postgresql.auto.conf").open("a") as f:
            f.write(f"port = {node.port}\nunix_socket_directories = '{node.root}'\n")
        return node

    def start(self, deadline: float = 60.0) -> None:
        log = self.root / "server.log"
        hand_to_server_user(self.root)
        with log.open("ab") as sink:  # the server keeps its own copy of the descriptor
            self.process = subprocess.Popen(
                [*as_server_user(), pg_bin("postgres"), "-D", str(self.data)],
                stdout=subprocess.DEVNULL,
                stderr=sink,
                start_new_session=True,  # away from the test's terminal signals
            )
        end = time.monotonic() + deadline
        while True:
            try:
                with psycopg.connect(self.url(), connect_timeout=2) as conn:
                    conn.execute("SELECT 1")
                return
            except psycopg.Error:
                if self.process.poll() is not None or time.monotonic() > end:
                    raise RuntimeError(
                        f"PostgreSQL on {self.port} did not start: {log.read_text()[-3000:]}"
                    ) from None
                time.sleep(0.05)

    def kill(self) -> None:
        """SIGKILL to the postmaster and every backend at once (the machine died)."""
        if self.process is not None and self.process.poll() is None:
            killed = list(self._stats())
            for pid in killed:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            self.process.wait(timeout=30)
            _wait_dead(killed)
            # A killed postmaster orphaned by its runuser parent may linger as a zombie that
            # this machine's init does not reap at once; a restart would then take its lock
            # files for a live server's. It is dead: its locks go, as an operator's would.
            for lock in (self.data / "postmaster.pid", self.root / f".s.PGSQL.{self.port}.lock"):
                lock.unlink(missing_ok=True)
        self.process = None

    def promote(self) -> None:
        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute("SELECT pg_promote(wait => true, wait_seconds => 30)")

    def set_synchronous(self, names: str, deadline: float = 30.0) -> None:
        """``synchronous_standby_names`` on this (primary) server, reloaded: returns once a
        new session sees it (``pg_reload_conf`` only signals the postmaster; sessions
        already open take it at their next statement after their own signal)."""
        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f"ALTER SYSTEM SET synchronous_standby_names = '{names}'")
            conn.execute("SELECT pg_reload_conf()")
        end = time.monotonic() + deadline
        while True:
            with psycopg.connect(self.url(), autocommit=True) as conn:
                row = conn.execute("SHOW synchronous_standby_names").fetchone()
            if row is not None and row[0] == names:
                return
            assert time.monotonic() < end, "the configuration was not reloaded"
            time.sleep(0.02)

    def wait_synchronous_standby(self, deadline: float = 60.0) -> None:
        end = time.monotonic() + deadline
        with psycopg.connect(self.url(), autocommit=True) as conn:
            while True:
                row = conn.execute(
                    "SELECT count(*) FROM pg_stat_replication WHERE sync_state = 'sync'"
                ).fetchone()
                if row is not None and row[0] > 0:
                    return
                assert time.monotonic() < end, "no synchronous standby attached"
                time.sleep(0.05)

    def _stats(self) -> dict[int, list[str]]:
        """``/proc/<pid>/stat`` fields (after the command name) of every process of this
        server: the process started and all its descendants. (Each backend calls setsid(),
        so the process group does not reach them; the parent links do.)"""
        stats: dict[int, list[str]] = {}
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                text = stat.read_text()
            except OSError:
                continue
            stats[int(stat.parent.name)] = text[text.rindex(")") + 2 :].split()
        if self.process is None:
            return {}
        found = {self.process.pid}
        grew = True
        while grew:
            grew = False
            for pid, fields in stats.items():
                if pid not in found and int(fields[1]) in found:  # ppid
                    found.add(pid)
                    grew = True
        return {pid: stats[pid] for pid in found if pid in stats}

    def cpu_seconds(self) -> float:
        """CPU time (user + system) of every process of this server so far, exited
        backends included (the postmaster's reaped children), from /proc."""
        ticks = sum(sum(int(f) for f in fields[11:15]) for fields in self._stats().values())
        return ticks / os.sysconf("SC_CLK_TCK")

    def remove(self) -> None:
        self.kill()
        shutil.rmtree(self.root, ignore_errors=True)


def _wait_dead(pids: list[int], deadline: float = 10.0) -> None:
    """Until each of ``pids`` is gone or a zombie (dead, whoever reaps it)."""
    end = time.monotonic() + deadline
    for pid in pids:
        while time.monotonic() < end:
            try:
                state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            except (FileNotFoundError, ProcessLookupError, IndexError):
                break
            if state in ("Z", "X"):
                break
            time.sleep(0.01)
