"""``wakeful langgraph import``: copy threads from a LangGraph ``SqliteSaver`` or
``PostgresSaver`` database into a wakeful store (read with ``WakefulSaver``).

Exit codes: 0 every thread imported (or already there); 3 the SQLite file or a ``--thread``
does not exist; 4 some threads were skipped (held by a live process, or run on wakeful since
they were imported, or a wakeful runtime thread of the same id): the summary names them; 5 a
database did not answer; 6 invalid input (an unknown URL, not a LangGraph database, a
pickled value without ``--allow-pickle``)."""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import click
from rich.markup import escape

from wakeful.cli.common import (
    EXIT_CONFLICT,
    EXIT_INVALID,
    emit,
    errors,
    exit_code,
    json_option,
    store_option,
    store_url,
    table,
)
from wakeful.errors import WakefulError


@click.group("langgraph")
def langgraph() -> None:
    """LangGraph threads (the ``langgraph`` extra)."""


@langgraph.command("import")
@click.option(
    "--from",
    "source_url",
    required=True,
    metavar="URL",
    help="The LangGraph database: sqlite:///path.db or postgresql://...",
)
@store_option
@click.option(
    "--thread",
    "threads",
    multiple=True,
    metavar="ID",
    help="Import only this thread (repeatable). Default: every thread.",
)
@click.option(
    "--allow-pickle",
    is_flag=True,
    help="Copy pickled values (read them with WakefulSaver(..., allow_pickle=True)).",
)
@json_option
def import_command(
    source_url: str, store: str | None, threads: tuple[str, ...], allow_pickle: bool, as_json: bool
) -> None:
    """Copy every thread (checkpoints of every namespace and pending writes) from a
    SqliteSaver/PostgresSaver database into the store; what the store already has is kept,
    so running it again resumes or catches up. Exit 0 done, 3 no such SQLite file or
    thread, 4 some threads skipped (busy, or ran on wakeful since), 5 unavailable, 6
    invalid input."""
    try:
        from wakeful.langgraph import WakefulSaver
        from wakeful.langgraph.importing import ImportSummary, import_threads
        from wakeful.langgraph.sources import open_source
    except ModuleNotFoundError as exc:
        errors.print(
            f"[red]error:[/red] {exc}; install it with: pip install 'wakeful[langgraph]'",
            highlight=False,
            soft_wrap=True,
        )
        sys.exit(EXIT_INVALID)
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
    )

    from wakeful import open_store

    progress = Progress(
        TextColumn("importing"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("threads"),
        TimeElapsedColumn(),
        console=errors,
        transient=True,
        disable=as_json or not errors.is_terminal,
    )
    task = progress.add_task("threads", total=None)

    async def run() -> ImportSummary:
        async with (
            open_source(source_url, allow_pickle=allow_pickle) as source,
            open_store(store_url(store)) as target,
        ):
            # fencing="off": each commit claims the thread for its atomic step only.
            saver = WakefulSaver(target, fencing="off", cache_threads=1)
            try:
                with progress:
                    return await import_threads(
                        source,
                        saver,
                        threads=threads or None,
                        allow_pickle=allow_pickle,
                        on_count=lambda n: progress.update(task, total=n),
                        on_thread=lambda _thread, _outcome: progress.advance(task),
                    )
            finally:
                await saver.aclose()

    try:
        summary = asyncio.run(run())
    except WakefulError as exc:
        # One line however long (drivers' messages span several): scripts read one line.
        message = escape(" ".join(str(exc).split()))
        errors.print(f"[red]error:[/red] {message}", highlight=False, soft_wrap=True)
        sys.exit(exit_code(exc))

    def render(s: Any) -> None:
        rows = [
            ("source", s.source),
            ("threads read", s.threads),
            ("threads imported", s.imported),
            ("threads already there", s.unchanged),
            ("checkpoints added", s.checkpoints),
            ("writes added", s.writes),
            ("commits", s.commits),
            ("seconds", f"{s.seconds:.1f}"),
        ]
        rows += [(f"skipped {thread}", why) for thread, why in s.skipped.items()]
        table("langgraph import", ["", ""], rows)

    emit(summary, as_json, render)
    if summary.skipped:
        if not as_json:  # --json is quiet: the summary names the skipped threads
            errors.print(
                f"{len(summary.skipped)} thread(s) skipped: busy ones can be imported once "
                "they are free; diverged ones ran on wakeful since and stay as they are",
                highlight=False,
            )
        sys.exit(EXIT_CONFLICT)
