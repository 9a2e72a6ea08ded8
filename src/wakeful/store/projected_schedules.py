"""The schedules half of ``ProjectedStore`` (memory and file stores): definitions in the
projection, each change one record, the compare-and-set decided with no ``await`` between
reading the current revision and applying the change."""

from __future__ import annotations

from datetime import datetime

from wakeful.ids import check_count, check_optional_id
from wakeful.records import Schedule
from wakeful.store import schedule_rows
from wakeful.store.projected_core import ProjectedCore
from wakeful.store.projection import ScheduleDeleted, SchedulePut


class ProjectedSchedules(ProjectedCore):
    """``ScheduleStore`` over the projection."""

    async def store_now(self) -> datetime:
        self._open()
        return self._now()

    async def put_schedule(
        self, schedule: Schedule, expected_revision: int | None = None
    ) -> Schedule | None:
        new = schedule_rows.check_schedule(schedule)
        expected = schedule_rows.check_expected(expected_revision)
        state, now = self._open(), self._now()
        stored = schedule_rows.replaced(state.schedules.get(new.name), new, expected, now)
        if stored is not None:
            await self._record(SchedulePut(stored))
        return stored

    async def get_schedule(self, name: str) -> Schedule | None:
        schedule_rows.check_name(name)
        return self._open().schedules.get(name)

    async def list_schedules(
        self, tenant: str | None = None, after: str | None = None, limit: int = 100
    ) -> list[Schedule]:
        check_optional_id("tenant", tenant)
        check_optional_id("after", after)
        limit = check_count("limit", limit, minimum=1)
        found = sorted(
            (s for s in self._open().schedules.values() if tenant is None or s.tenant == tenant),
            key=lambda s: s.name,
        )
        return [s for s in found if after is None or s.name > after][:limit]

    async def delete_schedule(self, name: str) -> bool:
        schedule_rows.check_name(name)
        if name not in self._open().schedules:
            return False
        await self._record(ScheduleDeleted(name))
        return True

    async def due_schedules(self, limit: int = 100) -> tuple[datetime, list[Schedule]]:
        limit = check_count("limit", limit, minimum=1)
        state, now = self._open(), self._now()
        due = sorted(
            (
                s
                for s in state.schedules.values()
                if not s.paused and s.next_fire_at is not None and s.next_fire_at <= now
            ),
            key=lambda s: (s.next_fire_at, s.name),
        )
        return now, due[:limit]


__all__ = ["ProjectedSchedules"]
