"""Shared pieces of the command line: the store option, output (rich tables or JSON), errors
as one ``error:`` line, and exit codes.

Exit codes: 0 success; 1 a run or a check failed; 2 usage error; 3 not found; 4 conflict
(busy, stale, invalid state, refused, a port in use); 5 store unavailable (transient: retry
later); 6 invalid input or configuration (an unknown store URL, a bad token file, a database
that does not exist or refused the login); 7 ``providers check``: usable for text only."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Sequence
from typing import Any, NoReturn, TypeVar

import click
import msgspec
from rich.console import Console
from rich.table import Table

from wakeful.errors import (
    DispatchConflict,
    GraphChanged,
    InvalidInput,
    InvalidState,
    NotFound,
    OperationConflict,
    RunInProgress,
    StaleClaim,
    StoreRefused,
    StoreUnavailable,
    ThreadBusy,
    UnsupportedStore,
    WakefulError,
)

DEFAULT_STORE = "sqlite:///wakeful.db"
EXIT_FAILED, EXIT_USAGE, EXIT_NOT_FOUND, EXIT_CONFLICT, EXIT_UNAVAILABLE, EXIT_INVALID = (
    1,
    2,
    3,
    4,
    5,
    6,
)

T = TypeVar("T")

# Without a terminal (a pipe, a file, a script) nothing is wrapped: a table is as wide as its
# content, so every id and timestamp can be pasted into the next command.
console = Console(soft_wrap=True, width=None if sys.stdout.isatty() else 100_000)
errors = Console(stderr=True, soft_wrap=True)

UNCUT_COLUMNS = frozenset(
    {
        "thread",
        "dispatch",
        "run",
        "checkpoint",
        "worker",
        "holder",
        "incarnation",
        "at",
        "updated",
        "started",
        "registered",
        "last heartbeat",
        "stopped",
    }
)
"""Columns of ids and timestamps: never wrapped or cut on a terminal either (the others
fold, without an ellipsis)."""


class CommandFailed(click.ClickException):
    """Ends a command with one ``error:`` line on stderr and ``exit_code``."""

    def __init__(self, message: str, code: int = EXIT_FAILED) -> None:
        super().__init__(message)
        # click declares exit_code on the class; each failure carries its own
        setattr(self, "exit_code", code)  # noqa: B010

    def show(self, file: Any = None) -> None:
        click.echo(f"error: {self.format_message()}", err=True)


def fail(message: str, exit_code: int = EXIT_FAILED) -> NoReturn:
    raise CommandFailed(message, exit_code)


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
json_option = click.option(
    "--json", "as_json", is_flag=True, help="Machine-readable output (JSON on stdout)."
)


def limit_option(default: int = 50) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    return click.option(
        "--limit",
        default=default,
        show_default=True,
        type=click.IntRange(1, 10_000),
        help="At most this many rows.",
    )


def exit_code(exc: WakefulError) -> int:
    if isinstance(exc, NotFound):
        return EXIT_NOT_FOUND
    if isinstance(
        exc,
        ThreadBusy
        | StaleClaim
        | InvalidState
        | DispatchConflict
        | OperationConflict
        | RunInProgress
        | GraphChanged,
    ):
        return EXIT_CONFLICT
    if isinstance(exc, StoreUnavailable):
        return EXIT_UNAVAILABLE
    if isinstance(exc, InvalidInput | UnsupportedStore | StoreRefused):
        return EXIT_INVALID
    return EXIT_FAILED


def as_failure(exc: WakefulError) -> CommandFailed:
    """The one-line report of a wakeful error, with its documented exit code."""
    return CommandFailed(str(exc), exit_code(exc))


def usage_failure(exc: click.UsageError) -> CommandFailed:
    """A usage error as one line (exit 2) naming the command's help, instead of click's
    usage block."""
    message = " ".join(exc.format_message().split())
    if message.endswith(".") and not message.endswith(".."):
        message = message[:-1]
    message = message[:1].lower() + message[1:]
    where = f"; see '{exc.ctx.command_path} --help'" if exc.ctx is not None else ""
    return CommandFailed(message + where, EXIT_USAGE)


def run_async(fn: Callable[..., Coroutine[Any, Any, T]]) -> Callable[..., T]:
    """Run an async command (errors are reported by the root group, see ``__init__``)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> T:
        return asyncio.run(fn(*args, **kwargs))

    return wrapper


def to_json(data: Any) -> str:
    return msgspec.json.encode(data).decode()


def builtins(value: Any) -> Any:
    """Records (msgspec structs, datetimes...) as JSON-ready values."""
    return msgspec.to_builtins(value)


def emit(data: Any, as_json: bool, render: Callable[[Any], None]) -> None:
    if as_json:
        click.echo(to_json(data))
    else:
        render(data)


def cell(value: Any, width: int | None = None) -> str:
    """A table cell: text as is, every other value as JSON (never a Python repr)."""
    if value is None:
        return ""
    if isinstance(value, str):
        text = value
    else:
        text = json.dumps(builtins(value), ensure_ascii=False, separators=(",", ":"))
    if width is not None and len(text) > width:
        return text[: width - 1] + "…"
    return text


def table(title: str, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    """A table on stdout. Ids and timestamps (``UNCUT_COLUMNS``) are never wrapped or cut;
    other columns fold where a terminal is too narrow, and nothing wraps without one."""
    cells = [[cell(v) for v in row] for row in rows]
    t = Table(title=title, title_justify="left")
    for i, column in enumerate(columns):
        if column in UNCUT_COLUMNS:
            widest = max((len(r[i]) for r in cells), default=0)
            t.add_column(column, no_wrap=True, min_width=max(widest, len(column)))
        else:
            t.add_column(column, overflow="fold")
    for row in cells:
        t.add_row(*row)
    console.print(t)


def show_dispatch(d: Any, as_json: bool, line: str | None = None, *, verbose: bool = True) -> None:
    """One dispatch: ``line`` (one line naming its ids), or with ``verbose`` every field
    (payload as JSON) in a table, or with ``as_json`` the JSON object."""
    data = builtins(d)
    if as_json:
        click.echo(to_json(data))
    elif verbose or line is None:
        table(line or f"dispatch {d.dispatch_id}", ["field", "value"], list(data.items()))
    else:
        click.echo(line)


verbose_option = click.option(
    "--verbose",
    "-v",
    is_flag=True,
    help="Every field of the dispatch in a table (default: one line with its ids).",
)


def parse_json(option: str, text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError as exc:
        fail(f"{option} is not valid JSON: {exc}", EXIT_INVALID)


def read_input(message: str | None, input_json: str | None, input_file: str | None) -> Any:
    """A run's input: ``MESSAGE`` (a string, for agents), ``--input JSON`` or
    ``--input-file PATH`` (``-``: stdin). At most one of them."""
    given = [n for n, v in (("MESSAGE", message), ("--input", input_json)) if v is not None]
    if input_file is not None:
        given.append("--input-file")
    if len(given) > 1:
        raise click.UsageError(f"give the input once: {' and '.join(given)} were both given")
    if input_json is not None:
        return parse_json("--input", input_json)
    if input_file is not None:
        try:
            with click.open_file(input_file, encoding="utf-8") as f:
                text = f.read()
        except OSError as exc:
            fail(f"cannot read --input-file {input_file}: {exc.strerror or exc}", EXIT_INVALID)
        return parse_json(f"--input-file {input_file}", text)
    return message


def input_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    fn = click.option(
        "--input-file",
        "input_file",
        default=None,
        metavar="PATH",
        help="Read the input as JSON from PATH ('-': stdin).",
    )(fn)
    return click.option(
        "--input",
        "input_json",
        default=None,
        metavar="JSON",
        help="The input as JSON (a graph takes an object; an agent a string or any value).",
    )(fn)


def missing_store(url: str) -> str | None:
    """Why there is no store at ``url`` (its SQLite file, or its file store's directory or
    log, does not exist), or ``None``. PostgreSQL and memory stores are never missing here:
    a database is created by its operator, and its schema by ``wakeful migrate`` or the
    first worker or server."""
    from pathlib import Path
    from urllib.parse import urlsplit

    scheme = urlsplit(url).scheme.lower()
    if scheme == "sqlite":
        from wakeful.store.sqlite import parse_url

        path = Path(parse_url(url))
        return None if path.is_file() else f"the file {path} does not exist"
    if scheme == "file":
        from wakeful.store.file import parse_file_url
        from wakeful.store.file.codec import LOG_NAME, SNAPSHOT_NAME

        root = parse_file_url(url)
        if not root.is_dir():
            return f"the directory {root} does not exist"
        if not any((root / name).is_file() for name in (LOG_NAME, SNAPSHOT_NAME)):
            return f"the directory {root} holds no file store"
    return None


@contextlib.asynccontextmanager
async def store_at(url: str, *, existing: bool = False) -> AsyncIterator[Any]:
    """The store at ``url``, open for the body of an ``async with``. ``existing``: a store
    that does not exist is "not found" (exit 3) instead of being created (reads, and actions
    on what a store already holds). A "does not exist" from the body names the store it
    looked in."""
    from wakeful import open_store

    shown = describe_url(url)
    if existing:
        why = missing_store(url)
        if why is not None:
            fail(
                f"no store at {shown}: {why} (a read never creates one); name the store "
                f"with --store URL or WAKEFUL_STORE",
                EXIT_NOT_FOUND,
            )
    try:
        async with open_store(url) as store:
            yield store
    except NotFound as exc:
        raise CommandFailed(f"{exc} in {shown}", EXIT_NOT_FOUND) from None


async def with_store(url: str, body: Callable[[Any], Awaitable[T]], *, existing: bool = False) -> T:
    """``body(store)`` on the store at ``url`` (see ``store_at``)."""
    async with store_at(url, existing=existing) as store:
        return await body(store)


def describe_url(url: str) -> str:
    """The store URL without a password, for output."""
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    netloc = f"{parts.username}:***@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


def print_line(text: str) -> None:
    """A human line on stdout (markup allowed, no guessing of highlights)."""
    console.print(text, highlight=False)


def stderr_line(text: str) -> None:
    """A line on stderr, as is (no markup: ids may hold brackets)."""
    click.echo(text, err=True)


def is_terminal() -> bool:
    return sys.stdout.isatty()
