-- wakeful SQLite schema, version 1: the whole store contract.
--
-- Times are integer microseconds since 1970-01-01 UTC (exact round trip of the records'
-- microsecond datetimes). JSON values are stored as TEXT, so the sqlite3 shell's json
-- functions can inspect them. Rows are removed explicitly (delete_thread, prune, purge),
-- so the schema needs no foreign keys. Applied in one transaction by the migration runner.

-- The highest token issued (or epoch advanced to) per thread. Outlives delete_thread, so
-- tokens stay strictly increasing for a thread id forever.
CREATE TABLE epochs (
    thread_id TEXT PRIMARY KEY,
    epoch INTEGER NOT NULL
) WITHOUT ROWID;

-- One row per thread the store holds anything of (a claim, a commit, a delivery).
-- holder/token/expires_at: the current claim record, NULL when released.
-- latest_*: the latest checkpoint (never pruned); latest_pos its position in history.
-- next_seq: the next event number; floor: the earliest readable event number.
-- write_count: pending writes stored against the latest checkpoint.
CREATE TABLE threads (
    thread_id TEXT PRIMARY KEY,
    version INTEGER NOT NULL DEFAULT 0,
    tenant TEXT,
    holder TEXT,
    token INTEGER,
    expires_at INTEGER,
    latest_pos INTEGER NOT NULL DEFAULT 0,
    latest_id TEXT,
    latest_status TEXT,
    next_seq INTEGER NOT NULL DEFAULT 1,
    floor INTEGER NOT NULL DEFAULT 1,
    message_count INTEGER NOT NULL DEFAULT 0,
    write_count INTEGER NOT NULL DEFAULT 0,
    inbox_revision INTEGER NOT NULL DEFAULT 0,
    updated_at INTEGER
);

CREATE INDEX threads_by_tenant ON threads (tenant, thread_id) WHERE version > 0;

-- Checkpoint history; positions are contiguous per thread (retention removes a prefix).
CREATE TABLE checkpoints (
    thread_id TEXT NOT NULL,
    pos INTEGER NOT NULL,
    checkpoint_id TEXT NOT NULL,
    at INTEGER NOT NULL,
    body TEXT NOT NULL,
    PRIMARY KEY (thread_id, pos),
    UNIQUE (thread_id, checkpoint_id)
);

-- Pending writes of the latest checkpoint, in insertion (rowid) order.
CREATE TABLE pending_writes (
    thread_id TEXT NOT NULL,
    task_id TEXT NOT NULL,
    body TEXT NOT NULL,
    PRIMARY KEY (thread_id, task_id)
);

CREATE TABLE events (
    thread_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    at INTEGER NOT NULL,
    type TEXT NOT NULL,
    data TEXT NOT NULL,
    run_id TEXT,
    checkpoint_id TEXT,
    task_id TEXT,
    PRIMARY KEY (thread_id, seq)
);

-- pos is the message's 0-based index on its thread (messages are never pruned).
CREATE TABLE messages (
    thread_id TEXT NOT NULL,
    pos INTEGER NOT NULL,
    message_id TEXT NOT NULL,
    body TEXT NOT NULL,
    PRIMARY KEY (thread_id, pos),
    UNIQUE (thread_id, message_id)
);

-- Operation receipts: a retried operation id with the same payload hash gets the receipt.
CREATE TABLE receipts (
    thread_id TEXT NOT NULL,
    operation_id TEXT NOT NULL,
    payload_hash TEXT NOT NULL,
    receipt TEXT NOT NULL,
    at INTEGER NOT NULL,
    PRIMARY KEY (thread_id, operation_id)
);

CREATE INDEX receipts_by_age ON receipts (at);

-- Delivered, unconsumed messages.
CREATE TABLE inbox (
    thread_id TEXT NOT NULL,
    message_id TEXT NOT NULL,
    revision INTEGER NOT NULL,
    body TEXT NOT NULL,
    PRIMARY KEY (thread_id, message_id)
);

-- Every message id ever delivered to a thread (until delete_thread), so a late relay of an
-- entry whose message was already consumed is a no-op.
CREATE TABLE delivered (
    thread_id TEXT NOT NULL,
    message_id TEXT NOT NULL,
    PRIMARY KEY (thread_id, message_id)
) WITHOUT ROWID;

-- Staged outbox entries in staging order.
CREATE TABLE outbox (
    stage_seq INTEGER PRIMARY KEY,
    source_thread TEXT NOT NULL,
    target_thread TEXT NOT NULL,
    message_id TEXT NOT NULL,
    body TEXT NOT NULL,
    at INTEGER NOT NULL
);

CREATE INDEX outbox_by_source ON outbox (source_thread);

-- The dispatch queue; seq is the enqueue order.
CREATE TABLE dispatches (
    seq INTEGER PRIMARY KEY,
    dispatch_id TEXT NOT NULL UNIQUE,
    thread_id TEXT NOT NULL,
    kind TEXT NOT NULL,
    payload TEXT NOT NULL,
    priority INTEGER NOT NULL,
    available_at INTEGER NOT NULL,
    max_attempts INTEGER NOT NULL,
    dedupe_key TEXT UNIQUE,
    status TEXT NOT NULL,
    attempts INTEGER NOT NULL,
    token INTEGER,
    holder TEXT,
    lease_until INTEGER,
    last_error TEXT,
    created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL
);

CREATE INDEX dispatches_runnable ON dispatches (priority DESC, seq)
    WHERE status IN ('pending', 'leased');
CREATE INDEX dispatches_by_thread ON dispatches (thread_id, seq);
CREATE INDEX dispatches_by_status ON dispatches (status, seq);
CREATE INDEX dispatches_settled ON dispatches (updated_at) WHERE status = 'done';

CREATE TABLE workers (
    worker_id TEXT PRIMARY KEY,
    incarnation_id TEXT NOT NULL,
    generation INTEGER NOT NULL,
    registered_at INTEGER NOT NULL,
    last_heartbeat INTEGER NOT NULL
);

CREATE TABLE stream_checkpoints (
    run_id TEXT PRIMARY KEY,
    thread_id TEXT NOT NULL,
    body TEXT NOT NULL
);

CREATE INDEX stream_checkpoints_by_thread ON stream_checkpoints (thread_id);
