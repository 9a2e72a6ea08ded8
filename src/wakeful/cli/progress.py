"""Progress bars for long operator commands: shown on a terminal (stderr), silent when the
output is ``--json`` or not a terminal."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)

from wakeful.cli.common import errors

Advance = Callable[[int], None]


@contextlib.contextmanager
def progress(description: str, total: int | None, *, quiet: bool) -> Iterator[Advance]:
    """Yields ``advance(n)``. ``total=None``: a spinner with a running count."""
    if quiet or not errors.is_terminal:
        yield lambda _n: None
        return
    columns = [SpinnerColumn(), TextColumn("{task.description}")]
    if total is not None:
        columns += [BarColumn(), MofNCompleteColumn()]
    else:
        columns.append(TextColumn("{task.completed} done"))
    columns.append(TimeElapsedColumn())
    with Progress(*columns, console=errors, transient=True) as bar:
        task = bar.add_task(description, total=total)
        yield lambda n: bar.advance(task, n)
