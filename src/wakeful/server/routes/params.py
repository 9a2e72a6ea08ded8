"""Path, query and header parameters shared by the routes (validated: 422 names the field)."""

from __future__ import annotations

from typing import Annotated

from fastapi import Header, Path, Query

from wakeful.server.schemas import ID_PATTERN, MAX_ID, MAX_KEY

MAX_LIMIT = 1000
MAX_SEQ = 2**62

ThreadId = Annotated[
    str, Path(pattern=ID_PATTERN, max_length=MAX_ID, description="The thread's id.")
]
DispatchId = Annotated[
    str, Path(pattern=ID_PATTERN, max_length=MAX_ID, description="The dispatch's id.")
]
Limit = Annotated[int, Query(ge=1, le=MAX_LIMIT, description="Page size.")]
IdCursor = Annotated[
    str | None,
    Query(pattern=ID_PATTERN, max_length=MAX_ID, description="Return the rows after this id."),
]
SeqCursor = Annotated[
    int, Query(ge=0, le=MAX_SEQ, description="Return the events with a greater seq.")
]
IdempotencyKey = Annotated[
    str | None,
    Header(
        alias="Idempotency-Key",
        pattern=ID_PATTERN,
        max_length=MAX_KEY,
        description="Becomes the dispatch id: the same key and body again answers the same "
        "ids; the same key with another body is 409.",
    ),
]
