"""A thread's tenant: fixed by the first write that names one (DESIGN §3.2, issue 16).

Both functions run inside the writer's ``BEGIN IMMEDIATE`` transaction, so a check and the
write it guards see one state: of two tenants racing to write first to a new thread, the
second finds the thread bound to the first and is refused.
"""

from __future__ import annotations

import sqlite3

from wakeful.errors import TenantMismatch


def check_tenant(conn: sqlite3.Connection, thread_id: str, tenant: str | None) -> None:
    """``TenantMismatch`` when a write naming ``tenant`` meets a thread whose tenant is fixed
    to another: by its first commit (``version > 0``, the tenant may be ``NULL``) or before
    it by a write that named one. A write naming no tenant is never refused here."""
    if tenant is None:
        return
    row = conn.execute(
        "SELECT version, tenant FROM threads WHERE thread_id = ?", (thread_id,)
    ).fetchone()
    if row is not None and (row[0] > 0 or row[1] is not None) and row[1] != tenant:
        raise TenantMismatch(thread_id)


def bind_tenant(conn: sqlite3.Connection, thread_id: str, tenant: str | None) -> None:
    """Fix the thread's tenant to ``tenant`` if nothing fixed it yet, creating the thread's
    row (a thread with no commit then reads as version 0 with this tenant)."""
    if tenant is None:
        return
    conn.execute(
        "INSERT INTO threads (thread_id, tenant) VALUES (?, ?) ON CONFLICT (thread_id) "
        "DO UPDATE SET tenant = excluded.tenant WHERE version = 0 AND tenant IS NULL",
        (thread_id, tenant),
    )
