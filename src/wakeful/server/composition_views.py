"""The HTTP views of composition: a thread's child runs and the webhooks runs send when they
end (``GET /v1/threads/{id}/children``, ``GET /v1/webhooks``)."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, Field

from wakeful.server.schemas import RunStatus, _View


class ChildView(BaseModel):
    """A child run a thread's run spawned (``ctx.spawn``), and how far it got."""

    thread_id: str
    run_id: str
    target: str
    detached: bool
    parent_run_id: str | None = Field(description="The run of this thread that spawned it.")
    spawned_at: datetime
    status: RunStatus | Literal["sleeping"] | None = Field(
        description="The child run's status; null: not started yet (or its thread has moved "
        "on to another run)."
    )


class ChildPage(BaseModel):
    children: list[ChildView]


class WebhookView(_View):
    """One webhook delivery (``wakeful.fleet.webhooks.WebhookRecord``)."""

    webhook_id: str = Field(description="The webhook-id header of every attempt.")
    status: Literal["pending", "delivered", "dead"]
    url: str = Field(description="The URL without its query string.")
    thread_id: str = Field(description="The thread of the run that ended.")
    run_id: str
    event: str = Field(description="The body's type: run.completed, run.failed, ...")
    attempts: int = Field(description="POSTs made and recorded.")
    last_error: str | None
    last_status: int | None = Field(description="The last answer's HTTP status.")
    next_attempt_at: datetime | None = Field(description="When a pending one is tried again.")
    created_at: datetime | None
    updated_at: datetime | None


class WebhookList(BaseModel):
    webhooks: list[WebhookView]
    counts: dict[str, int] = Field(description="pending, delivered and dead among those scanned.")
