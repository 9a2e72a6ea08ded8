"""Access to the machine's services for tests.

A test that needs PostgreSQL or NATS calls ``postgres_dsn()`` or ``nats_url()``. When the
service does not answer, the test is skipped with a loud reason, unless
``WAKEFUL_REQUIRE_SERVICES=1`` (as in CI), where it fails instead.
"""

from __future__ import annotations

import os
import socket

import pytest

POSTGRES_HOST = os.environ.get("WAKEFUL_TEST_PG_HOST", "127.0.0.1")
POSTGRES_PORT = int(os.environ.get("WAKEFUL_TEST_PG_PORT", "5432"))
POSTGRES_USER = os.environ.get("WAKEFUL_TEST_PG_USER", "postgres")
NATS_HOST = os.environ.get("WAKEFUL_TEST_NATS_HOST", "127.0.0.1")
NATS_PORT = int(os.environ.get("WAKEFUL_TEST_NATS_PORT", "4222"))


def services_required() -> bool:
    return os.environ.get("WAKEFUL_REQUIRE_SERVICES") == "1"


def _answers(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=2):
            return True
    except OSError:
        return False


def _unavailable(name: str, host: str, port: int) -> None:
    message = (
        f"!!! {name} does not answer on {host}:{port}: the tests that need it are NOT run. "
        f"Start {name} (see README) to run them."
    )
    if services_required():
        pytest.fail(message + " WAKEFUL_REQUIRE_SERVICES=1 makes this a failure.")
    pytest.skip(message)


def postgres_dsn(dbname: str = "postgres") -> str:
    if not _answers(POSTGRES_HOST, POSTGRES_PORT):
        _unavailable("PostgreSQL", POSTGRES_HOST, POSTGRES_PORT)
    return f"postgresql://{POSTGRES_USER}@{POSTGRES_HOST}:{POSTGRES_PORT}/{dbname}"


def nats_url() -> str:
    if not _answers(NATS_HOST, NATS_PORT):
        _unavailable("NATS", NATS_HOST, NATS_PORT)
    return f"nats://{NATS_HOST}:{NATS_PORT}"
