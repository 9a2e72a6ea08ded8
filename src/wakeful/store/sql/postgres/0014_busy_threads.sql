-- wakeful PostgreSQL schema, version 14: busy threads (issue 36, decision 0035).
--
-- Each thread has one run slot. A dispatch holds it while it is pending, leased, awaiting
-- or quarantined (any kind: a cancel holds it too). A start or message dispatch enqueued
-- while it is held waits with status 'queued', outside every claim index (the claim reads
-- nothing new), behind queued_behind. The policy of a submission (if_busy) is decided in
-- enqueue() under the thread row lock, never by a read and then a write:
--   enqueue    wait queued;
--   reject     WK010 (ThreadBusy) naming the slot's holder, nothing stored;
--   interrupt  wait queued, and fence the busy run as cancel() does, with a cancel intent
--              naming the interrupting dispatch (its claimant records 'interrupted');
--   coalesce   wait queued; admitted together with the 'coalesce' dispatches of its kind
--              queued right behind it (they settle done naming it, it lists them).
-- Admission is a trigger: whenever a slot holder stops holding (settled done by settle()
-- or by any commit, retired by a cancel, purged: purge() marks it done first), the thread's
-- first queued dispatch becomes pending in the same transaction, if nothing holds the slot.
-- Every such write holds the thread row lock (the one lock order: thread, then dispatch),
-- as enqueue() does, so an admission and a concurrent enqueue never both see a free slot.
--
-- Migration: a pending start or message with another slot holder of its thread ahead of it
-- becomes queued. Every function keeps its signature (enqueue gains an overload with the
-- policy), so a process of an earlier release keeps working while and after this is
-- applied: it leases no queued work, its settles admit the next run (the trigger), and its
-- enqueues take the default policy. Only its listings may show a status it does not know
-- ('queued'): restart such processes soon after (docs/operations.md).

ALTER TABLE @schema@.dispatches
    DROP CONSTRAINT dispatches_status_check,
    ADD CONSTRAINT dispatches_status_check
        CHECK (status IN ('queued', 'pending', 'leased', 'awaiting', 'done', 'quarantined')),
    ADD COLUMN if_busy text NOT NULL DEFAULT 'enqueue'
        CHECK (if_busy IN ('enqueue', 'reject', 'interrupt', 'rollback', 'coalesce')),
    ADD COLUMN queued_behind text,
    ADD COLUMN coalesced text[] NOT NULL DEFAULT '{}',
    ADD COLUMN answered_by text;

UPDATE @schema@.dispatches d
   SET status = 'queued',
       queued_behind = (SELECT h.dispatch_id FROM @schema@.dispatches h
                         WHERE h.thread_id = d.thread_id AND h.seq < d.seq
                           AND h.status IN ('queued', 'pending', 'leased', 'awaiting',
                                            'quarantined')
                         ORDER BY h.seq DESC LIMIT 1)
 WHERE d.status = 'pending' AND d.kind IN ('start', 'message')
   AND EXISTS (SELECT 1 FROM @schema@.dispatches h
                WHERE h.thread_id = d.thread_id AND h.seq <> d.seq
                  AND (h.status IN ('leased', 'awaiting', 'quarantined')
                       OR (h.status = 'pending' AND h.seq < d.seq)));

-- The dispatch a new run's dispatch of p_thread would wait behind (the last queued, else
-- the slot's holder), or NULL when the slot is free. The caller holds the thread row lock.
CREATE FUNCTION @schema@.slot_ahead(p_thread text, OUT o_behind text, OUT o_busy text,
                                    OUT o_busy_kind text, OUT o_busy_payload text,
                                    OUT o_holder boolean)
LANGUAGE plpgsql AS $fn$
DECLARE
    h @schema@.dispatches%ROWTYPE;
BEGIN
    SELECT * INTO h FROM @schema@.dispatches
     WHERE thread_id = p_thread AND status IN ('pending', 'leased', 'awaiting', 'quarantined')
     ORDER BY seq LIMIT 1;
    o_holder := FOUND;
    IF NOT FOUND THEN
        SELECT * INTO h FROM @schema@.dispatches
         WHERE thread_id = p_thread AND status = 'queued' ORDER BY seq LIMIT 1;
        IF NOT FOUND THEN
            RETURN;
        END IF;
    END IF;
    o_busy := h.dispatch_id;
    o_busy_kind := h.kind;
    o_busy_payload := h.payload;
    SELECT x.dispatch_id INTO o_behind FROM @schema@.dispatches x
     WHERE x.thread_id = p_thread AND x.status = 'queued' ORDER BY x.seq DESC LIMIT 1;
    o_behind := coalesce(o_behind, h.dispatch_id);
END
$fn$;

CREATE FUNCTION @schema@.admit_next() RETURNS trigger
LANGUAGE plpgsql AS $fn$
DECLARE
    h @schema@.dispatches%ROWTYPE;
    stop bigint;
    merged text[] := '{}';
BEGIN
    -- the common case first: nothing waits for the thread (one index probe)
    SELECT * INTO h FROM @schema@.dispatches
     WHERE thread_id = NEW.thread_id AND status = 'queued' ORDER BY seq LIMIT 1;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    IF EXISTS (SELECT 1 FROM @schema@.dispatches
                WHERE thread_id = NEW.thread_id
                  AND status IN ('pending', 'leased', 'awaiting', 'quarantined')) THEN
        RETURN NULL;
    END IF;
    IF h.if_busy = 'coalesce' THEN
        SELECT x.seq INTO stop FROM @schema@.dispatches x
         WHERE x.thread_id = h.thread_id AND x.status = 'queued' AND x.seq > h.seq
           AND (x.if_busy <> 'coalesce' OR x.kind <> h.kind)
         ORDER BY x.seq LIMIT 1;
        WITH m AS (
            UPDATE @schema@.dispatches x
               SET status = 'done', answered_by = h.dispatch_id, updated_at = NEW.updated_at
             WHERE x.thread_id = h.thread_id AND x.status = 'queued' AND x.seq > h.seq
               AND (stop IS NULL OR x.seq < stop)
            RETURNING x.dispatch_id, x.seq
        )
        SELECT coalesce(array_agg(m.dispatch_id ORDER BY m.seq), '{}') INTO merged FROM m;
    END IF;
    UPDATE @schema@.dispatches
       SET status = 'pending', coalesced = merged, updated_at = NEW.updated_at
     WHERE dispatch_id = h.dispatch_id;
    RETURN NULL;
END
$fn$;

CREATE TRIGGER dispatches_admit AFTER UPDATE OF status ON @schema@.dispatches
    FOR EACH ROW
    WHEN (OLD.status IN ('pending', 'leased', 'awaiting', 'quarantined')
          AND NEW.status NOT IN ('pending', 'leased', 'awaiting', 'quarantined'))
    EXECUTE FUNCTION @schema@.admit_next();

-- The fence of cancel() for an intent already decided: insert it first (it holds the run
-- slot while the thread's other open dispatches retire, so none is admitted before it
-- settles), then retire them, advance the epoch and end the claim. The thread row is locked.
CREATE FUNCTION @schema@.fence_thread(p_thread text, p_epoch bigint, p_reason text,
                                      p_dispatch text, p_payload text, p_priority integer,
                                      p_max_attempts bigint, n timestamptz)
RETURNS @schema@.dispatches
LANGUAGE plpgsql AS $fn$
DECLARE
    d @schema@.dispatches%ROWTYPE;
BEGIN
    INSERT INTO @schema@.dispatches
           (dispatch_id, thread_id, kind, payload, priority, available_at, max_attempts,
            dedupe_key, status, attempts, created_at, updated_at)
    VALUES (p_dispatch, p_thread, 'cancel', p_payload, p_priority, n, p_max_attempts,
            NULL, 'pending', 0, n, n)
    RETURNING * INTO d;
    UPDATE @schema@.dispatches
       SET status = 'done', lease_until = NULL, lease_expires = NULL,
           last_error = 'cancelled: ' || p_reason, updated_at = n
     WHERE thread_id = p_thread AND status IN ('pending', 'leased', 'awaiting')
       AND dispatch_id <> p_dispatch;
    -- Advancing the epoch fences the running owner: its commit, renew and settle carry a
    -- token that is no longer the thread's.
    UPDATE @schema@.threads
       SET epoch = p_epoch + 1, claim_holder = NULL, claim_token = NULL, claim_expires = NULL
     WHERE thread_id = p_thread;
    RETURN d;
END
$fn$;

CREATE OR REPLACE FUNCTION @schema@.cancel(p_thread text, p_reason text, p_dispatch text,
                                           p_payload text, p_priority integer,
                                           p_max_attempts bigint)
RETURNS SETOF @schema@.dispatches
LANGUAGE plpgsql AS $fn$
DECLARE
    n timestamptz := @schema@.store_now();
    t @schema@.threads%ROWTYPE;
    d @schema@.dispatches%ROWTYPE;
BEGIN
    INSERT INTO @schema@.threads (thread_id) VALUES (p_thread) ON CONFLICT (thread_id) DO NOTHING;
    SELECT * INTO t FROM @schema@.threads WHERE thread_id = p_thread FOR UPDATE;
    SELECT * INTO d FROM @schema@.dispatches
     WHERE thread_id = p_thread AND kind = 'cancel' AND status = 'pending'
     ORDER BY seq LIMIT 1;
    IF FOUND THEN
        RETURN NEXT d;  -- one pending cancel per thread
        RETURN;
    END IF;
    RETURN NEXT @schema@.fence_thread(p_thread, t.epoch, p_reason, p_dispatch, p_payload,
                                      p_priority, p_max_attempts, n);
END
$fn$;

CREATE FUNCTION @schema@.enqueue(
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
    IF inserted AND run AND p_if_busy = 'interrupt' AND holder AND busy_kind <> 'cancel' THEN
        reason := 'interrupted by ' || p_dispatch;
        PERFORM @schema@.fence_thread(
            p_thread, t.epoch, reason, p_cancel,
            json_build_object('reason', reason, 'interrupted_by', p_dispatch)::text,
            p_cancel_priority, p_cancel_budget, n);
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

-- The enqueue of schema versions 4 to 12, kept for a process of an earlier release that is
-- still running: its submissions take the default policy ("enqueue"), so a run on a busy
-- thread waits queued like any other (that process leases only pending work, and its
-- settles admit the next run through the trigger above).
CREATE OR REPLACE FUNCTION @schema@.enqueue(
    p_dispatch text, p_thread text, p_kind text, p_payload text, p_priority integer,
    p_available_at timestamptz, p_max_attempts bigint, p_dedupe text, p_tenant text)
RETURNS SETOF @schema@.dispatches
LANGUAGE sql AS $fn$
    SELECT * FROM @schema@.enqueue(p_dispatch, p_thread, p_kind, p_payload, p_priority,
                                   p_available_at, p_max_attempts, p_dedupe, p_tenant,
                                   'enqueue', NULL, NULL, NULL)
$fn$;

CREATE OR REPLACE FUNCTION @schema@.purge(p_dispatch text) RETURNS void
LANGUAGE plpgsql AS $fn$
DECLARE
    d @schema@.dispatches%ROWTYPE;
    tid text;
BEGIN
    SELECT thread_id INTO tid FROM @schema@.dispatches WHERE dispatch_id = p_dispatch;
    IF FOUND THEN
        -- the thread row first (an admission may follow), then the dispatch row
        PERFORM 1 FROM @schema@.threads WHERE thread_id = tid FOR UPDATE;
    END IF;
    SELECT * INTO d FROM @schema@.dispatches WHERE dispatch_id = p_dispatch FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'WK006', MESSAGE = 'not found',
            DETAIL = json_build_object('what', 'dispatch', 'ident', p_dispatch)::text;
    END IF;
    IF d.status NOT IN ('quarantined', 'done') THEN
        RAISE EXCEPTION USING ERRCODE = 'WK007', MESSAGE = 'invalid state',
            DETAIL = json_build_object('what', 'dispatch', 'ident', p_dispatch,
                'state', d.status,
                'problem', 'only quarantined or done work can be purged')::text;
    END IF;
    IF d.status = 'quarantined' THEN
        -- it held its thread's run slot: settling it done first admits the next (trigger)
        UPDATE @schema@.dispatches SET status = 'done', updated_at = @schema@.store_now()
         WHERE dispatch_id = p_dispatch;
    END IF;
    DELETE FROM @schema@.dispatches WHERE dispatch_id = p_dispatch;
END
$fn$;

CREATE OR REPLACE FUNCTION @schema@.relay_one() RETURNS boolean
LANGUAGE plpgsql AS $fn$
DECLARE
    n timestamptz := @schema@.store_now();
    o @schema@.outbox%ROWTYPE;
    t @schema@.threads%ROWTYPE;
    behind text;
    busy text;
    did text;
BEGIN
    SELECT * INTO o FROM @schema@.outbox ORDER BY stage_seq LIMIT 1 FOR UPDATE SKIP LOCKED;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    INSERT INTO @schema@.threads (thread_id) VALUES (o.target_thread)
        ON CONFLICT (thread_id) DO NOTHING;
    SELECT * INTO t FROM @schema@.threads WHERE thread_id = o.target_thread FOR UPDATE;
    IF NOT EXISTS (SELECT 1 FROM @schema@.inbox
                    WHERE thread_id = o.target_thread AND message_id = o.message_id) THEN
        INSERT INTO @schema@.inbox (thread_id, message_id, revision, correlation_id,
                                    source_thread, payload, at)
        VALUES (o.target_thread, o.message_id, t.inbox_revision + 1, o.correlation_id,
                o.source_thread, o.payload, n);
        UPDATE @schema@.threads SET inbox_revision = t.inbox_revision + 1, present = true
         WHERE thread_id = o.target_thread;
    END IF;
    -- the same id as wakeful.store.projected.message_dispatch_id computes
    did := 'msg-' || left(encode(sha256(convert_to(o.target_thread, 'UTF8') || '\x00'::bytea
                                         || convert_to(o.message_id, 'UTF8')), 'hex'), 40);
    IF NOT EXISTS (SELECT 1 FROM @schema@.dispatches WHERE dispatch_id = did) THEN
        -- a message run waits for the thread's run slot like any other ("enqueue")
        SELECT s.o_behind, s.o_busy INTO behind, busy
          FROM @schema@.slot_ahead(o.target_thread) s;
        INSERT INTO @schema@.dispatches
               (dispatch_id, thread_id, kind, payload, priority, available_at, max_attempts,
                dedupe_key, status, attempts, created_at, updated_at, queued_behind)
        VALUES (did, o.target_thread, 'message',
                json_build_object('message_id', o.message_id)::text, 0, n, 5, did,
                CASE WHEN busy IS NULL THEN 'pending' ELSE 'queued' END, 0, n, n, behind)
        ON CONFLICT DO NOTHING;
    END IF;
    DELETE FROM @schema@.outbox WHERE stage_seq = o.stage_seq;
    RETURN true;
END
$fn$;

CREATE OR REPLACE FUNCTION @schema@.queue_depths(p_limit integer)
RETURNS TABLE (o_status text, o_count bigint)
LANGUAGE plpgsql STABLE
SET enable_seqscan = off
SET enable_bitmapscan = off
SET enable_sort = off
SET jit = off
AS $fn$
BEGIN
    RETURN QUERY
        SELECT s.status, (SELECT count(*) FROM (SELECT 1 FROM @schema@.dispatches d
                                                   WHERE d.status = ANY (ARRAY[s.status])
                                                   ORDER BY d.status, d.seq
                                                   LIMIT p_limit) c)
          FROM unnest(ARRAY['queued', 'pending', 'leased', 'awaiting', 'quarantined'])
               AS s(status);
END
$fn$;
