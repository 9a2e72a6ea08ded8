"""``wakeful run`` (submit and follow a run in this process) and ``wakeful submit`` (enqueue
only).

``run`` follows the dispatch, not only its run id: a dispatch the worker refuses (an unknown
target, an input the target cannot take, a thread whose last run is unfinished) records a
``dispatch.refused`` event naming the dispatch and no run, and ``run`` ends on it.

Exit codes of ``run``: 0 the run completed or suspended (waiting for answers: resume it with
``wakeful resume``); 1 it failed, was cancelled, or ended indeterminate (its retry budget was
spent); 3 the target is not in ``--app``; 4 the worker refused the dispatch; 6 invalid
input."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import click

from wakeful.cli.apps import load_registry
from wakeful.cli.common import (
    EXIT_CONFLICT,
    EXIT_FAILED,
    EXIT_INVALID,
    EXIT_NOT_FOUND,
    CommandFailed,
    console,
    describe_url,
    emit,
    fail,
    input_options,
    json_option,
    read_input,
    run_async,
    show_dispatch,
    stderr_line,
    store_at,
    store_option,
    store_url,
    verbose_option,
)
from wakeful.errors import NotFound, ThreadBusy
from wakeful.records import Event

ENDINGS = {
    "run.completed": "completed",
    "run.suspended": "suspended",
    "run.failed": "failed",
    "run.cancelled": "cancelled",
    "run.indeterminate": "indeterminate",
}
SETTLED = ("done", "awaiting", "quarantined")


def dispatch_options(fn: Any) -> Any:
    fn = click.option(
        "--max-attempts",
        default=5,
        show_default=True,
        type=click.IntRange(1, 1000),
        help="Attempts before the run is ended as indeterminate.",
    )(fn)
    fn = click.option("--priority", default=0, show_default=True, help="Higher runs first.")(fn)
    fn = click.option("--tenant", default=None, help="The thread's tenant.")(fn)
    return click.option(
        "--dispatch-id",
        default=None,
        help="Idempotency key: submitting the same id and input again changes nothing.",
    )(fn)


@click.command("submit")
@click.argument("thread_id")
@click.argument("target")
@click.argument("message", required=False)
@input_options
@dispatch_options
@store_option
@click.option(
    "--app",
    "app",
    default=None,
    metavar="MODULE:ATTR",
    help="Check that TARGET is in this app (a warning on stderr when it is not); the dispatch "
    "is enqueued either way.",
)
@click.option(
    "--after", default=None, help="Run it after this delay (by the store's clock): 90, 10m, 1h30m."
)
@click.option("--at", "at_text", default=None, help="Run it at this instant: 2026-12-08T09:00Z.")
@click.option(
    "--debounce",
    "debounce_text",
    default=None,
    help="Debounce window (2s, 500ms): submissions of TARGET to THREAD_ID within it start one "
    "run, with the last input; prints the dispatch that run is (not with --after or --at).",
)
@click.option(
    "--from-checkpoint",
    "from_checkpoint",
    default=None,
    metavar="CP",
    help="Replay from this checkpoint of THREAD_ID (wakeful threads history); from an "
    "earlier one the thread branches.",
)
@click.option(
    "--if-busy",
    "if_busy",
    type=click.Choice(["enqueue", "reject", "interrupt", "coalesce", "rollback"]),
    default="enqueue",
    show_default=True,
    help="When THREAD_ID is busy (a run is unfinished: running, queued or suspended): wait "
    "behind it, refuse (exit 4, nothing stored), stop it (it ends interrupted) and run next, "
    "stop it and undo what it committed (rollback: the thread returns to where it was before "
    "it started) and run next, or merge with the other coalesce submissions waiting into one "
    "run.",
)
@click.option(
    "--webhook",
    default=None,
    metavar="URL",
    help="POST a signed JSON body to URL when the run ends or suspends on a question "
    "(docs/composition.md#webhooks-when-a-run-ends).",
)
@json_option
@verbose_option
@run_async
async def submit_command(
    thread_id: str,
    target: str,
    message: str | None,
    input_json: str | None,
    input_file: str | None,
    dispatch_id: str | None,
    tenant: str | None,
    priority: int,
    max_attempts: int,
    store: str | None,
    app: str | None,
    after: str | None,
    at_text: str | None,
    debounce_text: str | None,
    from_checkpoint: str | None,
    if_busy: Any,
    webhook: str | None,
    as_json: bool,
    verbose: bool,
) -> None:
    """Enqueue a run of TARGET on THREAD_ID (MESSAGE, --input or --input-file) for the
    workers, and print one line with the dispatch and run ids (--verbose: the dispatch,
    --json: as JSON). Nothing runs here; with --after or --at, not before then.

    With --from-checkpoint the run replays from that checkpoint (without input: its
    frontier; with input: from the start on its state), for the thread's tenant; a
    checkpoint the thread does not have is exit 3, a thread whose last run is running
    exit 4.

    Warns on stderr (exit code 0) when TARGET is not in --app, or when no live worker is
    registered: the store does not know which targets workers serve, and the dispatch may be
    meant for a worker that starts later; a worker without TARGET refuses it."""
    from wakeful.fleet import submit
    from wakeful.fleet.census import liveness
    from wakeful.fleet.delays import parse_duration, parse_instant

    delay = parse_duration(after) if after is not None else None
    at = parse_instant(at_text) if at_text is not None else None
    debounce = parse_duration(debounce_text, "debounce") if debounce_text is not None else None
    value = read_input(message, input_json, input_file)
    missing = None if app is None else _missing_target(app, target)
    url = store_url(store)
    async with store_at(url) as opened:
        if from_checkpoint is not None:
            tenant = await _replay_tenant(opened, thread_id, from_checkpoint, tenant)
        d = await submit(
            opened,
            thread_id,
            target,
            value,
            dispatch_id=dispatch_id,
            priority=priority,
            max_attempts=max_attempts,
            tenant=tenant,
            after=delay,
            at=at,
            from_checkpoint=from_checkpoint,
            if_busy=if_busy,
            webhook=webhook,
            debounce=debounce,
        )
        now = datetime.now(UTC)
        live = [w for w in await opened.list_workers() if liveness(w, now) == "alive"]
    line = f"submitted {d.dispatch_id} (run {d.payload.get('run_id') or 'run-' + d.dispatch_id})"
    if d.status == "queued":
        line += f", queued behind {d.queued_behind} (the thread is busy)"
    elif d.status == "scheduled" and d.available_at is not None:
        line += f", scheduled for {d.available_at.isoformat()}"
    show_dispatch(d, as_json, line, verbose=verbose)
    if missing is not None:
        stderr_line(f"warning: {missing}; a worker without it refuses dispatch {d.dispatch_id}")
    if not live:
        stderr_line(
            f"warning: no live worker in {describe_url(url)}: dispatch {d.dispatch_id} waits "
            f"until one starts (wakeful worker --app MODULE:ATTR, with target {target!r})"
        )


async def _replay_tenant(
    store: Any, thread_id: str, checkpoint_id: str, tenant: str | None
) -> str | None:
    """The tenant a replay is submitted for (the thread's, unless --tenant names it), after
    checking that the checkpoint is there and the thread's last run is not running."""
    from wakeful.cli.travel import owner_tenant
    from wakeful.errors import RunInProgress
    from wakeful.runtime.history import checkpoint_at

    owner = await owner_tenant(store, thread_id)
    chosen = tenant if tenant is not None else owner
    await checkpoint_at(store, thread_id, checkpoint_id, tenant=chosen)
    head = (await store.read(thread_id)).checkpoint
    if head.status == "running":
        raise RunInProgress(thread_id, head.run_id, head.status)
    return chosen


def _missing_target(app: str, target: str) -> str | None:
    """Why ``target`` is not in ``--app``, or ``None`` when it is."""
    registry = load_registry(app)
    try:
        registry.get(target)
    except NotFound:
        return f"target {target!r} is not in {app} (it has: {', '.join(registry.names())})"
    return None


def _ending(event: Event, dispatch_id: str, run_id: str) -> str | None:
    """What ``event`` says about the dispatch: its run's ending, a refusal, or nothing."""
    data = event.data if isinstance(event.data, dict) else {}
    if event.type == "dispatch.refused" and data.get("dispatch_id") == dispatch_id:
        return "refused"
    if event.run_id == run_id:
        return ENDINGS.get(event.type)
    return None


async def _follow_events(
    items: AsyncIterator[Any], dispatch_id: str, run_id: str, stream_text: bool
) -> tuple[str, Event]:
    from wakeful.runtime.events import LiveEvent

    async for item in items:
        if isinstance(item, LiveEvent):
            if stream_text and item.run_id == run_id and item.type == "text.delta":
                console.print(item.data["text"], end="", highlight=False)
            continue
        ending = _ending(item, dispatch_id, run_id)
        if ending is not None:
            return ending, item
    raise AssertionError("a subscription never ends by itself")


async def _watch_dispatch(
    store: Any, thread_id: str, dispatch_id: str, run_id: str, after: int
) -> tuple[str, Event | None]:
    """The safety net: once the dispatch is settled, its ending is in the thread's events
    (committed with the settlement) or there is none to wait for."""
    while True:  # retries are logged by the worker
        d = await store.get_dispatch(dispatch_id)
        if d is None:
            raise NotFound("dispatch", dispatch_id)
        if d.status in SETTLED:
            cursor = after
            while events := await store.events_after(thread_id, cursor, 500):
                for event in events:
                    ending = _ending(event, dispatch_id, run_id)
                    if ending is not None:
                        return ending, event
                cursor = events[-1].seq
            return ("quarantined" if d.status == "quarantined" else "settled"), None
        await asyncio.sleep(0.5)


def _reason(ending: str, event: Event | None) -> str:
    data = event.data if event is not None and isinstance(event.data, dict) else {}
    if ending == "refused":
        return str(data.get("reason", "refused"))
    if ending == "failed":
        return str(data.get("error", "failed"))
    if ending == "cancelled":
        return str(data.get("reason", "cancelled"))
    if ending == "indeterminate":
        return f"its {data.get('max_attempts', '')} attempts were spent without an ending"
    if ending == "suspended":
        return "waiting for answers to " + ", ".join(map(str, data.get("tickets", [])))
    return ending


@click.command("run")
@click.argument("thread_id")
@click.argument("target")
@click.argument("message", required=False)
@input_options
@dispatch_options
@store_option
@click.option(
    "--app",
    "app",
    required=True,
    metavar="MODULE:ATTR",
    help="A Registry, an Agent, a compiled graph, or a function of no arguments returning one.",
)
@json_option
@run_async
async def run_command(
    thread_id: str,
    target: str,
    message: str | None,
    input_json: str | None,
    input_file: str | None,
    dispatch_id: str | None,
    tenant: str | None,
    priority: int,
    max_attempts: int,
    store: str | None,
    app: str,
    as_json: bool,
) -> None:
    """Submit a run of TARGET on THREAD_ID and run it here, streaming an agent's text, until
    it completes, suspends, fails or is refused. The input is MESSAGE (a string, for an
    agent), --input JSON or --input-file PATH|- (a JSON object for a graph).

    Exit codes: 0 completed or suspended; 1 failed, cancelled or indeterminate; 3 unknown
    target; 4 refused by the worker; 6 invalid input."""
    from wakeful.fleet import LocalWake, Worker, submit
    from wakeful.runtime.sleeps import wake_at

    value = read_input(message, input_json, input_file)
    registry = load_registry(app)
    try:
        registry.get(target).prepare(value, "run-check")
    except NotFound:
        fail(
            f"target {target!r} is not in {app} (it has: {', '.join(registry.names())})",
            EXIT_NOT_FOUND,
        )
    except (TypeError, ValueError) as exc:
        fail(f"target {target!r} cannot take this input: {exc}", EXIT_INVALID)
    async with store_at(store_url(store)) as opened:
        snap = await opened.read(thread_id)
        after = snap.last_seq if snap is not None else 0
        wake = LocalWake()
        # this thread's work only, and no relay: other threads' dispatches and messages are
        # left to the workers that serve them (issue 34)
        w = Worker(
            opened,
            registry,
            concurrency=1,
            wake=wake,
            poll_interval=0.2,
            only_thread=thread_id,
            relay=False,
        )
        running = asyncio.create_task(w.run(), name="worker")
        tasks: list[asyncio.Task[Any]] = [running]
        latest = snap.checkpoint if snap is not None else None
        # a run asleep wakes by itself (continued here first, once due): wait behind it
        asleep = wake_at(latest) is not None
        suspended = latest is not None and latest.status == "suspended" and not asleep
        try:
            try:
                # A suspended run keeps the thread busy until it is resumed or cancelled:
                # nothing would run here meanwhile, so refuse (atomically) rather than wait.
                dispatch = await submit(
                    opened,
                    thread_id,
                    target,
                    value,
                    dispatch_id=dispatch_id,
                    priority=priority,
                    max_attempts=max_attempts,
                    tenant=tenant,
                    wake=wake,
                    if_busy="reject" if suspended else "enqueue",
                )
            except ThreadBusy as busy:
                fail(
                    f"thread {thread_id!r} is busy: its unfinished run {busy.run_id or ''} "
                    f"(dispatch {busy.dispatch_id}) is suspended waiting for answers; nothing "
                    f"was submitted: answer it (wakeful resume) or cancel it (wakeful cancel), "
                    f"or queue behind it with wakeful submit",
                    EXIT_CONFLICT,
                )
            run_id = str(dispatch.payload["run_id"])
            runtime = await w.started()
            events = runtime.subscribe(thread_id, after)
            tasks += [
                asyncio.create_task(
                    _follow_events(events, dispatch.dispatch_id, run_id, not as_json)
                ),
                asyncio.create_task(
                    _watch_dispatch(opened, thread_id, dispatch.dispatch_id, run_id, after)
                ),
            ]
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            finished = next(iter(done))
            if finished is running:
                running.result()
                raise AssertionError("the worker stopped on its own")
            ending, event = finished.result()
        finally:
            for task in tasks[1:]:
                task.cancel()
            for task in tasks[1:]:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
            await w.stop(5)
            with contextlib.suppress(Exception):
                await running
        snap = await opened.read(thread_id)
    cp = snap.checkpoint if snap is not None else None
    status = cp.status if cp is not None and cp.run_id == run_id else None
    if ending == "settled":
        ending = status or "settled"
    result = {
        "thread_id": thread_id,
        "dispatch_id": dispatch.dispatch_id,
        "run_id": run_id,
        "status": ending,
        "event": event.type if event is not None else None,
        "reason": None if ending == "completed" else _reason(ending, event),
        "state": cp.state if status in ("completed", "suspended") and cp is not None else None,
    }
    is_graph = registry.get(target).agent is None

    def render(r: dict[str, Any]) -> None:
        console.print()
        if is_graph and r["state"] is not None:
            console.print_json(data=r["state"])
        line = f"[bold]{r['status']}[/bold] {run_id}"
        if r["reason"] and r["status"] not in ("completed",):
            line += f": {r['reason']}"
        console.print(line, highlight=False)

    if ending in ("completed", "suspended"):
        emit(result, as_json, render)
        return
    if as_json:
        emit(result, True, render)
    code = EXIT_CONFLICT if ending == "refused" else EXIT_FAILED
    raise CommandFailed(f"run {run_id} {ending}: {result['reason']}", code)
