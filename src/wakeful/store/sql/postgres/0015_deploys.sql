-- wakeful PostgreSQL store, schema version 15: deploys in the middle of runs (issue 40).
--
-- Applied after 0014, under the same rules (one transaction, advisory lock, @schema@ and
-- @channel@ placeholders). The two-argument register_worker of version 7 stays (a process of
-- the previous version keeps working against this schema; its workers list no version).
--
-- 1. workers.version: the code version the registered incarnation runs, NULL for a worker
--    that named none; a new registration replaces it.
-- 2. register_worker(worker, incarnation, version).

ALTER TABLE @schema@.workers ADD COLUMN version text;

CREATE FUNCTION @schema@.register_worker(p_worker text, p_incarnation text, p_version text)
RETURNS bigint
LANGUAGE sql AS $fn$
    INSERT INTO @schema@.workers AS w
           (worker_id, incarnation_id, generation, registered_at, last_heartbeat, stopped_at,
            version)
    VALUES (p_worker, p_incarnation, 1, @schema@.store_now(), @schema@.store_now(), NULL,
            p_version)
    ON CONFLICT (worker_id) DO UPDATE
       SET incarnation_id = excluded.incarnation_id, generation = w.generation + 1,
           registered_at = excluded.registered_at, last_heartbeat = excluded.last_heartbeat,
           stopped_at = NULL, version = excluded.version
    RETURNING generation
$fn$;
