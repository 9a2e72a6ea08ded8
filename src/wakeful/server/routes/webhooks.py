"""Webhook deliveries (issue 43): the recent ones and their counts, for the console and for
operators. A tenant sees the webhooks of its own runs."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from wakeful.fleet.webhooks import recent_webhooks, webhook_counts
from wakeful.server.access import CallerDep, StateDep
from wakeful.server.composition_views import WebhookList, WebhookView

router = APIRouter(prefix="/v1", tags=["webhooks"])


@router.get("/webhooks")
async def list_webhooks(
    state: StateDep,
    caller: CallerDep,
    limit: Annotated[int, Query(ge=1, le=200, description="At most this many.")] = 50,
) -> WebhookList:
    """The most recently updated webhook deliveries, newest first (pending ones with their
    last error and next attempt, delivered ones, dead ones), among the first 1,000 webhook
    threads; a delivery whose first attempt has not been recorded yet is not listed."""
    tenant = None if caller.operator else caller.tenant
    records = await recent_webhooks(state.store, tenant, limit)
    counts = await webhook_counts(state.store, tenant)
    rows = [WebhookView.model_validate(r, from_attributes=True) for r in records]
    return WebhookList(webhooks=rows, counts=counts)
