"""Targets that run a dispatch themselves: compiled LangGraph graphs (issue 44).

A wakeful ``Target`` runs its ``CompiledGraph`` through the worker's ``Runtime``. A
``SelfRunning`` target is handed the whole lease instead (``Job``): it runs its work under
the lease's fenced claim and returns the dispatch's outcome, which the worker settles. The
LangGraph extra (``wakeful.langgraph.targets``) sits above the fleet in the package layers,
so the fleet loads its target by name (``plugin``), as ``wakeful.store`` loads a backend by
URL scheme; see docs/decisions/0052-langgraph-graphs-on-workers.md."""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from wakeful.clock import Clock
from wakeful.fleet.live import LiveChannel
from wakeful.records import Lease, Outcome
from wakeful.runtime.claims import ClaimPolicy
from wakeful.store.contract import Store

LANGGRAPH_PLUGIN = "wakeful.langgraph.targets"
"""The module whose ``fleet_target(name, graph)`` wraps a compiled LangGraph graph."""

TARGETS_KEY = "self_running"
"""``Job.shared[TARGETS_KEY]``: the registry's self-running targets by name (a resume that
names no target, from the HTTP API's ticket answers, finds its graph's target there)."""
SAVER_ID_PREFIX = "lgr-"
"""The id prefix of the checkpoint records a LangGraph saver writes
(``wakeful.langgraph.saver``): a thread whose latest record has it is a LangGraph thread,
whose work (a cancel included) only its LangGraph target may touch."""


@dataclass
class Job:
    """One lease handed to a ``SelfRunning`` target, with what the worker lends it."""

    store: Store
    lease: Lease
    holder: str
    claims: ClaimPolicy
    clock: Clock
    live: LiveChannel | None = None
    shared: dict[str, Any] = field(default_factory=dict)
    """The worker's per-process objects of self-running targets (a LangGraph saver), kept
    across leases: a target puts what it wants reused under its own key."""


@runtime_checkable
class SelfRunning(Protocol):
    """A target that runs a lease itself."""

    name: str

    async def run_dispatch(self, job: Job) -> Outcome:
        """Run ``job.lease`` under its claim and return how its dispatch ends (the worker
        settles it). ``StaleClaim`` (or ``CheckpointWriteFailed``) when the claim was taken
        over: the worker counts the attempt fenced and settles nothing."""
        ...


def plugin(module: str, name: str, graph: Any) -> SelfRunning:
    """The self-running target ``module.fleet_target(name, graph)`` makes."""
    made = importlib.import_module(module).fleet_target(name, graph)
    if not isinstance(made, SelfRunning):
        raise TypeError(f"{module}.fleet_target did not return a self-running target")
    return made


__all__ = ["LANGGRAPH_PLUGIN", "SAVER_ID_PREFIX", "TARGETS_KEY", "Job", "SelfRunning", "plugin"]
