"""Grouped stream-checkpoint puts, answered by future (the SQL stores' ``put_soon``).

A store that groups puts (one statement or write job for everything queued) answers each
put on its own. ``put_soon`` hands the caller that answer as a future instead of a
coroutine to await: a turn's background saver chains its writes through the futures'
callbacks, with no task of its own per turn and no task step per write (a thousand
streaming runs write thirty thousand checkpoints a minute). ``put`` awaits the same future.
"""

from __future__ import annotations

import asyncio
from typing import Any

from wakeful.errors import StreamCheckpointError, WakefulError
from wakeful.records import StreamCheckpoint
from wakeful.store.validate import EncodedStreamCheckpoint, encode_stream_checkpoint

Queued = tuple[EncodedStreamCheckpoint, "asyncio.Future[None]"]


def checked(checkpoint: StreamCheckpoint) -> EncodedStreamCheckpoint:
    """``checkpoint`` validated and encoded, or ``StreamCheckpointError`` (``invalid``)."""
    try:
        return encode_stream_checkpoint(checkpoint)
    except WakefulError as exc:
        raise StreamCheckpointError(
            getattr(checkpoint, "run_id", "?"), "invalid", str(exc)
        ) from exc


def enqueue(
    queue: list[Queued], checkpoint: StreamCheckpoint, closed: bool
) -> asyncio.Future[None]:
    """``checkpoint`` validated (``checked``) and appended to ``queue``; the future its
    writer ends with ``answer`` or ``fail``. Raises as ``put`` does, ``storage`` when the
    store is ``closed``."""
    encoded = checked(checkpoint)
    if closed:
        raise StreamCheckpointError(encoded.checkpoint.run_id, "storage", "the store is closed")
    done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    queue.append((encoded, done))
    return done


def answer(item: Queued, stored: Any) -> None:
    """End a queued put: stored, or refused as ``stale`` (its token is not the claim)."""
    encoded, done = item
    if done.done():
        return
    if stored:
        done.set_result(None)
        return
    copy = encoded.checkpoint
    done.set_exception(
        StreamCheckpointError(
            copy.run_id,
            "stale",
            f"token {copy.token} is not the current claim of thread {copy.thread_id!r}",
        )
    )


def fail(items: list[Queued], exc: BaseException) -> None:
    """End queued puts as failed by the storage (``exc`` is the cause)."""
    for encoded, done in items:
        if not done.done():
            error = StreamCheckpointError(encoded.checkpoint.run_id, "storage", str(exc))
            error.__cause__ = exc
            done.set_exception(error)


__all__ = ["Queued", "answer", "checked", "enqueue", "fail"]
