"""The schema's distribution rule: what is keyed by thread id, and every documented exception.

A fleet that outgrows one primary distributes the schema by thread id (Citus distributed
tables colocated on ``thread_id``, or a sharding proxy such as PgDog routing on it; see
``docs/sharding.md``). For that, every table's primary key starts with or includes
``thread_id`` (and so does every other unique key, but the fleet-wide ones listed here)
and every function takes the thread(s) it writes, except the tables and functions listed
here, each with its reason. ``tests/test_postgres_sharding.py`` reads the catalog and fails
on a table, unique index or function that is neither thread-keyed nor listed, on a listed
name that no longer exists, and on an entry whose reason is not in ``docs/sharding.md``
word for word.
"""

from __future__ import annotations

THREAD_KEY = "thread_id"
"""The distribution column: every thread-keyed table's primary key includes it."""

THREAD_ARGUMENTS = ("p_thread", "p_threads")
"""A function taking one of these arguments works on the threads it names (single-shard
when one thread, or one batch per shard)."""

REFERENCE_TABLES: dict[str, str] = {
    "workers": "one row per worker process of the fleet, read by every claimer's fence; "
    "small and written once per heartbeat",
    "limit_buckets": "one row per rate-limit key shared by every thread using that provider "
    "or tenant; a token bucket must be one row to be exact",
    "limit_waits": "the runs waiting for a rate-limit key, written with its bucket row by "
    "the same take; small (one row per waiting run) and carries thread_id",
    "concurrency_keys": "one row per concurrency key shared by every thread whose runs carry it; "
    "the key's limit must be one row to be exact",
    "schedules": "one row per named schedule, fired by whichever worker ticks; small and "
    "fleet-wide",
    "schema_migrations": "the migration ledger: one row per applied migration",
}
"""Small fleet-wide tables: Citus reference tables (a copy on every node), or the
coordinator's own tables behind a proxy."""

FLEET_UNIQUE_KEYS: dict[str, str] = {
    "dispatches_id": "a dispatch id names one dispatch across threads: the contract refuses "
    "one id on two threads (DispatchConflict), and settle, get, quarantine, requeue and purge "
    "name the dispatch alone",
    "dispatches_dedupe": "a dedupe key names one dispatch across threads: the contract "
    "returns the first dispatch enqueued with it, whatever thread a second names",
}
"""Unique indexes without ``thread_id`` on thread-keyed tables, by index name: guarantees
across threads that one PostgreSQL gives and a distributed table cannot (Citus refuses a
unique index without the distribution column); a distributed deployment drops them and
loses exactly what the reason says (docs/sharding.md, "Unique keys across threads")."""

CROSS_THREAD_FUNCTIONS: dict[str, str] = {
    "claim_next": "leases the next due dispatches of any thread (the queue)",
    "claim_next_read": "claim_next, then reads each leased thread by its key",
    "list_dispatches": "an operator's page of the queue across threads",
    "list_threads": "an operator's page of threads in key order",
    "queue_depths": "counts of the queue for metrics",
    "prune_dispatches": "retention over the settled part of the queue",
    "prune_threads": "retention walking threads in key order, one batch at a time",
    "release_pins": "frees version pins of dispatches whose worker version is gone",
    "concurrency_use": "counts every concurrency key's admitted and waiting dispatches for "
    "operators",
    "fair_tag": "the tenant's fair tag among the pending dispatches of a priority (the queue)",
    "fill_key": "admits a concurrency key's waiting dispatches of any thread into its free slots",
    "gate_key": "trigger on dispatches: a keyed dispatch waits while its key is full",
    "release_key": "trigger on dispatches: a settled keyed dispatch admits its key's waiting ones",
    "resume_key": "trigger on dispatches: a resume takes the concurrency key of the run it "
    "continues",
    "promote_due": "the claim's due step: moves due scheduled dispatches of any thread on "
    "(the queue)",
    "schedule_retry": "trigger on dispatches: stores a retry with a delay as scheduled",
    "migrate_runs": "an operator moves a version's runs across threads to another version",
    "fire_schedules": "fires a batch of due schedules (a reference table) onto their threads",
    "unfinished_runs": "reads the unfinished runs of a page of schedules' threads",
    "fire_prepared": "fires the due schedules prepared ahead (a reference table) onto their "
    "threads",
    "relay_one": "delivers the oldest staged outbox entry of any thread",
    "settle": "settles a dispatch named by id (its thread is read from the row)",
    "settle_locked": "settle's checks once the dispatch's thread is locked",
    "quarantine": "an operator's action on a dispatch named by id",
    "requeue": "an operator's action on a dispatch named by id",
    "purge": "an operator's action on a dispatch named by id",
    "register_worker": "the worker registry (a reference table)",
    "heartbeat": "the worker registry (a reference table)",
    "retire_worker": "the worker registry (a reference table)",
    "take_limit": "a rate-limit bucket (a reference table)",
    "reconcile_limit": "a rate-limit bucket (a reference table)",
    "store_now": "the server's clock",
    "admit_next": "trigger on dispatches: admits the next queued dispatch of the same thread",
    "dispatch_owner": "trigger on dispatches: copies the thread's tenant onto a new dispatch",
    "dispatch_owner_follows_thread": "trigger on threads: the tenant change reaches the "
    "thread's dispatches",
    "pin_resume": "trigger on dispatches: pins a resume to the version that ran the thread",
    "checkpoint_segment": "trigger on checkpoints: numbers a checkpoint within its thread",
}
"""Functions without a thread argument: the queue's, the operator's, the reference tables'
and the triggers (which act on the row that fired them, so on its thread)."""
