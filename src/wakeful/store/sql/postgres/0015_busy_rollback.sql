-- wakeful PostgreSQL schema, version 15: if_busy = 'rollback' (issue 36).
--
-- A 'rollback' submission is taken as an 'interrupt' is (it waits queued, and the busy run
-- is fenced as cancel() does), and its cancel intent says so: reason 'rolled back by <id>'
-- and "rollback": true in its payload, so the worker that leases it ends the busy run and
-- branches the thread back to where it was before that run started (docs/busy-threads.md).
-- Only enqueue() changes (same signature); nothing else reads the flag. A process of the
-- previous release keeps working: it never submits 'rollback' (its stores refused it), and
-- one that leases such an intent ends the run 'interrupted' without the rollback, so upgrade
-- every worker before submitting with 'rollback' (docs/operations.md).

CREATE OR REPLACE FUNCTION @schema@.enqueue(
    p_dispatch text, p_thread text, p_kind text, p_payload text, p_priority integer,
    p_available_at timestamptz, p_max_attempts bigint, p_dedupe text, p_tenant text,
    p_if_busy text, p_cancel text, p_cancel_priority integer, p_cancel_budget bigint)
RETURNS SETOF @schema@.dispatches
LANGUAGE plpgsql AS $fn$
DECLARE
    n timestamptz := @schema@.store_now();
    d @schema@.dispatches%ROWTYPE;
    t @schema@.threads%ROWTYPE;
    behind text;
    busy text;
    busy_kind text;
    busy_payload text;
    holder boolean := false;
    run boolean := p_kind IN ('start', 'message');
    inserted boolean;
    reason text;
    intent text;
BEGIN
    -- claim_next locks thread rows with SKIP LOCKED and never creates them: every dispatch
    -- has its thread row from the start.
    INSERT INTO @schema@.threads (thread_id) VALUES (p_thread) ON CONFLICT (thread_id) DO NOTHING;
    IF p_tenant IS NOT NULL OR run THEN
        -- Concurrent first writes of two tenants, and concurrent runs of the thread, queue
        -- on this lock; each then reads the latest row versions (READ COMMITTED).
        SELECT * INTO t FROM @schema@.threads WHERE thread_id = p_thread FOR UPDATE;
        IF p_tenant IS NOT NULL AND (t.version > 0 OR t.tenant IS NOT NULL)
           AND t.tenant IS DISTINCT FROM p_tenant THEN
            RAISE EXCEPTION USING ERRCODE = 'WK005', MESSAGE = 'tenant mismatch',
                DETAIL = json_build_object('thread_id', p_thread)::text;
        END IF;
    END IF;
    IF run THEN
        -- a retried submission is answered with what it stored, whatever the thread does now
        SELECT * INTO d FROM @schema@.dispatches WHERE dispatch_id = p_dispatch;
        IF NOT FOUND AND p_dedupe IS NOT NULL THEN
            SELECT * INTO d FROM @schema@.dispatches WHERE dedupe_key = p_dedupe;
        END IF;
        IF FOUND THEN
            RETURN NEXT d;
            RETURN;
        END IF;
        SELECT * INTO behind, busy, busy_kind, busy_payload, holder
          FROM @schema@.slot_ahead(p_thread);
        IF busy IS NOT NULL AND p_if_busy = 'reject' THEN
            RAISE EXCEPTION USING ERRCODE = 'WK010', MESSAGE = 'thread busy',
                DETAIL = json_build_object('thread_id', p_thread, 'dispatch_id', busy,
                    'run_id', CASE WHEN busy_kind IN ('start', 'message')
                                   THEN coalesce(busy_payload::jsonb ->> 'run_id',
                                                 'run-' || busy) END)::text;
        END IF;
    END IF;
    -- A concurrent enqueue of the same id or dedupe key waits here for the other
    -- transaction; then the existing row is returned for the caller to compare.
    INSERT INTO @schema@.dispatches
           (dispatch_id, thread_id, kind, payload, priority, available_at, max_attempts,
            dedupe_key, status, attempts, created_at, updated_at, tenant, if_busy,
            queued_behind)
    VALUES (p_dispatch, p_thread, p_kind, p_payload, p_priority, coalesce(p_available_at, n),
            p_max_attempts, p_dedupe,
            CASE WHEN busy IS NOT NULL THEN 'queued' ELSE 'pending' END,
            0, n, n, p_tenant, p_if_busy, behind)
    ON CONFLICT DO NOTHING
    RETURNING * INTO d;
    inserted := FOUND;
    IF inserted AND p_tenant IS NOT NULL AND t.version = 0 AND t.tenant IS NULL THEN
        UPDATE @schema@.threads SET tenant = p_tenant, present = true
         WHERE thread_id = p_thread;
    END IF;
    IF inserted AND p_kind = 'resume' THEN
        -- a resume takes over from the dispatches parked while the run waited for input
        -- (and inherits their run slot: it holds it already, so nothing is admitted)
        UPDATE @schema@.dispatches SET status = 'done', updated_at = n
         WHERE thread_id = p_thread AND status = 'awaiting';
    END IF;
    IF inserted AND run AND p_if_busy IN ('interrupt', 'rollback') AND holder
       AND busy_kind <> 'cancel' THEN
        IF p_if_busy = 'rollback' THEN
            reason := 'rolled back by ' || p_dispatch;
            intent := json_build_object('reason', reason, 'interrupted_by', p_dispatch,
                                        'rollback', true)::text;
        ELSE
            reason := 'interrupted by ' || p_dispatch;
            intent := json_build_object('reason', reason, 'interrupted_by', p_dispatch)::text;
        END IF;
        PERFORM @schema@.fence_thread(
            p_thread, t.epoch, reason, p_cancel, intent, p_cancel_priority, p_cancel_budget, n);
    END IF;
    IF NOT inserted THEN
        SELECT * INTO d FROM @schema@.dispatches WHERE dispatch_id = p_dispatch;
        IF NOT FOUND AND p_dedupe IS NOT NULL THEN
            SELECT * INTO d FROM @schema@.dispatches WHERE dedupe_key = p_dedupe;
        END IF;
        IF NOT FOUND THEN
            RETURN;  -- the conflicting row was purged meanwhile: the caller retries
        END IF;
    END IF;
    RETURN NEXT d;
END
$fn$;
