"""Branch message views: which stored messages a branch of a thread shows (``Commit.branch_from``).

A thread's messages are stored once, append-only, in the order they were committed (the
*append order*, counted from 0). Only the head branch ever appends, and a branch that stopped
being the head never becomes it again (going back makes a new branch), so each branch's own
messages are one contiguous range of the append order: from its ``message_start`` to the next
branch's (the head's is open-ended). A branch's *view* is the first ``messages`` of its parent
branch's view followed by its own range; branch 0 (the thread's original line) is its own range.

Every backend keeps the ``Branch`` records and reads stored messages by append position; this
module turns a view into the few append-order ranges to read. The cost is one range per branch
on the way from the branch to branch 0, whatever the number of messages.
"""

from __future__ import annotations

import bisect
from collections.abc import Awaitable, Callable, Sequence

from wakeful.errors import NotFound
from wakeful.records import Branch, Message

Segment = tuple[int, int | None]
"""A run of stored messages: (first append position, how many; ``None``: up to the end)."""


def _own(branches: Sequence[Branch], number: int) -> Segment:
    start = 0 if number == 0 else branches[number - 1].message_start
    if number < len(branches):
        return start, branches[number].message_start - start
    return start, None


def _truncate(segments: list[Segment], count: int) -> list[Segment]:
    kept: list[Segment] = []
    for start, length in segments:
        if count <= 0:
            break
        take = count if length is None else min(length, count)
        kept.append((start, take))
        count -= take
    return kept


def view_segments(branches: Sequence[Branch], number: int) -> list[Segment]:
    """The append-order segments of branch ``number``'s whole view, in view order.
    ``branches`` are the thread's records, branch 1 first. ``NotFound`` for a branch the
    thread does not have."""
    if number < 0 or number > len(branches):
        raise NotFound("branch", str(number))
    chain: list[Branch] = []
    at = number
    while at != 0:
        record = branches[at - 1]
        chain.append(record)
        at = record.parent
    segments = [_own(branches, 0)]
    for record in reversed(chain):
        segments = [*_truncate(segments, record.messages), _own(branches, record.number)]
    return segments


def view_length(segments: Sequence[Segment], stored: int) -> int:
    """How many messages the view of ``segments`` shows when ``stored`` messages exist."""
    return sum(max(stored - start, 0) if length is None else length for start, length in segments)


def page_ranges(segments: Sequence[Segment], after: int, limit: int) -> list[Segment]:
    """The append-order ranges holding view positions ``after`` .. ``after + limit - 1``."""
    ranges: list[Segment] = []
    skip, want = after, limit
    for start, length in segments:
        if want <= 0:
            break
        if length is not None and skip >= length:
            skip -= length
            continue
        first = start + skip
        take = want if length is None else min(want, length - skip)
        ranges.append((first, take))
        want -= take
        skip = 0
    return ranges


async def read_view(
    branches: Sequence[Branch],
    number: int,
    after: int,
    limit: int,
    read_range: Callable[[int, int], Awaitable[list[Message]]],
) -> list[Message]:
    """Page ``after``/``limit`` of branch ``number``'s view, read with ``read_range(first,
    count)`` (stored messages from append position ``first``, at most ``count``)."""
    found: list[Message] = []
    for first, count in page_ranges(view_segments(branches, number), after, limit):
        assert count is not None
        found += await read_range(first, count)
    return found


def branch_of(first_orders: Sequence[int], order: int) -> int:
    """The branch a checkpoint of commit order ``order`` was committed on, given the order of
    each branch's first checkpoint (branch 1 first; increasing)."""
    return bisect.bisect_right(first_orders, order)


__all__ = [
    "Segment",
    "branch_of",
    "page_ranges",
    "read_view",
    "view_length",
    "view_segments",
]
