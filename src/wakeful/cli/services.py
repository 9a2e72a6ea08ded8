"""Long-running commands: worker, relay, serve, hand serve; and demo, bench."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import subprocess
import sys
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import click

from wakeful.cli.apps import load_registry, load_tools
from wakeful.cli.common import (
    EXIT_FAILED,
    EXIT_USAGE,
    console,
    describe_url,
    emit,
    fail,
    json_option,
    run_async,
    store_option,
    store_url,
    table,
)
from wakeful.cli.listening import (
    check_exposure,
    check_port,
    exposure_options,
    startup_failure,
)
from wakeful.cli.progress import progress
from wakeful.cli.webhooks import webhook_config, webhook_options

log = logging.getLogger("wakeful.cli")


@click.command()
@click.option("--claims", is_flag=True, help="The short claims story on the memory store.")
def demo(claims: bool) -> None:
    """Crash a worker mid-stream and watch a replacement recover the run."""
    if claims:
        from wakeful.demo.claims import story

        sys.exit(asyncio.run(story()))
    from wakeful.demo.story import story as crash_story

    sys.exit(asyncio.run(crash_story(console.print)))


def _is_postgres(url: str) -> bool:
    return url.startswith(("postgresql:", "postgres:"))


def _wake(kind: str, url: str | None, store: str) -> Any:
    """The wake signal; ``--wake postgres`` defaults ``--wake-url`` to the store's URL when
    the store is PostgreSQL."""
    from wakeful.fleet.wake import LocalWake, NoWake

    if kind == "postgres":
        from wakeful.fleet.pgwake import PostgresWake

        url = url or (store if _is_postgres(store) else None)
        if not url:
            raise click.BadParameter(
                f"--wake postgres needs --wake-url postgresql://... (the store, "
                f"{describe_url(store)}, is not PostgreSQL)",
                param_hint="--wake-url",
            )
        return PostgresWake(url)
    if kind == "nats":
        from wakeful.fleet.natswake import NatsWake

        return NatsWake(url or "nats://127.0.0.1:4222")
    return LocalWake() if kind == "local" else NoWake()


def _listen_options(store: str, wake_url: str | None) -> dict[str, Any]:
    """A PostgreSQL store LISTENs at ``wake_url`` (docs/postgres-store.md, PgBouncer)."""
    if wake_url and _is_postgres(store) and _is_postgres(wake_url):
        return {"wake_url": wake_url}
    return {}


def _live_url(kind: str, url: str | None, store: str) -> str | None:
    """``--live-url``, or for ``--live postgres`` the store's URL when it is PostgreSQL."""
    if kind == "postgres" and not url:
        url = store if _is_postgres(store) else None
        if url is None:
            raise click.BadParameter("--live postgres needs --live-url", param_hint="--live-url")
    return url


def _live(kind: str, url: str | None, store: str) -> Any:
    """The live channel model deltas are published on (``None``: none)."""
    from wakeful.fleet.livechannels import open_live

    try:
        return open_live(kind, _live_url(kind, url, store))
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--live-url") from None


LIVE_OPTIONS = (
    click.option(
        "--live",
        type=click.Choice(["none", "postgres", "nats"]),
        default="none",
        show_default=True,
        help="Channel for the runs' model deltas between workers and stream servers "
        "(docs/http-api.md, stream modes); without one, streams follow the stream checkpoints.",
    ),
    click.option(
        "--live-url", default=None, help="The live channel's URL (postgres: the store's)."
    ),
)


def live_options(fn: Any) -> Any:
    for option in reversed(LIVE_OPTIONS):
        fn = option(fn)
    return fn


async def until_signalled(*tasks: Awaitable[Any]) -> None:
    """Wait for SIGTERM or SIGINT, or for any of ``tasks`` to end (its error is raised)."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    stopping = asyncio.ensure_future(stop.wait())
    watched = {asyncio.ensure_future(t) for t in tasks}
    try:
        done, _ = await asyncio.wait({stopping, *watched}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopping.cancel()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
    for task in done & watched:
        task.result()  # a task that ended early: its error ends the command


def _summary(worker_id: str, stats: Any, seconds: float) -> None:
    rows = [(name, value) for name, value in vars(stats).items() if name != "polls"]
    rows.append(("uptime", f"{seconds:.1f} s"))
    table(f"worker {worker_id} stopped", ["", "count"], rows)


@click.command()
@store_option
@click.option(
    "--app",
    "app",
    required=True,
    metavar="MODULE:ATTR",
    help="What this worker runs: a Registry, an Agent, a compiled graph, or a function of no "
    "arguments returning one.",
)
@click.option(
    "--concurrency",
    default=4,
    show_default=True,
    type=click.IntRange(1, 10_000),
    help="Dispatches run at once.",
)
@click.option("--worker-id", default=None, help="Stable worker id (default: a random one).")
@click.option(
    "--version",
    "code_version",
    default=None,
    help="The code version this worker runs, recorded by every run it starts (default: a hash "
    "of the app's targets, graph structures, patches and source files; docs/deploys.md).",
)
@click.option("--ttl", default=30.0, show_default=True, help="Lease ttl in seconds.")
@click.option("--poll", default=1.0, show_default=True, help="Polling floor in seconds.")
@click.option(
    "--wake",
    type=click.Choice(["none", "local", "postgres", "nats"]),
    default="none",
    show_default=True,
    help="Wake signal telling the worker about new work sooner than the polling floor.",
)
@click.option(
    "--wake-url",
    default=None,
    help="URL of the wake signal (postgresql://... or nats://...; for postgres, default: the "
    "store's URL when the store is PostgreSQL).",
)
@click.option("--grace", default=10.0, show_default=True, help="Shutdown grace in seconds.")
@click.option("--metrics-port", default=None, type=int, help="Serve /metrics on this port.")
@click.option(
    "--metrics-host",
    default="127.0.0.1",
    show_default=True,
    help="Address of the /metrics endpoint (0.0.0.0 for every interface).",
)
@click.option(
    "--gc",
    "gc_setting",
    default="worker",
    show_default=True,
    help="The garbage collector's thresholds in this process: worker (10000,10,10, and what "
    "start-up allocated frozen), python (Python's defaults), or three numbers like "
    "10000,10,10 (wakeful.fleet.gctune, docs/operations.md).",
)
@live_options
@webhook_options
@json_option
@run_async
async def worker(
    store: str | None,
    app: str,
    concurrency: int,
    worker_id: str | None,
    code_version: str | None,
    ttl: float,
    poll: float,
    wake: str,
    wake_url: str | None,
    grace: float,
    metrics_port: int | None,
    metrics_host: str,
    gc_setting: str,
    live: str,
    live_url: str | None,
    webhook_secrets: tuple[str, ...],
    allow_private_webhooks: bool,
    as_json: bool,
) -> None:
    """Claim and run dispatches until SIGTERM or SIGINT (then stop gracefully, letting running
    work finish within --grace) and print a summary."""
    from wakeful import open_store
    from wakeful.fleet import Worker, gctune
    from wakeful.runtime import ClaimPolicy

    try:
        threshold = gctune.parse(gc_setting)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--gc") from None
    registry = load_registry(app)
    if code_version is None:
        from wakeful.fleet.versions import code_version as hashed

        code_version = hashed(registry, modules=[app.partition(":")[0]])
    url = store_url(store)
    signal_wake = _wake(wake, wake_url, url)
    if metrics_port is not None:
        check_port(metrics_host, metrics_port, "--metrics-port")
    channel = _live(live, live_url, url)
    loop = asyncio.get_running_loop()
    started = loop.time()
    async with open_store(
        url, **_listen_options(url, wake_url if wake == "postgres" else None)
    ) as opened:
        w = Worker(
            opened,
            registry,
            concurrency=concurrency,
            claims=ClaimPolicy(ttl=ttl, renew_every=ttl / 3),
            wake=signal_wake,
            worker_id=worker_id or f"worker-{uuid.uuid4().hex[:12]}",
            poll_interval=poll,
            live=channel,
            version=code_version,
            webhooks=webhook_config(webhook_secrets, allow_private_webhooks),
        )
        gctune.tune(threshold)  # start-up is done: what it allocated is frozen
        running = asyncio.create_task(w.run(), name="worker")
        exporter = None
        try:
            if metrics_port is not None:
                from wakeful.metrics import serve_metrics

                exporter = await serve_metrics(w.metrics, metrics_host, metrics_port)
            log.info(
                "worker %s running %s (version %s) on %s; SIGTERM stops it",
                w.worker_id,
                ", ".join(registry.names()),
                w.version,
                describe_url(url),
                extra={"worker": w.worker_id, "targets": registry.names(), "version": w.version},
            )
            await until_signalled(running)
        finally:
            await w.stop(grace)
            if not running.done():
                await running
            if exporter is not None:
                exporter.close()
                await exporter.wait_closed()
            if channel is not None:
                await channel.close()
        running.result()
    stats = {**vars(w.stats), "uptime": round(loop.time() - started, 3)}
    emit(
        {"worker_id": w.worker_id, **stats},
        as_json,
        lambda _: _summary(w.worker_id, w.stats, stats["uptime"]),
    )


@click.command()
@store_option
@click.option(
    "--drain",
    is_flag=True,
    help="Deliver what the outbox holds now and exit, instead of running until SIGTERM.",
)
@click.option(
    "--ttl",
    default=3.0,
    show_default=True,
    type=click.FloatRange(min=0.2),
    help="Seconds of the relay's election claim, renewed every step: a killed relay's "
    "successor takes over within this long.",
)
@json_option
@run_async
async def relay(store: str | None, drain: bool, ttl: float, as_json: bool) -> None:
    """Run the outbox relay (one elected process per store) until SIGTERM, or with --drain
    deliver the staged outbox once and exit."""
    from wakeful import open_store
    from wakeful.fleet import NoWake, RelayLoop
    from wakeful.runtime import ClaimPolicy

    async with open_store(store_url(store)) as opened:
        if drain:
            delivered = 0
            with progress("delivering the outbox", None, quiet=as_json) as advance:
                while moved := await opened.relay_outbox(100):
                    delivered += moved
                    advance(moved)
            emit(
                {"delivered": delivered},
                as_json,
                lambda _: console.print(f"delivered {delivered} messages", highlight=False),
            )
            return
        holder = f"relay-{uuid.uuid4().hex[:8]}"
        loop = RelayLoop(opened, holder, ClaimPolicy(), NoWake(), ttl=ttl)
        log.info(
            "relay %s running on %s (claim ttl %.1f s); SIGTERM stops it",
            holder,
            describe_url(store_url(store)),
            ttl,
            extra={"relay": holder, "ttl": ttl},
        )
        stop = asyncio.Event()
        task = asyncio.create_task(loop.run(stop), name="relay")
        try:
            await until_signalled(task)
        finally:
            stop.set()
            await asyncio.gather(task, return_exceptions=True)
        task.result()
        emit(
            {"delivered": loop.delivered},
            as_json,
            lambda _: console.print(
                f"relay stopped after delivering {loop.delivered} messages", highlight=False
            ),
        )


@click.command()
@store_option
@click.option(
    "--app",
    "app",
    default=None,
    metavar="MODULE:ATTR",
    help="Registry (or Agent, graph, factory) used to refuse unknown targets with 422.",
)
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", default=8000, show_default=True, help="Port to listen on.")
@click.option(
    "--tokens",
    default=None,
    metavar="PATH",
    help="JSON file of bearer token -> tenant (default: $WAKEFUL_TOKENS; none: development mode).",
)
@click.option(
    "--body-timeout",
    default=30.0,
    show_default=True,
    type=click.FloatRange(min=0, min_open=True),
    help="Seconds a request body may take to arrive; later it is answered 408.",
)
@click.option(
    "--wake-url",
    default=None,
    help="PostgreSQL: the server's own URL to LISTEN on when --store is PgBouncer.",
)
@click.option(
    "--langgraph-runs",
    type=click.Choice(["server", "workers"]),
    default="server",
    show_default=True,
    help="Who runs the LangGraph API's runs (--app with LangGraph graphs): this process, or "
    "the workers (dispatches; chunks arrive on --live).",
)
@live_options
@exposure_options
def serve(
    store: str | None,
    app: str | None,
    host: str,
    port: int,
    tokens: str | None,
    body_timeout: float,
    wake_url: str | None,
    langgraph_runs: str,
    live: str,
    live_url: str | None,
    allowed_hosts: tuple[str, ...],
    allow_unauthenticated_network: bool,
    header_timeout: float,
    max_connections: int,
) -> None:
    """Serve the HTTP API until SIGTERM or SIGINT (OpenAPI at /openapi.json, docs at /docs,
    the web console at /console/)."""
    from wakeful.fleet.exposure import check_allowed_hosts
    from wakeful.server import load_tokens
    from wakeful.server import serve as serve_api

    registry = load_registry(app) if app else None
    table_of_tokens = load_tokens(tokens)
    check_exposure("the HTTP API", host, table_of_tokens, allow_unauthenticated_network)
    names = _allowed_hosts(allowed_hosts, check_allowed_hosts)
    url = store_url(store)
    live_url = _live_url(live, live_url, url)
    check_port(host, port)
    level = logging.getLevelName(logging.getLogger().level).lower()
    with startup_failure("the HTTP API", host, port):
        serve_api(
            url,
            host=host,
            port=port,
            tokens=table_of_tokens,
            registry=registry,
            body_timeout=body_timeout,
            live=live,
            live_url=live_url,
            store_options=_listen_options(url, wake_url),
            log_level=level if level in ("debug", "info", "warning", "error") else "info",
            allowed_hosts=names,
            header_timeout=header_timeout,
            max_connections=max_connections,
            langgraph_runs=langgraph_runs,
        )


def _allowed_hosts(names: tuple[str, ...], check: Callable[[tuple[str, ...]], Any]) -> Any:
    try:
        return check(names)
    except ValueError as exc:
        fail(f"--allowed-host: {exc}", EXIT_USAGE)


@click.group()
def hand() -> None:
    """The remote hand: tools executed behind an idempotency ledger."""


@hand.command("serve")
@click.option("--ledger", required=True, metavar="PATH", help="The ledger's SQLite file.")
@click.option(
    "--tools",
    "tools",
    required=True,
    metavar="MODULE:ATTR",
    help="A mapping of tool names to functions (or a function returning one).",
)
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", default=8100, show_default=True, help="Port to listen on.")
@click.option(
    "--tokens",
    default=None,
    metavar="PATH",
    help="JSON file of bearer token -> name, as for serve (default: $WAKEFUL_HAND_TOKENS; "
    "none: no authentication, loopback only).",
)
@exposure_options
def hand_serve(
    ledger: str,
    tools: str,
    host: str,
    port: int,
    tokens: str | None,
    allowed_hosts: tuple[str, ...],
    allow_unauthenticated_network: bool,
    header_timeout: float,
    max_connections: int,
) -> None:
    """Execute registered tools for remote callers, once per operation id."""
    from wakeful.fleet.exposure import check_allowed_hosts
    from wakeful.fleet.handserver import HAND_TOKENS, serve_hand
    from wakeful.fleet.tokens import load_tokens

    table_of_tokens = load_tokens(tokens, variable=HAND_TOKENS)
    check_exposure("the hand", host, table_of_tokens, allow_unauthenticated_network)
    names = _allowed_hosts(allowed_hosts, check_allowed_hosts)
    mapping = load_tools(tools)
    check_port(host, port)
    with startup_failure("the hand", host, port):
        serve_hand(
            ledger,
            mapping,
            host,
            port,
            tokens=table_of_tokens,
            allowed_hosts=names,
            header_timeout=header_timeout,
            max_connections=max_connections,
        )


@click.command()
@click.argument("names", nargs=-1)
def bench(names: tuple[str, ...]) -> None:
    """Run benchmarks NAMES (all when none; from a source checkout: they live in
    benchmarks/)."""
    with contextlib.suppress(KeyboardInterrupt):
        done = subprocess.run([sys.executable, "-m", "benchmarks", *names], check=False)
        sys.exit(done.returncode if done.returncode >= 0 else EXIT_FAILED)
