"""Shared pieces of the command line: the store option, output (rich tables or JSON) and
exit codes.

Exit codes: 0 success; 1 a check or run failed; 2 usage error; 3 not found; 4 conflict
(busy, stale, invalid state); 5 store unavailable; 6 invalid input."""

from __future__ import annotations

import asyncio
import functools
import importlib
import os
import sys
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any, TypeVar

import click
import msgspec
from rich.console import Console
from rich.table import Table

from wakeful.errors import (
    DispatchConflict,
    InvalidInput,
    InvalidState,
    NotFound,
    OperationConflict,
    StaleClaim,
    StoreUnavailable,
    ThreadBusy,
    UnsupportedStore,
    WakefulError,
)

DEFAULT_STORE = "sqlite:///wakeful.db"
EXIT_FAILED, EXIT_NOT_FOUND, EXIT_CONFLICT, EXIT_UNAVAILABLE, EXIT_INVALID = 1, 3, 4, 5, 6

T = TypeVar("T")

console = Console()
errors = Console(stderr=True)


def store_url(explicit: str | None) -> str:
    """``--store``, else ``WAKEFUL_STORE``, else ``sqlite:///wakeful.db``."""
    return explicit or os.environ.get("WAKEFUL_STORE") or DEFAULT_STORE


store_option = click.option(
    "--store",
    "store",
    default=None,
    metavar="URL",
    help="Store URL (default: $WAKEFUL_STORE, else sqlite:///wakeful.db).",
)
json_option = click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")


def exit_code(exc: WakefulError) -> int:
    if isinstance(exc, NotFound):
        return EXIT_NOT_FOUND
    if isinstance(
        exc, ThreadBusy | StaleClaim | InvalidState | DispatchConflict | OperationConflict
    ):
        return EXIT_CONFLICT
    if isinstance(exc, StoreUnavailable):
        return EXIT_UNAVAILABLE
    if isinstance(exc, InvalidInput | UnsupportedStore):
        return EXIT_INVALID
    return EXIT_FAILED


def run_async(fn: Callable[..., Coroutine[Any, Any, T]]) -> Callable[..., T]:
    """Run an async command; a ``WakefulError`` becomes a message and its exit code."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> T:
        try:
            return asyncio.run(fn(*args, **kwargs))
        except WakefulError as exc:
            errors.print(f"[red]error:[/red] {exc}", highlight=False)
            sys.exit(exit_code(exc))

    return wrapper


def emit(data: Any, as_json: bool, render: Callable[[Any], None]) -> None:
    if as_json:
        click.echo(msgspec.json.encode(data).decode())
    else:
        render(data)


def table(title: str, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    t = Table(title=title, title_justify="left")
    for column in columns:
        t.add_column(column)
    for row in rows:
        t.add_row(*("" if v is None else str(v) for v in row))
    console.print(t)


def load_object(spec: str) -> Any:
    """``module:attribute`` -> the object (a registry, a tool mapping...)."""
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise click.BadParameter(f"{spec!r} is not of the form module:attribute")
    sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise click.BadParameter(f"cannot import {module_name!r}: {exc}") from exc
    try:
        value = getattr(module, attribute)
    except AttributeError:
        raise click.BadParameter(f"{module_name!r} has no attribute {attribute!r}") from None
    return value() if callable(value) and not hasattr(value, "get") else value


async def with_store(url: str, body: Callable[[Any], Awaitable[T]]) -> T:
    from wakeful import open_store

    async with open_store(url) as store:
        return await body(store)
