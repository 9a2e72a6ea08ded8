"""Reading threads: the list (the caller's tenant only), one thread, its messages."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from wakeful.server.access import CallerDep, StateDep, visible_thread
from wakeful.server.problems import Forbidden
from wakeful.server.routes.params import MAX_SEQ, IdCursor, Limit, ThreadId
from wakeful.server.schemas import (
    ID_PATTERN,
    MAX_ID,
    MessagePage,
    MessageView,
    ThreadPage,
    ThreadSummaryView,
    ThreadView,
)
from wakeful.server.views import errors, thread_view

router = APIRouter(prefix="/v1", tags=["threads"])


@router.get("/threads", responses=errors(403))
async def list_threads(
    state: StateDep,
    caller: CallerDep,
    after: IdCursor = None,
    limit: Limit = 100,
    tenant: Annotated[
        str | None,
        Query(
            pattern=ID_PATTERN,
            max_length=MAX_ID,
            description="Operators: only this tenant's threads. A tenant token may only name "
            "its own tenant (else 403).",
        ),
    ] = None,
) -> ThreadPage:
    """Threads with at least one commit, ordered by id, paged by cursor (``after`` is the
    last id of the previous page). A tenant token sees only its tenant's threads."""
    if caller.operator:
        scope = tenant
    elif tenant is not None and tenant != caller.tenant:
        raise Forbidden("a tenant token may list only its own tenant's threads")
    else:
        scope = caller.tenant
    rows = await state.store.list_threads(tenant=scope, after=after, limit=limit)
    return ThreadPage(
        threads=[ThreadSummaryView.model_validate(r, from_attributes=True) for r in rows],
        next_after=rows[-1].thread_id if len(rows) == limit else None,
    )


@router.get("/threads/{thread_id}", responses=errors(404))
async def get_thread(thread_id: ThreadId, state: StateDep, caller: CallerDep) -> ThreadView:
    """The thread's status, version, latest run, claim (holder and expiry), checkpoint
    state, message count, latest event seq and the open tickets of a suspended run."""
    owner = await visible_thread(state.store, caller, thread_id)
    return thread_view(owner)


@router.get("/threads/{thread_id}/messages", responses=errors(404))
async def list_messages(
    thread_id: ThreadId,
    state: StateDep,
    caller: CallerDep,
    after: Annotated[
        int, Query(ge=0, le=MAX_SEQ, description="How many messages to skip (a count).")
    ] = 0,
    limit: Limit = 100,
) -> MessagePage:
    """The conversation in order; ``after`` counts the messages already read."""
    await visible_thread(state.store, caller, thread_id)
    rows = await state.store.messages(thread_id, after=after, limit=limit)
    return MessagePage(
        messages=[MessageView.model_validate(m, from_attributes=True) for m in rows],
        next_after=after + len(rows),
    )
