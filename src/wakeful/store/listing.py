"""Which threads a listing shows: a user's, not the runtime's own bookkeeping.

The fleet keeps some records on threads of its own: a webhook delivery's attempts on
``wakeful.webhook.<webhook id>`` (``wakeful.runtime.webhooks``), the relay's election on
``wakeful.relay`` (``wakeful.fleet.relay``, a claim only); the LangGraph API keeps each
LangGraph thread's record (metadata, owner) on ``langgraph:thread:<id>``
(``wakeful.server.langgraph_records``). They are threads like any
other to the store (``ThreadStore.list_threads`` lists those with a commit), but a person
listing threads (``GET /v1/threads``, ``wakeful threads list``, the console) looks for
conversations and runs: these are left out unless asked for (``internal=True``). A
thread of a user never has these ids: the prefix and the name are reserved."""

from __future__ import annotations

from wakeful.ids import check_count, check_optional_id
from wakeful.records import ThreadSummary
from wakeful.store.contract import ThreadStore

INTERNAL_THREAD_PREFIXES: tuple[str, ...] = ("wakeful.webhook.", "langgraph:thread:")
"""Id prefixes of the runtime's own threads (webhook deliveries, LangGraph thread records)."""
INTERNAL_THREADS: frozenset[str] = frozenset(("wakeful.relay",))
"""Ids of single threads of the fleet's own (the relay's election)."""
PAGE = 200
"""Rows read from the store per page while skipping internal threads."""


def is_internal_thread(thread_id: str) -> bool:
    """Whether ``thread_id`` is one of the fleet's own threads (left out of listings)."""
    return thread_id in INTERNAL_THREADS or thread_id.startswith(INTERNAL_THREAD_PREFIXES)


async def list_threads(
    store: ThreadStore,
    tenant: str | None = None,
    after: str | None = None,
    limit: int = 100,
    *,
    internal: bool = False,
) -> list[ThreadSummary]:
    """``store.list_threads`` without the fleet's own threads (unless ``internal``): up to
    ``limit`` rows after the cursor ``after``, reading further pages past internal ones,
    so a short page still means the end."""
    check_optional_id("tenant", tenant)
    check_optional_id("after", after)
    limit = check_count("limit", limit, minimum=1)
    if internal:
        return await store.list_threads(tenant=tenant, after=after, limit=limit)
    kept: list[ThreadSummary] = []
    batch = max(limit, min(PAGE, 4 * limit))
    while len(kept) < limit:
        page = await store.list_threads(tenant=tenant, after=after, limit=batch)
        for row in page:
            if not is_internal_thread(row.thread_id):
                kept.append(row)
                if len(kept) == limit:
                    break
        if len(page) < batch:
            break
        after = page[-1].thread_id
    return kept


__all__ = [
    "INTERNAL_THREADS",
    "INTERNAL_THREAD_PREFIXES",
    "is_internal_thread",
    "list_threads",
]
