"""``threads events --follow``: a live tail of a thread's durable events that survives the
store going away. When the store is unavailable (a restarted PostgreSQL, a dropped network)
the tail says so once, reopens the store with backoff, and resumes after the last event it
printed: no gap and no duplicate, because events are numbered per thread."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import click

from wakeful.cli.common import (
    builtins,
    cell,
    describe_url,
    stderr_line,
    store_at,
    to_json,
)
from wakeful.errors import StoreUnavailable
from wakeful.records import Event

log = logging.getLogger("wakeful.cli")

Opener = Callable[[str], Any]
"""``open_store``-like: ``opener(url)`` is an async context manager yielding a store."""


def event_line(e: Event, as_json: bool) -> str:
    if as_json:
        return to_json(builtins(e))
    at = e.at.isoformat(timespec="seconds")
    return f"{e.seq:>6}  {at}  {e.type:<22} {e.run_id or '-':<24} {cell(e.data, 120)}"


async def tail(
    url: str,
    thread_id: str,
    after: int,
    write: Callable[[str], None],
    *,
    as_json: bool = False,
    opener: Opener | None = None,
    retry_delay: float = 0.5,
    max_retry_delay: float = 15.0,
    wait_timeout: float = 30.0,
) -> None:
    """Write each event after ``after`` as it is committed, forever (cancel to stop)."""
    if opener is None:
        from wakeful import open_store

        opener = open_store
    cursor = after
    delay = retry_delay
    lost: str | None = None
    while True:
        try:
            async with opener(url) as store:
                while True:
                    events = await store.wait_events(thread_id, cursor, 100, wait_timeout)
                    if lost is not None:
                        log.warning(
                            "the store is back; following %s after seq %d", thread_id, cursor
                        )
                        lost = None
                    for event in events:
                        write(event_line(event, as_json))
                        cursor = event.seq
                    delay = retry_delay
        except StoreUnavailable as exc:
            if lost is None:
                lost = str(exc)
                log.warning(
                    "%s; reconnecting, then resuming %s after seq %d", exc, thread_id, cursor
                )
            await asyncio.sleep(delay)
            delay = min(delay * 2, max_retry_delay)


async def _check_thread(url: str, thread_id: str) -> None:
    """The store must exist (a read never creates one: exit 3). A thread that does not exist
    yet is waited for, and the wait is said on stderr: work for it may be queued, or about
    to be submitted."""
    try:
        async with store_at(url, existing=True) as store:
            if await store.read(thread_id) is not None:
                return
    except StoreUnavailable:
        return  # the tail says so, and reconnects
    stderr_line(f"waiting for thread {thread_id} to exist in {describe_url(url)}")


async def follow_events(url: str, thread_id: str, after: int, as_json: bool) -> None:
    """The ``--follow`` command: tail until SIGINT or SIGTERM (then exit 0); a thread that
    does not exist yet is waited for (``_check_thread``)."""
    from wakeful.cli.services import until_signalled

    await _check_thread(url, thread_id)

    following = asyncio.create_task(tail(url, thread_id, after, click.echo, as_json=as_json))
    try:
        await until_signalled(following)
    finally:
        following.cancel()
        await asyncio.gather(following, return_exceptions=True)
