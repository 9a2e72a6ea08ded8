"""Webhooks when a run ends (issue 43): a worker POSTs the ending's signed body to a real
loopback receiver through the outbox, retries with backoff by the store's clock (a manual
one here), gives up after a day, and refuses private addresses unless allowed."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any, TypedDict

import pytest
import pytest_asyncio

from tests.webhook_support import certificates, receiver, until
from wakeful import ManualClock, open_store
from wakeful.fleet import LocalWake, Registry, Worker, submit
from wakeful.fleet.relay import RelayLoop
from wakeful.fleet.webhook_signing import new_secret, verify
from wakeful.fleet.webhooks import (
    WebhookConfig,
    WebhookRecord,
    prune_webhooks,
    recent_webhooks,
    webhook_counts,
)
from wakeful.records import RetentionPolicy
from wakeful.runtime import START, ClaimPolicy, Graph, Runtime, append
from wakeful.store.contract import Store
from wakeful.store.listing import is_internal_thread, list_threads
from wakeful.store.memory import MemoryStore

pytestmark = pytest.mark.asyncio
SECRET = new_secret()


class State(TypedDict):
    log: Annotated[list[str], append]


def echo(state: dict[str, Any]) -> dict[str, Any]:
    return {"log": ["echoed"]}


def boom(state: dict[str, Any]) -> dict[str, Any]:
    raise RuntimeError("the node broke")


class Env:
    def __init__(self, clock: ManualClock | None = None, store: Store | None = None) -> None:
        self.clock = clock or ManualClock()
        self.store = store or MemoryStore(self.clock)
        self.wake = LocalWake()
        self.registry = Registry()
        self.registry.add(
            "echo", Graph(State, name="echo").node("e", echo).edge(START, "e").compile()
        )
        self.registry.add(
            "boom", Graph(State, name="boom").node("b", boom).edge(START, "b").compile()
        )
        self.tasks: list[tuple[Worker, asyncio.Task[None]]] = []

    def start(self, config: WebhookConfig) -> Worker:
        worker = Worker(
            self.store,
            self.registry,
            claims=ClaimPolicy(ttl=30, renew_every=10),
            wake=self.wake,
            clock=self.clock,
            poll_interval=0.02,
            webhooks=config,
        )
        self.tasks.append((worker, asyncio.create_task(worker.run())))
        return worker

    async def records(self) -> list[WebhookRecord]:
        return await recent_webhooks(self.store)

    async def record(self) -> WebhookRecord | None:
        found = await self.records()
        return found[0] if found else None


@asynccontextmanager
async def rig(backend: str, tmp_path: Path) -> AsyncIterator[Env]:
    clock = ManualClock()
    urls = {
        "memory": "memory://",
        "file": f"file://{tmp_path}/store",
        "sqlite": f"sqlite:///{tmp_path}/store.db",
    }
    made = Env(clock, await open_store(urls[backend], clock=clock))
    try:
        yield made
    finally:
        for worker, task in made.tasks:
            await worker.stop(grace=1)
            await task
        await made.store.close()


@pytest_asyncio.fixture
async def env(tmp_path: Path) -> AsyncIterator[Env]:
    async with rig("memory", tmp_path) as made:
        yield made


@pytest_asyncio.fixture(params=["memory", "file", "sqlite"])
async def every_env(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Env]:
    """The rig over each local backend (PostgreSQL: ``test_webhooks_postgres.py``)."""
    async with rig(request.param, tmp_path) as made:
        yield made


def allowed() -> WebhookConfig:
    return WebhookConfig(secrets=(SECRET,), allow_private=True)


async def attempts_recorded(env: Env, n: int, status: str) -> WebhookRecord:
    """Wait until the delivery's record shows ``n`` attempts with ``status``."""
    holder: list[WebhookRecord] = []

    async def check() -> bool:
        record = await env.record()
        if record is not None and record.attempts == n and record.status == status:
            holder.append(record)
            return True
        return False

    for _ in range(1000):
        if await check():
            return holder[0]
        await asyncio.sleep(0.02)
    raise AssertionError(f"no record of {n} attempts {status}: {await env.record()}")


async def test_500_twice_then_200_one_id_three_attempts_valid_signatures(every_env: Env) -> None:
    env = every_env
    with receiver([500, 500]) as got:
        worker = env.start(allowed())
        await submit(env.store, "t1", "echo", {"log": ["in"]}, webhook=got.url, wake=env.wake)
        first = await attempts_recorded(env, 1, "pending")
        assert first.last_status == 500 and first.last_error is not None
        assert first.next_attempt_at is not None
        due = datetime.fromisoformat(first.next_attempt_at)
        assert (due - env.clock.now()).total_seconds() == pytest.approx(5.0)
        await asyncio.sleep(0.2)
        assert got.count() == 1, "the retry waits for the store's clock"
        env.clock.advance(5)
        second = await attempts_recorded(env, 2, "pending")
        assert second.next_attempt_at is not None
        env.clock.set(datetime.fromisoformat(second.next_attempt_at))
        done = await attempts_recorded(env, 3, "delivered")
    assert got.count() == 3
    ids = {r.headers["webhook-id"] for r in got.requests}
    assert ids == {done.webhook_id}
    stamps = [int(r.headers["webhook-timestamp"]) for r in got.requests]
    assert stamps == sorted(stamps) and len(set(stamps)) == 3, "a timestamp per attempt"
    for r in got.requests:
        assert verify(SECRET, r.headers, r.body, now=float(r.headers["webhook-timestamp"]))
        assert not verify(
            new_secret(), r.headers, r.body, now=float(r.headers["webhook-timestamp"])
        )
        assert r.headers["content-type"] == "application/json"
    assert len({r.body for r in got.requests}) == 1, "every attempt sends the same body"
    body = json.loads(got.requests[0].body)
    assert body["type"] == "run.completed"
    data = body["data"]
    assert (data["thread_id"], data["run_id"], data["status"]) == ("t1", done.run_id, "completed")
    assert data["output"] == {"log": ["in", "echoed"]}
    assert data["links"]["thread"] == "/v1/threads/t1"
    assert done.url.endswith("/hook?…"), "the token in the query string is not shown"
    counted = worker.metrics.webhooks.value  # counted right after the record is committed
    await until(lambda: counted(outcome="delivered") == 1, "the delivery counted")
    assert counted(outcome="failed") == 2
    assert await webhook_counts(env.store) == {"pending": 0, "delivered": 1, "dead": 0}
    # the delivery's record is a thread of the store's, but not of a user's listing
    stored = [t.thread_id for t in await env.store.list_threads()]
    assert stored[0] == "t1" and len(stored) == 2 and is_internal_thread(stored[1])
    assert [t.thread_id for t in await list_threads(env.store)] == ["t1"]
    assert [t.thread_id for t in await list_threads(env.store, internal=True)] == stored


async def test_backoff_doubles_from_5_s_to_an_hour_and_gives_up_after_a_day(
    env: Env, caplog: pytest.LogCaptureFixture
) -> None:
    with receiver([500] * 100) as got:
        env.start(allowed())
        await submit(env.store, "t1", "echo", webhook=got.url, wake=env.wake)
        start = env.clock.now()
        delays: list[float] = []
        n = 1
        while True:
            record = await attempts_recorded(env, n, "pending" if n < 40 else "dead")
            if record.status == "dead" or record.next_attempt_at is None:
                break
            due = datetime.fromisoformat(record.next_attempt_at)
            delays.append((due - env.clock.now()).total_seconds())
            env.clock.set(due)
            n += 1
            if (due - start).total_seconds() >= 24 * 3600:
                record = await attempts_recorded(env, n, "dead")
                break
    assert delays[:11] == [5, 10, 20, 40, 80, 160, 320, 640, 1280, 2560, 3600]
    assert all(d == 3600 for d in delays[11:-1]) and 0 < delays[-1] <= 3600
    assert sum(delays) == pytest.approx(24 * 3600), "the last attempt is at the deadline"
    assert record.status == "dead" and record.attempts == len(delays) + 1 == got.count()
    assert record.last_error is not None and "HTTP 500" in record.last_error
    assert await webhook_counts(env.store) == {"pending": 0, "delivered": 0, "dead": 1}
    env.clock.advance(7 * 24 * 3600)
    await asyncio.sleep(0.3)
    assert got.count() == record.attempts, "a dead webhook is not sent again"
    lines = [r.getMessage() for r in caplog.records if r.name == "wakeful.fleet"]
    assert any("retrying in 3600.0 s" in line for line in lines)
    assert not any("no attempt left" in line for line in lines), "time is the budget"


async def test_a_private_address_is_refused_without_the_flag(env: Env) -> None:
    with receiver() as got:
        worker = env.start(WebhookConfig(secrets=(SECRET,)))
        await submit(env.store, "t1", "echo", webhook=got.url, wake=env.wake)
        record = await attempts_recorded(env, 0, "dead")
        await asyncio.sleep(0.2)
        assert got.count() == 0
    assert record.last_error is not None and "refused" in record.last_error
    assert "127.0.0.1" in record.last_error and "--allow-private-webhooks" in record.last_error
    await until(lambda: worker.metrics.webhooks.value(outcome="dead") == 1, "the refusal counted")


async def test_failed_and_suspended_runs_send_theirs_and_a_run_without_a_url_none(
    env: Env,
) -> None:
    with receiver() as got:
        env.start(allowed())
        await submit(env.store, "plain", "echo", wake=env.wake)
        await submit(env.store, "t-boom", "boom", webhook=got.url, wake=env.wake)
        await until(lambda: got.count() == 1, "the failed run's webhook")
        await asyncio.sleep(0.2)
    assert got.count() == 1
    data = json.loads(got.requests[0].body)["data"]
    assert data["status"] == "failed" and "the node broke" in data["error"]
    assert data["thread_id"] == "t-boom"


async def test_a_registry_target_webhook_is_used_when_the_submission_names_none(
    env: Env,
) -> None:
    with receiver() as got:
        graph = Graph(State, name="hooked").node("e", echo).edge(START, "e").compile()
        env.registry.add("hooked", graph, webhook=got.url)
        env.start(allowed())
        await submit(env.store, "t1", "hooked", wake=env.wake)
        await until(lambda: got.count() == 1, "the target's webhook")


async def test_a_replay_sends_its_webhook_and_a_bad_url_put_in_metadata_is_refused(
    env: Env,
) -> None:
    with receiver() as got:
        env.start(allowed())
        await submit(env.store, "t1", "echo", wake=env.wake)
        snap = None
        for _ in range(500):
            snap = await env.store.read("t1")
            if snap and snap.checkpoint and snap.checkpoint.status == "completed":
                break
            await asyncio.sleep(0.02)
        assert snap is not None and snap.checkpoint is not None
        first = snap.checkpoint.id
        assert got.count() == 0, "no webhook was asked for"
        await submit(env.store, "t1", "echo", from_checkpoint=first, webhook=got.url, wake=env.wake)
        await until(lambda: got.count() == 1, "the replay's webhook")
        runtime = Runtime(env.store, ClaimPolicy(ttl=30, renew_every=10), env.clock)
        graph = env.registry.get("echo").graph
        handle = await runtime.start("t2", graph, {}, metadata={"webhook": "ftp://x/y"})
        await handle.result()
        for _ in range(500):
            records = {r.thread_id: r for r in await env.records()}
            if "t2" in records and records["t2"].status == "dead":
                break
            await asyncio.sleep(0.02)
    assert records["t2"].status == "dead" and records["t2"].attempts == 0
    assert (
        records["t2"].last_error is not None and "http:// or https://" in records["t2"].last_error
    )
    assert records["t1"].status == "delivered"
    assert json.loads(got.requests[0].body)["data"]["thread_id"] == "t1"


async def test_the_relay_sweep_deletes_finished_deliveries_as_old_as_settled_dispatches(
    env: Env,
) -> None:
    with receiver() as ok, receiver([500] * 10) as failing:
        env.start(allowed())
        await submit(env.store, "t1", "echo", webhook=ok.url, wake=env.wake)
        await submit(env.store, "t2", "echo", webhook=failing.url, wake=env.wake)
        for _ in range(500):
            if sorted(r.status for r in await env.records()) == ["delivered", "pending"]:
                break
            await asyncio.sleep(0.02)
        for worker, task in env.tasks:  # its relay (no retention) gives up the election
            await worker.stop(grace=1)
            await task
        env.tasks.clear()
    env.clock.advance(3600)
    policy = RetentionPolicy(settled_dispatch_max_age=1800)
    relay = RelayLoop(env.store, "sweeper", ClaimPolicy(ttl=30, renew_every=10), env.wake, policy)
    stop = asyncio.Event()
    sweeping = asyncio.create_task(relay.run(stop))
    try:
        for _ in range(500):
            if len(await env.records()) == 1:
                break
            await asyncio.sleep(0.02)
    finally:
        stop.set()
        await sweeping
    (left,) = await env.records()
    assert (left.thread_id, left.status) == ("t2", "pending"), "a pending delivery stays"
    assert await prune_webhooks(env.store, 1800) == 0


async def test_an_unreachable_or_silent_receiver_is_a_failed_attempt_retried(env: Env) -> None:
    from tests.cli_support import free_port

    with receiver(hold_first=True) as silent:
        config = WebhookConfig(secrets=(SECRET,), allow_private=True, timeout=0.3)
        env.start(config)
        closed = f"http://127.0.0.1:{free_port()}/hook?token=s3cret"
        await submit(env.store, "t1", "echo", webhook=closed, wake=env.wake)
        await submit(env.store, "t2", "echo", webhook=silent.url, wake=env.wake)
        records: dict[str, WebhookRecord] = {}
        for _ in range(500):
            records = {r.thread_id: r for r in await env.records()}
            if len(records) == 2 and all(r.status == "pending" for r in records.values()):
                break
            await asyncio.sleep(0.02)
    refused, silence = records["t1"], records["t2"]
    assert refused.last_error is not None and "ConnectError" in refused.last_error
    assert silence.last_error is not None and "Timeout" in silence.last_error
    assert "s3cret" not in refused.last_error and refused.last_status is None
    assert refused.attempts == silence.attempts == 1 and refused.next_attempt_at is not None


async def test_a_host_name_is_resolved_once_and_the_request_keeps_its_name(env: Env) -> None:
    """``localhost`` is checked (a private address: refused without the flag), then the
    connection goes to the address checked, with the URL's name in ``Host``."""
    with receiver() as got:
        port = got.url.split(":")[2].split("/")[0]
        named = f"http://localhost:{port}/hook"
        env.start(WebhookConfig(secrets=(SECRET,)))
        await submit(env.store, "t1", "echo", webhook=named, wake=env.wake)
        refused = await attempts_recorded(env, 0, "dead")
        assert refused.last_error is not None and "localhost resolves to" in refused.last_error
        for worker, task in env.tasks:
            await worker.stop(grace=1)
            await task
        env.tasks.clear()
        env.start(allowed())
        await submit(env.store, "t2", "echo", webhook=named, wake=env.wake)
        await until(lambda: got.count() == 1, "the POST to localhost")
    assert got.requests[0].headers["host"] == f"localhost:{port}"


async def test_https_keeps_verifying_the_name_s_certificate(env: Env, tmp_path: Path) -> None:
    """The connection goes to the checked address, and the certificate is still verified
    for the URL's name (TLS server name): a receiver whose certificate chains to the
    configured CA gets the POST; without that CA the attempt fails."""
    ca, cert, key = certificates(tmp_path)
    with receiver(tls=(cert, key)) as got:
        env.start(WebhookConfig(secrets=(SECRET,), allow_private=True))
        await submit(env.store, "t1", "echo", webhook=got.url, wake=env.wake)
        failed = await attempts_recorded(env, 1, "pending")
        assert failed.last_error is not None and "CERTIFICATE_VERIFY_FAILED" in failed.last_error
        for worker, task in env.tasks:
            await worker.stop(grace=1)
            await task
        env.tasks.clear()
        env.start(WebhookConfig(secrets=(SECRET,), allow_private=True, ca_file=str(ca)))
        env.clock.advance(5)
        await attempts_recorded(env, 2, "delivered")
    assert got.count() == 1 and got.requests[0].headers["host"] == got.url.split("/")[2]
