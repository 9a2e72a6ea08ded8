"""Tenant fairness in the projection of the memory and file stores (issue 39.3, decision
0035 "Fairness"): a fair tag fixed when a dispatch enters ``pending``, so that the claim,
ordered by (priority, fair tag, enqueue order), takes tenants round-robin among equal
priorities.

``tag = max(V, last + 1)``: ``V`` is one below the lowest tag pending at the priority (the
tag of the work being served, in start-time fair queueing), 0 when nothing is pending
there; ``last`` is the highest tag of the tenant's own pending dispatches at the priority.
A tenant with a backlog of 20,000 has tags up to ``V + 20,000``; another tenant's single
dispatch gets ``V`` and is claimed next. A dispatch keeps its tag while it is pending or
leased (a retry, a lapsed lease). Work submitted without a tenant is one more tenant.
The SQL stores compute the same tag (PostgreSQL migration 19, SQLite migration 12)."""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Any

import msgspec

from wakeful.records import Dispatch

ENTERS_FROM = frozenset(("pending", "leased"))
"""A dispatch becoming ``pending`` from these keeps its tag; from any other status (new,
queued behind its thread, waiting for its key, requeued) it gets a new one."""


@dataclass
class FairTags:
    """Derived per-priority and per-(tenant, priority) sorted tags of pending dispatches."""

    by_priority: dict[int, list[float]] = field(default_factory=dict)
    by_tenant: dict[tuple[str | None, int], list[float]] = field(default_factory=dict)

    def tagged(self, before: Dispatch | None, d: Dispatch) -> Dispatch:
        """``d`` with a new tag if it enters ``pending`` from outside (see ``ENTERS_FROM``)."""
        if d.status != "pending" or (before is not None and before.status in ENTERS_FROM):
            return d
        head = self.by_priority.get(d.priority)
        v = head[0] - 1 if head else 0.0
        mine = self.by_tenant.get((d.tenant, d.priority))
        return msgspec.structs.replace(d, fair_tag=max(v, mine[-1] + 1) if mine else v)

    def index(self, before: Dispatch | None, d: Dispatch | None) -> None:
        """Keep the indexes as ``before`` becomes ``d`` (``None``: absent)."""
        if before is not None and before.status == "pending":
            _remove(self.by_priority, before.priority, before.fair_tag)
            _remove(self.by_tenant, (before.tenant, before.priority), before.fair_tag)
        if d is not None and d.status == "pending":
            bisect.insort(self.by_priority.setdefault(d.priority, []), d.fair_tag)
            bisect.insort(self.by_tenant.setdefault((d.tenant, d.priority), []), d.fair_tag)


def _remove(index: dict[Any, list[float]], key: Any, tag: float) -> None:
    tags = index[key]
    del tags[bisect.bisect_left(tags, tag)]
    if not tags:
        del index[key]
