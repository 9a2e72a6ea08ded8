-- wakeful SQLite schema, version 10: schedules (issue 38, decision 0038).
--
-- One row per schedule: the columns the store compares or indexes, and the rest of the
-- definition as JSON (body). revision is the compare-and-set counter of put_schedule;
-- schedules_due serves due_schedules (one range of the unpaused rows by next fire time).
-- Nothing else reads or writes this table: a process of version 9 is not affected.

CREATE TABLE schedules (
    name TEXT PRIMARY KEY,
    tenant TEXT,
    paused INTEGER NOT NULL DEFAULT 0,
    next_fire_at INTEGER,
    revision INTEGER NOT NULL,
    created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL,
    body TEXT NOT NULL
) WITHOUT ROWID;

CREATE INDEX schedules_due ON schedules (next_fire_at) WHERE paused = 0;
CREATE INDEX schedules_by_tenant ON schedules (tenant, name);
