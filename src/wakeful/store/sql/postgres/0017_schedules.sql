-- wakeful PostgreSQL store, schema version 17: schedules (issue 38, decision 0038).
--
-- Applied after 0016, under the same rules (one transaction, advisory lock, @schema@
-- placeholder). One row per schedule: the columns the store compares or indexes, and the
-- rest of the definition as JSON (body). revision is the compare-and-set counter of
-- put_schedule, decided by one INSERT ... ON CONFLICT statement (no lock held across a round
-- trip); schedules_due serves due_schedules. Nothing of earlier versions reads this table:
-- a process of version 16 keeps working while and after this is applied.

CREATE TABLE @schema@.schedules (
    name text PRIMARY KEY,
    tenant text,
    paused boolean NOT NULL DEFAULT false,
    next_fire_at timestamptz,
    revision bigint NOT NULL,
    created_at timestamptz NOT NULL,
    updated_at timestamptz NOT NULL,
    body text NOT NULL
);

CREATE INDEX schedules_due ON @schema@.schedules (next_fire_at) WHERE NOT paused;
CREATE INDEX schedules_by_tenant ON @schema@.schedules (tenant, name);
