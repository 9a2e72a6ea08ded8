"""``--wake-url`` doubles as a PostgreSQL store's ``wake_url`` (issue 41): behind PgBouncer
in transaction mode the store's URL cannot carry LISTEN, the wake URL (the server's own
address) can. Other stores and other wake URLs leave the store's options alone."""

from __future__ import annotations

from wakeful.cli.services import _listen_options

STORE = "postgresql://app@pgbouncer:6432/agents"
DIRECT = "postgresql://app@db:5432/agents"


def test_a_postgres_wake_url_is_the_postgres_stores_listen_url() -> None:
    assert _listen_options(STORE, DIRECT) == {"wake_url": DIRECT}
    assert _listen_options("postgres://app@pgbouncer/agents", DIRECT) == {"wake_url": DIRECT}


def test_other_stores_and_urls_keep_their_options() -> None:
    assert _listen_options(STORE, None) == {}
    assert _listen_options(STORE, "nats://127.0.0.1:4222") == {}
    assert _listen_options("sqlite:///w.db", DIRECT) == {}
