-- wakeful PostgreSQL store, schema version 19: an operator moves runs between versions
-- (issue 40, `wakeful runs migrate --from V --to W`).
--
-- Applied after 0018, under the same rules (one transaction, advisory lock, @schema@ and
-- @channel@ placeholders). Only a function is added: a process of the previous version
-- keeps working against this schema.
--
-- migrate_runs(from, to, limit): up to limit dispatches pinned to `from` that are pending,
-- awaiting (a suspended run), quarantined, or leased with a lapsed lease (never a lease a
-- worker holds), oldest first, are pinned to `to` (released_from cleared), each with a
-- run.migrated event appended to its thread (the body is the EventDraft the Python codec
-- reads: type, data, run_id), in the caller's transaction. The candidates are read by
-- dispatches_by_status and dispatches_lapsing (unfinished work only), then each is locked
-- thread first, dispatch second (the schema's lock order) and checked again. WK006 unless a
-- registered worker of `to` has recorded no stop.
CREATE FUNCTION @schema@.migrate_runs(p_from text, p_to text, p_limit integer)
RETURNS SETOF @schema@.dispatches
LANGUAGE plpgsql AS $fn$
DECLARE
    n timestamptz := @schema@.store_now();
    cand record;
    th @schema@.threads%ROWTYPE;
    d @schema@.dispatches;
    run text;
BEGIN
    IF NOT EXISTS (SELECT FROM @schema@.workers w
                    WHERE w.version = p_to AND w.stopped_at IS NULL) THEN
        RAISE EXCEPTION USING ERRCODE = 'WK006', MESSAGE = 'not found',
            DETAIL = json_build_object('what', 'running worker of version',
                                       'ident', p_to)::text;
    END IF;
    FOR cand IN
        SELECT u.dispatch_id, u.thread_id FROM (
            SELECT x.dispatch_id, x.thread_id, x.seq FROM @schema@.dispatches x
             WHERE x.status IN ('pending', 'awaiting', 'quarantined')
               AND x.pinned_version = p_from
            UNION ALL
            SELECT x.dispatch_id, x.thread_id, x.seq FROM @schema@.dispatches x
             WHERE x.status = 'leased' AND x.lease_expires < n AND x.pinned_version = p_from
        ) u
         ORDER BY u.seq
         LIMIT p_limit
    LOOP
        SELECT * INTO th FROM @schema@.threads WHERE thread_id = cand.thread_id FOR UPDATE;
        UPDATE @schema@.dispatches x
           SET pinned_version = p_to, released_from = NULL, updated_at = n
         WHERE x.dispatch_id = cand.dispatch_id AND x.pinned_version = p_from
           AND (x.status IN ('pending', 'awaiting', 'quarantined')
                OR (x.status = 'leased' AND x.lease_expires < n))
        RETURNING x.* INTO d;
        CONTINUE WHEN NOT FOUND;  -- leased or moved meanwhile
        IF th.thread_id IS NOT NULL THEN  -- a deleted thread's dispatches stay: no event
            SELECT c.body::json ->> 'run_id' INTO run
              FROM @schema@.checkpoints c
             WHERE c.thread_id = th.thread_id AND c.checkpoint_id = th.latest_checkpoint;
            INSERT INTO @schema@.events (thread_id, seq, at, body)
            VALUES (th.thread_id, th.next_seq, n,
                    json_build_object('type', 'run.migrated', 'run_id', run,
                        'data', json_build_object('from', p_from, 'to', p_to,
                                                  'dispatch_id', d.dispatch_id,
                                                  'run_id', run))::text);
            UPDATE @schema@.threads SET next_seq = next_seq + 1, updated_at = n
             WHERE thread_id = th.thread_id;
        END IF;
        RETURN NEXT d;
    END LOOP;
END
$fn$;
