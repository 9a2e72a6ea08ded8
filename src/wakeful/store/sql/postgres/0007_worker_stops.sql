-- wakeful PostgreSQL store, schema version 7: a worker's graceful stop is recorded (issues 17
-- and 21).
--
-- Applied after 0006, under the same rules (one transaction, advisory lock, @schema@ and
-- @channel@ placeholders). register_worker and heartbeat keep their signatures, so a process
-- of the previous version that is still running keeps working against this schema.
--
-- 1. workers.stopped_at: NULL while the incarnation runs (or if it died without stopping);
--    set once by retire_worker() for the current incarnation, cleared by a new registration.
-- 2. retire_worker(worker, incarnation, generation): fenced as heartbeat() is (WK006 for an
--    unknown worker, WK008 when a newer registration exists, nothing changed); idempotent
--    for the current incarnation (the first stop time stays). Returns the row.

ALTER TABLE @schema@.workers ADD COLUMN stopped_at timestamptz;

CREATE OR REPLACE FUNCTION @schema@.register_worker(p_worker text, p_incarnation text)
RETURNS bigint
LANGUAGE sql AS $fn$
    INSERT INTO @schema@.workers AS w
           (worker_id, incarnation_id, generation, registered_at, last_heartbeat, stopped_at)
    VALUES (p_worker, p_incarnation, 1, @schema@.store_now(), @schema@.store_now(), NULL)
    ON CONFLICT (worker_id) DO UPDATE
       SET incarnation_id = excluded.incarnation_id, generation = w.generation + 1,
           registered_at = excluded.registered_at, last_heartbeat = excluded.last_heartbeat,
           stopped_at = NULL
    RETURNING generation
$fn$;

CREATE FUNCTION @schema@.retire_worker(p_worker text, p_incarnation text, p_generation bigint)
RETURNS SETOF @schema@.workers
LANGUAGE plpgsql AS $fn$
DECLARE
    w @schema@.workers%ROWTYPE;
BEGIN
    SELECT * INTO w FROM @schema@.workers WHERE worker_id = p_worker FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'WK006', MESSAGE = 'not found',
            DETAIL = json_build_object('what', 'worker', 'ident', p_worker)::text;
    END IF;
    IF w.generation <> p_generation OR w.incarnation_id <> p_incarnation THEN
        RAISE EXCEPTION USING ERRCODE = 'WK008', MESSAGE = 'worker superseded',
            DETAIL = json_build_object('worker_id', p_worker, 'generation', p_generation,
                'current', w.generation)::text;
    END IF;
    RETURN QUERY UPDATE @schema@.workers
                    SET stopped_at = coalesce(stopped_at, @schema@.store_now())
                  WHERE worker_id = p_worker
              RETURNING *;
END
$fn$;
