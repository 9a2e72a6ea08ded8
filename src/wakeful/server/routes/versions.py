"""The fleet's code versions (issue 40, docs/deploys.md), for operators: each version with
its workers and the runs pinned to it, and the move of a version's runs to another
(``wakeful runs migrate`` over HTTP). Operators only: the counts span every tenant."""

from __future__ import annotations

from datetime import datetime

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field

from wakeful.errors import InvalidState
from wakeful.fleet.census import DEFAULT_STALE_AFTER, liveness, pinned_runs
from wakeful.fleet.starts import arrivals
from wakeful.server.access import OperatorDep, StateDep
from wakeful.server.schemas import DispatchView, Id
from wakeful.server.views import dispatch_view, errors

router = APIRouter(prefix="/v1", tags=["operators"])


class VersionView(BaseModel):
    version: str
    live_workers: int = Field(
        description="Registered workers of this version that recorded no stop and beat "
        "within the last 60 s."
    )
    workers: int = Field(description="Registered workers of this version, in any state.")
    arrived_at: datetime | None = Field(
        description="When its earliest live worker registered; null with none live."
    )
    newest: bool = Field(
        description="The version that arrived last among those with a live worker: its "
        "workers take the new starts (docs/deploys.md, the newest version first)."
    )
    pinned_runs: int = Field(
        description="Open dispatches pinned to it (pending, leased, awaiting, quarantined): "
        "the runs whose next step waits for, or runs on, its workers."
    )


class VersionList(BaseModel):
    versions: list[VersionView] = Field(description="Newest arrival first; gone ones last.")
    bounded: bool = Field(
        description="The pinned counts stopped at the server's queue depth bound."
    )


class MigrateRuns(BaseModel):
    """Move the runs of one version to another."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    from_version: Id = Field(alias="from", description="The version whose runs move.")
    to_version: Id = Field(alias="to", description="The version that continues them.")
    limit: int = Field(default=100, ge=1, le=1000, description="At most this many runs.")


class MigratedRuns(BaseModel):
    moved: list[DispatchView] = Field(
        description="The dispatches moved, as stored; fewer than limit: nothing else could "
        "move now (a run a worker holds stays until it settles)."
    )


@router.get("/versions", responses=errors(403))
async def list_versions(state: StateDep, caller: OperatorDep) -> VersionList:
    """Every code version the fleet knows (a registered worker's, or a pin's) with its
    workers, whether it is the newest, and how many open dispatches are pinned to it."""
    workers = await state.store.list_workers()
    now = await state.store.store_now()
    pinned, bounded = await pinned_runs(state.store, state.queue_depth_bound)
    arrived = arrivals(workers, now, DEFAULT_STALE_AFTER)
    newest = max(arrived, key=lambda v: (arrived[v], v)) if arrived else None
    names = {w.version for w in workers if w.version is not None} | set(pinned)
    views = [
        VersionView(
            version=name,
            live_workers=sum(
                1
                for w in workers
                if w.version == name and liveness(w, now, DEFAULT_STALE_AFTER) == "alive"
            ),
            workers=sum(1 for w in workers if w.version == name),
            arrived_at=arrived.get(name),
            newest=name == newest,
            pinned_runs=pinned.get(name, 0),
        )
        for name in names
    ]
    views.sort(key=lambda v: (v.arrived_at is None, -(v.arrived_at or now).timestamp(), v.version))
    return VersionList(versions=views, bounded=bounded)


@router.post("/versions/migrate", responses=errors(403, 404, 409))
async def migrate_runs(body: MigrateRuns, state: StateDep, caller: OperatorDep) -> MigratedRuns:
    """Pin up to ``limit`` runs of ``from`` to ``to`` (``wakeful runs migrate``): pending,
    suspended, quarantined and crashed ones, each with a ``run.migrated`` event; their next
    step runs on ``to``'s code. 404 when no running worker has version ``to``; 409 for the
    same version twice. Call again while ``moved`` is full."""
    if body.from_version == body.to_version:  # well-formed, but nothing can move: a conflict
        raise InvalidState(
            "version", body.to_version, "the version of the runs named", "name another one"
        )
    moved = await state.store.migrate_runs(body.from_version, body.to_version, body.limit)
    if moved and state.wake is not None:
        await state.wake.notify()
    return MigratedRuns(moved=[dispatch_view(d) for d in moved])
