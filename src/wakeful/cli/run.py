"""Commands that run things: demo, worker, relay, run, serve, hand, migrate, bench."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import subprocess
import sys
import uuid
from typing import Any

import click

from wakeful.cli.common import (
    EXIT_FAILED,
    console,
    emit,
    json_option,
    load_object,
    run_async,
    store_option,
    store_url,
)


@click.command()
@click.option("--claims", is_flag=True, help="The short claims story on the memory store.")
def demo(claims: bool) -> None:
    """Crash a worker mid-stream and watch a replacement recover the run."""
    if claims:
        from wakeful.demo.claims import story

        sys.exit(asyncio.run(story()))
    from wakeful.demo.story import story as crash_story

    sys.exit(asyncio.run(crash_story(console.print)))


def _wake(kind: str, url: str | None) -> Any:
    from wakeful.fleet.wake import LocalWake, NoWake

    if kind == "postgres":
        from wakeful.fleet.pgwake import PostgresWake

        if not url:
            raise click.BadParameter("--wake postgres needs --wake-url postgresql://...")
        return PostgresWake(url)
    if kind == "nats":
        from wakeful.fleet.natswake import NatsWake

        return NatsWake(url or "nats://127.0.0.1:4222")
    return LocalWake() if kind == "local" else NoWake()


def _live(kind: str, url: str | None, store: str) -> Any:
    from wakeful.fleet.livechannels import open_live

    if kind == "postgres" and not url:
        url = store if store.startswith(("postgresql:", "postgres:")) else None
    try:
        return open_live(kind, url)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--live-url") from None


async def _until_signalled() -> None:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()


@click.command()
@store_option
@click.option("--app", "app", required=True, metavar="MODULE:REGISTRY", help="The registry.")
@click.option("--concurrency", default=4, show_default=True)
@click.option("--worker-id", default=None)
@click.option("--ttl", default=30.0, show_default=True, help="Lease ttl in seconds.")
@click.option("--poll", default=1.0, show_default=True, help="Polling floor in seconds.")
@click.option("--wake", type=click.Choice(["none", "local", "postgres", "nats"]), default="none")
@click.option("--wake-url", default=None)
@click.option("--grace", default=10.0, show_default=True, help="Shutdown grace in seconds.")
@click.option("--metrics-port", default=None, type=int, help="Serve /metrics on this port.")
@click.option(
    "--live",
    type=click.Choice(["none", "postgres", "nats"]),
    default="none",
    help="Publish model deltas for stream servers (docs/http-api.md, stream modes).",
)
@click.option("--live-url", default=None, help="The live channel's URL (postgres: the store's).")
@run_async
async def worker(
    store: str | None,
    app: str,
    concurrency: int,
    worker_id: str | None,
    ttl: float,
    poll: float,
    wake: str,
    wake_url: str | None,
    grace: float,
    metrics_port: int | None,
    live: str,
    live_url: str | None,
) -> None:
    """Claim and run dispatches until SIGTERM (then stop gracefully)."""
    from wakeful import open_store
    from wakeful.fleet import Worker
    from wakeful.runtime import ClaimPolicy

    registry = load_object(app)
    channel = _live(live, live_url, store_url(store))
    async with open_store(store_url(store)) as opened:
        w = Worker(
            opened,
            registry,
            concurrency=concurrency,
            claims=ClaimPolicy(ttl=ttl, renew_every=ttl / 3),
            wake=_wake(wake, wake_url),
            worker_id=worker_id or f"worker-{uuid.uuid4().hex[:12]}",
            poll_interval=poll,
            live=channel,
        )
        running = asyncio.create_task(w.run())
        exporter = None
        if metrics_port is not None:
            from wakeful.metrics import serve_metrics

            exporter = await serve_metrics(w.metrics, "0.0.0.0", metrics_port)
        console.print(f"worker {w.worker_id} running on {store_url(store)}; SIGTERM stops it")
        await _until_signalled()
        await w.stop(grace)
        await running
        if exporter is not None:
            exporter.close()
            await exporter.wait_closed()
        if channel is not None:
            await channel.close()
        console.print(f"stopped: {w.stats}")


@click.command()
@store_option
@run_async
async def relay(store: str | None) -> None:
    """Run the outbox relay (one elected process per store) until SIGTERM."""
    from wakeful import open_store
    from wakeful.fleet import NoWake, RelayLoop
    from wakeful.runtime import ClaimPolicy

    async with open_store(store_url(store)) as opened:
        loop = RelayLoop(opened, f"relay-{uuid.uuid4().hex[:8]}", ClaimPolicy(), NoWake())
        stop = asyncio.Event()
        task = asyncio.create_task(loop.run(stop))
        await _until_signalled()
        stop.set()
        await task
        console.print(f"relay stopped after delivering {loop.delivered} messages")


@click.command("run")
@click.argument("thread_id")
@click.argument("target")
@click.argument("message")
@store_option
@click.option("--app", "app", required=True, metavar="MODULE:REGISTRY")
@json_option
@run_async
async def run_command(
    thread_id: str, target: str, message: str, store: str | None, app: str, as_json: bool
) -> None:
    """Submit MESSAGE to TARGET on THREAD_ID and follow the run here, streaming its text."""
    from wakeful import Event, open_store
    from wakeful.fleet import LocalWake, Worker, submit
    from wakeful.runtime.events import LiveEvent

    registry = load_object(app)
    async with open_store(store_url(store)) as opened:
        snap = await opened.read(thread_id)
        after = snap.last_seq if snap is not None else 0
        wake = LocalWake()
        w = Worker(opened, registry, concurrency=1, wake=wake, poll_interval=0.2)
        running = asyncio.create_task(w.run())
        dispatch = await submit(opened, thread_id, target, message, wake=wake)
        run_id = dispatch.payload["run_id"]
        runtime = await w.started()
        final: Event | None = None
        async for item in runtime.subscribe(thread_id, after):
            if isinstance(item, LiveEvent) and item.type == "text.delta" and not as_json:
                console.print(item.data["text"], end="", highlight=False)
            elif (
                isinstance(item, Event)
                and item.run_id == run_id
                and item.type
                in (
                    "run.completed",
                    "run.suspended",
                    "run.failed",
                    "run.cancelled",
                    "run.indeterminate",
                )
            ):
                final = item
                break
        await w.stop(5)
        await running
        snap = await opened.read(thread_id)
        status = snap.checkpoint.status if snap and snap.checkpoint else None
        result = {
            "thread_id": thread_id,
            "run_id": run_id,
            "status": status,
            "event": final.type if final else None,
        }
        emit(result, as_json, lambda r: console.print(f"\n[bold]{r['status']}[/bold] {run_id}"))
        if status not in ("completed", "suspended"):
            sys.exit(EXIT_FAILED)


@click.command()
@store_option
@click.option("--app", "app", default=None, metavar="MODULE:REGISTRY")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8000, show_default=True)
@click.option("--tokens", default=None, help="JSON file of bearer token -> tenant.")
@click.option(
    "--live",
    type=click.Choice(["none", "postgres", "nats"]),
    default="none",
    help="Receive model deltas from workers (else streams follow the stream checkpoints).",
)
@click.option("--live-url", default=None, help="The live channel's URL (postgres: the store's).")
def serve(
    store: str | None,
    app: str | None,
    host: str,
    port: int,
    tokens: str | None,
    live: str,
    live_url: str | None,
) -> None:
    """Serve the HTTP API."""
    from wakeful.server import serve as serve_api

    registry = load_object(app) if app else None
    url = store_url(store)
    if live == "postgres" and not live_url:
        live_url = url if url.startswith(("postgresql:", "postgres:")) else None
        if live_url is None:
            raise click.BadParameter("--live postgres needs --live-url", param_hint="--live-url")
    serve_api(
        url,
        host=host,
        port=port,
        tokens=tokens,
        registry=registry,
        live=live,
        live_url=live_url,
    )


@click.group()
def hand() -> None:
    """The remote hand: tools executed behind an idempotency ledger."""


@hand.command("serve")
@click.option("--ledger", required=True, help="The ledger's SQLite file.")
@click.option("--tools", "tools", required=True, metavar="MODULE:MAPPING")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8100, show_default=True)
def hand_serve(ledger: str, tools: str, host: str, port: int) -> None:
    """Execute registered tools for remote callers, once per operation id."""
    from wakeful.fleet.handserver import serve_hand

    serve_hand(ledger, load_object(tools), host, port)


@click.command()
@store_option
@click.option("--schema", default="wakeful", show_default=True, help="PostgreSQL schema.")
@run_async
async def migrate(store: str | None, schema: str) -> None:
    """Apply the store's schema migrations (PostgreSQL; SQLite migrates on open)."""
    url = store_url(store)
    if url.startswith(("postgresql:", "postgres:")):
        from wakeful.store.postgres import migrate as migrate_postgres

        version = await migrate_postgres(url, schema=schema)
        console.print(f"schema {schema} at version {version}")
        return
    from wakeful import open_store

    async with open_store(url):
        console.print(f"{url} is migrated (embedded stores migrate when they open)")


@click.command()
@click.argument("names", nargs=-1)
def bench(names: tuple[str, ...]) -> None:
    """Run benchmarks (from a source checkout: they live in benchmarks/)."""
    with contextlib.suppress(KeyboardInterrupt):
        done = subprocess.run([sys.executable, "-m", "benchmarks", *names], check=False)
        sys.exit(done.returncode)
