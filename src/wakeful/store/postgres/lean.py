"""The pool's connection class: psycopg's async connection with a cheaper wait for a reply.

psycopg's ``AsyncConnection.wait`` pays, for every round trip, an ``add_reader`` and a
``remove_reader`` on the event loop (two ``epoll_ctl`` system calls and the selector's
Python bookkeeping), a ``call_later`` timer and its cancellation: about 35 µs of the 90 µs
of client CPU a ``SELECT 1`` cost here (decision 0022, seventh session, h22p). ``LeanConn``
keeps its socket registered with the loop between round trips instead, and waits on one
future per reply, with no timer. The generators that drive the protocol are psycopg's own;
only the wait between their steps differs.

A registered socket that turns readable while nobody waits (the server closed an idle
connection, or sent a notice) is unregistered at once, so the loop never spins on it; the
next wait registers it again. It is also unregistered before psycopg's own wait takes over
(a wait for a writable socket, a wait with a timeout: rare), on any error or interruption,
when the connection is no longer usable, and before the connection closes: a descriptor that
libpq closes is never left registered with the loop. An interrupted wait (the task
cancelled while its statement runs) cancels the statement on the server and consumes its
end, as psycopg's wait does, so the connection can go back to the pool idle; if that fails
within ``CANCEL_TIMEOUT`` the connection is closed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Generator
from typing import Any, TypeVar

import psycopg
from psycopg import pq
from psycopg.rows import TupleRow

RV = TypeVar("RV")

WAIT_R = 1
"""``psycopg.waiting.Wait.R``: the generator waits for the socket to be readable."""
READY_R = 1
"""``psycopg.waiting.Ready.R``: the socket is readable."""
DEFAULT_INTERVAL = 0.1
"""psycopg's default wait interval: a wait asked with another one goes to psycopg."""
CANCEL_TIMEOUT = 5.0
"""Seconds an interrupted statement's cancellation may take before the connection closes."""

_ACTIVE = pq.TransactionStatus.ACTIVE
_OK = pq.ConnStatus.OK


class LeanConn(psycopg.AsyncConnection[TupleRow]):
    """An async connection whose socket stays registered with the event loop between
    round trips (see the module)."""

    _lean_loop: asyncio.AbstractEventLoop | None = None
    _lean_fd = -1
    _lean_waiter: asyncio.Future[None] | None = None

    @property
    def watching(self) -> bool:
        """Whether the socket is registered with an event loop right now."""
        return self._lean_loop is not None

    async def wait(
        self,
        gen: Generator[Any, Any, RV],
        interval: float = DEFAULT_INTERVAL,
        timeout: float | None = None,
    ) -> RV:
        if timeout is not None or interval != DEFAULT_INTERVAL:
            self._lean_unregister()
            return await super().wait(gen, interval, timeout)
        state = 0
        try:
            try:
                state = next(gen)
                while True:
                    if state != WAIT_R:  # a wait for writing (a large send): psycopg's
                        self._lean_unregister()
                        return await super().wait(_resume(gen, state), interval)
                    await self._lean_readable()
                    state = gen.send(READY_R)
            except StopIteration as done:
                result: RV = done.value
                if self.pgconn.status != _OK:
                    self._lean_unregister()
                return result
        except BaseException as exc:
            self._lean_unregister()
            if (
                isinstance(exc, (asyncio.CancelledError, KeyboardInterrupt, SystemExit))
                and state == WAIT_R
                and self.pgconn.transaction_status == _ACTIVE
            ):
                await self._lean_cancel(gen)
            raise

    async def _lean_readable(self) -> None:
        loop = asyncio.get_running_loop()
        fd = self.pgconn.socket
        if self._lean_loop is not loop or self._lean_fd != fd:
            self._lean_unregister()
            loop.add_reader(fd, self._lean_ready)
            self._lean_loop, self._lean_fd = loop, fd
        self._lean_waiter = waiter = loop.create_future()
        try:
            await waiter
        finally:
            self._lean_waiter = None

    def _lean_ready(self) -> None:
        waiter = self._lean_waiter
        if waiter is None:  # readable while nobody waits: watch again at the next wait
            self._lean_unregister()
        elif not waiter.done():
            waiter.set_result(None)

    def _lean_unregister(self) -> None:
        loop, self._lean_loop = self._lean_loop, None
        if loop is not None and not loop.is_closed():
            loop.remove_reader(self._lean_fd)

    async def _lean_cancel(self, gen: Generator[Any, Any, Any]) -> None:
        """Cancel the statement in flight on the server and consume its end (as psycopg's
        wait does when interrupted); close the connection if that does not succeed."""
        try:
            await self.cancel_safe(timeout=CANCEL_TIMEOUT)
            await asyncio.wait_for(
                super().wait(_resume(gen, WAIT_R), DEFAULT_INTERVAL), CANCEL_TIMEOUT
            )
        except psycopg.errors.QueryCanceled:
            pass  # as expected
        except BaseException:
            self.pgconn.finish()

    async def close(self) -> None:
        self._lean_unregister()
        await super().close()


def _resume(gen: Generator[Any, Any, RV], state: Any) -> Generator[Any, Any, RV]:
    """``gen``, suspended waiting for ``state``, as a generator that starts there."""
    while True:
        ready = yield state
        try:
            state = gen.send(ready)
        except StopIteration as done:
            result: RV = done.value
            return result
