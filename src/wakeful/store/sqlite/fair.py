"""Tenant fairness in SQL (issue 39.3): the fair tag a dispatch takes when it enters
``pending`` from outside, as ``wakeful.store.fairness`` computes it for the projection:
``max(V, last + 1)``, ``V`` one below the lowest unpinned pending tag at its priority (0
when none), ``last`` the highest pending tag of its tenant at its priority."""

from __future__ import annotations

import sqlite3


def tag_sql(priority: str, tenant: str) -> str:
    """The tag as an SQL expression of ``priority`` and ``tenant`` (expressions: parameters,
    or columns of the row being updated)."""
    v = (
        "coalesce((SELECT h.fair_tag - 1 FROM dispatches AS h INDEXED BY dispatches_due "
        "WHERE h.status = 'pending' AND h.pinned_version IS NULL "
        f"AND h.priority = {priority} ORDER BY h.priority DESC, h.fair_tag, h.seq LIMIT 1), 0)"
    )
    last = (
        "(SELECT max(m.fair_tag) FROM dispatches AS m INDEXED BY dispatches_fair "
        f"WHERE m.status = 'pending' AND m.tenant IS {tenant} AND m.priority = {priority})"
    )
    pick = "CASE WHEN l IS NULL THEN v ELSE max(v, l + 1) END"
    return f"(SELECT {pick} FROM (SELECT {v} AS v, {last} AS l))"


_TAG = f"SELECT {tag_sql(':priority', ':tenant')}"
ROW_TAG = tag_sql("dispatches.priority", "dispatches.tenant")
"""The tag of the row an ``UPDATE dispatches`` moves to pending."""


def fair_tag(conn: sqlite3.Connection, priority: int, tenant: str | None) -> float:
    """The tag of a dispatch of ``tenant`` at ``priority`` entering pending now."""
    row = conn.execute(_TAG, {"priority": priority, "tenant": tenant}).fetchone()
    return float(row[0])
