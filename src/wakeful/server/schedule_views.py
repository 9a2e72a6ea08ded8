"""The HTTP models of schedules (``/v1/schedules``): the definition a caller puts, the view
it reads back. A tenant's schedule names are its own namespace: stored as
``<tenant tag>.<name>`` (``access.tenant_scope``), shown without the tag."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic.json_schema import SkipJsonSchema

from wakeful.records import Schedule
from wakeful.server.schemas import MAX_KEY, Id, Key, _Request, _View


class PutSchedule(_Request):
    """A schedule's definition: exactly one of ``cron`` and ``every``, exactly one of
    ``thread`` and ``thread_template`` (left out, never null: the JSON Schema says so)."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "allOf": [
                {"oneOf": [{"required": ["cron"]}, {"required": ["every"]}]},
                {"oneOf": [{"required": ["thread"]}, {"required": ["thread_template"]}]},
            ]
        },
    )

    target: Id = Field(description="The registered agent or graph each tick runs.")
    cron: Annotated[str, Field(min_length=1, max_length=200)] | SkipJsonSchema[None] = Field(
        default=None,
        description="A cron expression read in ``timezone`` (six fields: seconds first); "
        "an expression cronsim cannot read is 422.",
    )
    every: Annotated[float, Field(ge=0.001, le=366 * 86400)] | SkipJsonSchema[None] = Field(
        default=None, description="Or a tick every so many seconds."
    )
    input: Any = Field(default=None, description="Each run's input (any JSON value).")
    thread: Id | SkipJsonSchema[None] = Field(
        default=None, description="The thread every tick runs on."
    )
    thread_template: (
        Annotated[str, Field(min_length=1, max_length=MAX_KEY)] | SkipJsonSchema[None]
    ) = Field(
        default=None,
        description="Or a thread per tick: {date}, {time}, {tick}, {name} are filled in.",
    )
    timezone: str = Field(
        default="UTC", max_length=64, description="An IANA time zone (unknown: 422)."
    )
    overlap: Literal["skip", "enqueue", "allow"] = Field(
        default="skip", description="A tick while the previous tick's run is unfinished."
    )
    catch_up: Literal["skip", "latest", "all"] = Field(
        default="latest", description="Ticks missed by downtime: none, the latest, or all."
    )
    max_catch_up: int = Field(default=10, ge=1, le=10_000, description="At most so many.")
    paused: bool = False

    @field_validator("cron", "every", "thread", "thread_template", mode="before")
    @classmethod
    def _not_null(cls, value: Any) -> Any:
        if value is None:
            raise ValueError("leave it out rather than null")
        return value

    @model_validator(mode="after")
    def _one_each(self) -> PutSchedule:
        if (self.cron is None) == (self.every is None):
            raise ValueError("give exactly one of cron and every")
        if (self.thread is None) == (self.thread_template is None):
            raise ValueError("give exactly one of thread and thread_template")
        return self


class ScheduleView(_View):
    name: Key
    tenant: str | None
    target: str
    cron: str | None
    every: float | None
    input: Any = None
    thread: str | None
    thread_template: str | None
    timezone: str
    overlap: str
    catch_up: str
    max_catch_up: int
    paused: bool
    next_fire_at: datetime | None = Field(description="The next tick (the store's clock).")
    last_tick: datetime | None
    last_dispatch_id: str | None = Field(description="What the last tick or trigger fired.")
    waiting_since: datetime | None = Field(
        default=None,
        description="overlap=enqueue: the first tick waiting for the previous run to end.",
    )
    fired: int
    revision: int
    created_at: datetime | None
    updated_at: datetime | None


class SchedulePage(BaseModel):
    schedules: list[ScheduleView]
    next_after: str | None = Field(description="Cursor of the next page; null at the end.")


def schedule_view(s: Schedule, shown_name: str) -> ScheduleView:
    view = ScheduleView.model_validate(s, from_attributes=True)
    view.name = shown_name
    return view


__all__ = ["PutSchedule", "SchedulePage", "ScheduleView", "schedule_view"]
