"""A ``wakeful worker`` SIGKILLed after its webhook POST reached the receiver and before the
delivery was recorded: the next worker POSTs again with the same ``webhook-id`` (the
receiver can deduplicate), never another one (issue 43's acceptance)."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
from pathlib import Path

import pytest

from tests.cli_support import ROOT, WAKEFUL, cli, cli_env
from tests.postgres_support import Databases, open_test_store
from tests.webhook_support import receiver, until
from wakeful import open_store
from wakeful.fleet import submit
from wakeful.fleet.webhook_signing import new_secret, verify
from wakeful.fleet.webhooks import WebhookRecord, recent_webhooks
from wakeful.runtime.webhooks import WEBHOOK_THREAD_PREFIX
from wakeful.store.contract import Store

pytest_plugins = ["tests.postgres_fixtures"]
pytestmark = [pytest.mark.asyncio, pytest.mark.slow]


def worker(url: str, secret: str) -> subprocess.Popen[str]:
    args = ["worker", "--store", url, "--app", "tests.webhook_app:registry", "--ttl", "1"]
    args += ["--poll", "0.05", "--allow-private-webhooks"]
    return subprocess.Popen(
        [WAKEFUL, *args],
        cwd=ROOT,
        env=cli_env(WAKEFUL_WEBHOOK_SECRET=secret),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.mark.timeout(90)
async def test_a_worker_killed_after_the_post_sends_the_same_webhook_id_again(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'store.db'}"
    await killed_after_the_post(url, await open_store(url))


@pytest.mark.postgres
@pytest.mark.timeout(90)
async def test_the_same_on_postgresql(pg_databases: Databases) -> None:
    """The same with workers over PostgreSQL (the fleet's store)."""
    dsn = await pg_databases.clone()
    await killed_after_the_post(dsn, await open_test_store(dsn))


async def killed_after_the_post(url: str, store: Store) -> None:
    """The first worker is SIGKILLed while its POST waits for the receiver's answer."""
    secret = new_secret()
    first = second = None
    try:
        with receiver(hold_first=True) as got:
            first = worker(url, secret)
            await submit(store, "t1", "echo", {"log": ["in"]}, webhook=got.url)
            await until(lambda: got.count() == 1, "the first POST", deadline=30)
            first.send_signal(signal.SIGKILL)  # the receiver has not answered yet
            first.communicate(timeout=10)
            got.release()
            assert await recent_webhooks(store) == [], "the killed attempt recorded nothing"
            second = worker(url, secret)
            await until(lambda: got.count() == 2, "the POST after the lease lapsed", 30)
            records: list[WebhookRecord] = []

            async def delivered() -> bool:
                records[:] = await recent_webhooks(store)
                return bool(records) and records[0].status == "delivered"

            for _ in range(500):
                if await delivered():
                    break
                await asyncio.sleep(0.02)
            assert records and records[0].status == "delivered"
            assert got.count() == 2
        ids = [r.headers["webhook-id"] for r in got.requests]
        assert ids == [records[0].webhook_id] * 2
        for r in got.requests:
            assert verify(secret, r.headers, r.body, now=float(r.headers["webhook-timestamp"]))
        assert got.requests[0].body == got.requests[1].body
        assert json.loads(got.requests[0].body)["data"]["status"] == "completed"
        thread = WEBHOOK_THREAD_PREFIX + records[0].webhook_id
        (d,) = await store.list_dispatches(thread_id=thread)
        assert (d.status, d.attempts) == ("done", 2), "leased twice, settled once"
        assert records[0].attempts == 1, "only the second attempt was recorded"
    finally:
        for child in (first, second):
            if child is not None and child.poll() is None:
                child.send_signal(signal.SIGTERM)
                child.communicate(timeout=30)
        await store.close()


async def test_submit_takes_a_webhook_and_refuses_one_with_credentials(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'store.db'}"
    ok = cli("submit", "t1", "echo", "--webhook", "https://example.com/h", "--json", store=url)
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["payload"]["webhook"] == "https://example.com/h"
    bad = cli("submit", "t2", "echo", "--webhook", "https://u:hunter2@example.com/", store=url)
    assert bad.returncode != 0 and "hunter2" not in bad.stderr + bad.stdout
    assert "credentials" in bad.stderr
    wrong = cli("worker", "--app", "tests.webhook_app:registry", "--webhook-secret", "nope",
                store=url)  # fmt: skip
    assert wrong.returncode == 2 and "whsec_" in wrong.stderr and "nope" not in wrong.stderr
