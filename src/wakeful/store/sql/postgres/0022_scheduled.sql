-- wakeful PostgreSQL schema, version 22: the 'scheduled' status and debounce (issues 38 and
-- 39, decision 0035 "Time (38) beside it" and its amendment).
--
-- A dispatch whose available_at is later than when it was stored or settled (a delayed run,
-- a schedule tick ahead, a retry's backoff, a durable sleep, a debounced submission) waits
-- 'scheduled', outside every claim index, in dispatches_scheduled by due time. The claim's
-- due step, promote_due(now, limit), called first by claim_next_read, moves the due rows on
-- through admission, so the claim's ranges read no delayed row and filter no time:
--   - a row leased before (a retry, a sleep) kept its thread's run slot while scheduled
--     (a 'scheduled' row with attempts > 0 holds it: slot_ahead, admit_next and the admission
--     trigger count it) and becomes 'pending'; so does a resume (which then retires the
--     'awaiting' rows it takes over) or a cancel;
--   - a delayed run's dispatch is admitted as enqueue() would at that moment: 'pending' on a
--     free thread, else 'queued' in enqueue order, its if_busy applied then ('reject': settled
--     'done' with the reason; 'interrupt'/'rollback': the busy run is fenced).
-- Locks: the due step takes the thread row, then the dispatch row, both SKIP LOCKED (the
-- schema's one lock order; a row another transaction holds waits for the next claim).
-- A cancel (fence_thread) retires the thread's scheduled rows too: a delayed run cancelled
-- before its time never runs.
--
-- Debounce (issue 39): dispatches.debounce_key; enqueue_debounced() folds a submission into
-- the still scheduled dispatch of its (thread, key), replacing its payload and due time, or
-- enqueues it (one scheduled row per key: dispatches_debounced).
--
-- Migration: pending rows with a later available_at become scheduled (one whose time has
-- come is moved on by the next claim). A process of the previous release would not move
-- scheduled work on: apply with the fleet stopped (docs/operations.md).

ALTER TABLE @schema@.dispatches
    DROP CONSTRAINT dispatches_status_check,
    ADD CONSTRAINT dispatches_status_check
        CHECK (status IN ('scheduled', 'queued', 'pending', 'leased', 'awaiting', 'done',
                          'quarantined')),
    ADD COLUMN debounce_key text;

CREATE INDEX dispatches_scheduled ON @schema@.dispatches (available_at)
    WHERE status = 'scheduled';
CREATE UNIQUE INDEX dispatches_debounced ON @schema@.dispatches (thread_id, debounce_key)
    WHERE status = 'scheduled' AND debounce_key IS NOT NULL;

-- A retry with a delay (settle(), commit(), commit_many(): every path that settles a lease
-- 'pending' with available_at = now + delay) is stored 'scheduled' by this trigger, so no
-- settling function changes.
CREATE FUNCTION @schema@.schedule_retry() RETURNS trigger
LANGUAGE plpgsql AS $fn$
BEGIN
    NEW.status := 'scheduled';
    RETURN NEW;
END
$fn$;
CREATE TRIGGER dispatches_schedule_retry BEFORE UPDATE OF status ON @schema@.dispatches
    FOR EACH ROW
    WHEN (OLD.status = 'leased' AND NEW.status = 'pending'
          AND NEW.available_at > NEW.updated_at)
    EXECUTE FUNCTION @schema@.schedule_retry();

-- Admission: a scheduled row that was leased keeps the slot, so becoming one frees nothing.
DROP TRIGGER dispatches_admit ON @schema@.dispatches;
CREATE TRIGGER dispatches_admit AFTER UPDATE OF status ON @schema@.dispatches
    FOR EACH ROW
    WHEN (OLD.status IN ('pending', 'leased', 'awaiting', 'quarantined')
          AND NEW.status NOT IN ('pending', 'leased', 'awaiting', 'quarantined')
          AND NOT (NEW.status = 'scheduled' AND NEW.attempts > 0))
    EXECUTE FUNCTION @schema@.admit_next();


-- The due step: up to p_limit scheduled rows due by n, in due order, through admission.
-- Returns how many it moved on.
-- (No SET clauses: a function's own settings cost a save and restore on every call, and
-- claim_next_read's apply inside it.)
CREATE FUNCTION @schema@.promote_due(n timestamptz, p_limit integer) RETURNS integer
LANGUAGE plpgsql
AS $fn$
DECLARE
    c record;
    d @schema@.dispatches%ROWTYPE;
    t @schema@.threads%ROWTYPE;
    behind text;
    busy text;
    busy_kind text;
    busy_payload text;
    holder boolean;
    reason text;
    intent text;
    moved integer := 0;
BEGIN
    -- the common case first: nothing is due (one probe, no cursor)
    IF NOT EXISTS (SELECT FROM @schema@.dispatches x
                    WHERE x.status = 'scheduled' AND x.available_at <= n) THEN
        RETURN 0;
    END IF;
    FOR c IN SELECT x.dispatch_id, x.thread_id FROM @schema@.dispatches x
              WHERE x.status = 'scheduled' AND x.available_at <= n
              ORDER BY x.available_at
              LIMIT p_limit
    LOOP
        -- the thread row, then the dispatch row (the one lock order), neither waited for
        SELECT * INTO t FROM @schema@.threads WHERE thread_id = c.thread_id
           FOR UPDATE SKIP LOCKED;
        CONTINUE WHEN NOT FOUND;
        SELECT * INTO d FROM @schema@.dispatches
         WHERE dispatch_id = c.dispatch_id AND status = 'scheduled' AND available_at <= n
           FOR UPDATE SKIP LOCKED;
        CONTINUE WHEN NOT FOUND;
        moved := moved + 1;
        IF d.attempts > 0 OR d.kind NOT IN ('start', 'message') THEN
            -- it holds its slot (or bypasses admission): pending first, so that retiring
            -- the awaiting rows a resume takes over admits nothing
            UPDATE @schema@.dispatches SET status = 'pending', updated_at = n
             WHERE dispatch_id = d.dispatch_id;
            IF d.kind = 'resume' THEN
                UPDATE @schema@.dispatches SET status = 'done', updated_at = n
                 WHERE thread_id = d.thread_id AND status = 'awaiting';
            END IF;
            CONTINUE;
        END IF;
        SELECT s.o_behind, s.o_busy, s.o_busy_kind, s.o_busy_payload, s.o_holder
          INTO behind, busy, busy_kind, busy_payload, holder
          FROM @schema@.slot_ahead(d.thread_id) s;
        IF busy IS NULL THEN
            UPDATE @schema@.dispatches SET status = 'pending', updated_at = n
             WHERE dispatch_id = d.dispatch_id;
        ELSIF d.if_busy = 'reject' THEN
            UPDATE @schema@.dispatches
               SET status = 'done', updated_at = n,
                   last_error = 'thread busy when due: ' || busy
                       || coalesce(' (' || CASE WHEN busy_kind IN ('start', 'message')
                                   THEN coalesce(busy_payload::jsonb ->> 'run_id', 'run-' || busy)
                                   END || ')', '')
             WHERE dispatch_id = d.dispatch_id;
        ELSE
            -- in enqueue order: behind the last queued before it, else the busy one
            behind := NULL;
            SELECT x.dispatch_id INTO behind FROM @schema@.dispatches x
             WHERE x.thread_id = d.thread_id AND x.status = 'queued' AND x.seq < d.seq
             ORDER BY x.seq DESC LIMIT 1;
            UPDATE @schema@.dispatches
               SET status = 'queued', queued_behind = coalesce(behind, busy), updated_at = n
             WHERE dispatch_id = d.dispatch_id;
            IF d.if_busy IN ('interrupt', 'rollback') AND holder AND busy_kind <> 'cancel' THEN
                IF d.if_busy = 'rollback' THEN
                    reason := 'rolled back by ' || d.dispatch_id;
                    intent := json_build_object('reason', reason, 'interrupted_by',
                                                d.dispatch_id, 'rollback', true)::text;
                ELSE
                    reason := 'interrupted by ' || d.dispatch_id;
                    intent := json_build_object('reason', reason, 'interrupted_by',
                                                d.dispatch_id)::text;
                END IF;
                -- CANCEL_PRIORITY and the default budget, as the Python side passes them
                PERFORM @schema@.fence_thread(
                    d.thread_id, t.epoch, reason,
                    'cancel-' || replace(gen_random_uuid()::text, '-', ''), intent,
                    2147483647, 5, n);
            END IF;
        END IF;
    END LOOP;
    RETURN moved;
END
$fn$;

-- Debounce: the still scheduled dispatch of (p_thread, p_key) takes this submission's
-- payload and due time, under the thread row lock (concurrent submissions of the thread
-- queue on it); else the submission is enqueued (scheduled) with the key.
CREATE FUNCTION @schema@.enqueue_debounced(
    p_key text, p_dispatch text, p_thread text, p_kind text, p_payload text,
    p_priority integer, p_available_at timestamptz, p_max_attempts bigint, p_dedupe text,
    p_tenant text, p_if_busy text, p_cancel text, p_cancel_priority integer,
    p_cancel_budget bigint)
RETURNS SETOF @schema@.dispatches
LANGUAGE plpgsql AS $fn$
DECLARE
    n timestamptz := @schema@.store_now();
    d @schema@.dispatches%ROWTYPE;
BEGIN
    INSERT INTO @schema@.threads (thread_id) VALUES (p_thread) ON CONFLICT (thread_id) DO NOTHING;
    PERFORM 1 FROM @schema@.threads WHERE thread_id = p_thread FOR UPDATE;
    IF p_available_at > n
       AND NOT EXISTS (SELECT 1 FROM @schema@.dispatches WHERE dispatch_id = p_dispatch) THEN
        UPDATE @schema@.dispatches
           SET payload = p_payload, available_at = p_available_at, updated_at = n
         WHERE thread_id = p_thread AND debounce_key = p_key AND status = 'scheduled'
        RETURNING * INTO d;
        IF FOUND THEN
            RETURN NEXT d;
            RETURN;
        END IF;
    END IF;
    SELECT * INTO d FROM @schema@.enqueue(p_dispatch, p_thread, p_kind, p_payload, p_priority,
                                          p_available_at, p_max_attempts, p_dedupe, p_tenant,
                                          p_if_busy, p_cancel, p_cancel_priority,
                                          p_cancel_budget);
    IF NOT FOUND THEN
        RETURN;
    END IF;
    IF d.status = 'scheduled' AND d.debounce_key IS NULL AND d.dispatch_id = p_dispatch THEN
        UPDATE @schema@.dispatches SET debounce_key = p_key
         WHERE dispatch_id = d.dispatch_id
        RETURNING * INTO d;
    END IF;
    RETURN NEXT d;
END
$fn$;

-- The functions below are those of versions 14, 15 and 18 with the 0019 lines marked.

CREATE OR REPLACE FUNCTION @schema@.pin_resume() RETURNS trigger
LANGUAGE plpgsql AS $fn$
BEGIN
    SELECT CASE WHEN h.kind = 'cancel' THEN NULL ELSE h.pinned_version END
      INTO NEW.pinned_version
      FROM @schema@.dispatches h
     WHERE h.thread_id = NEW.thread_id
       AND (h.status IN ('pending', 'leased', 'awaiting', 'quarantined')
            OR (h.status = 'scheduled' AND h.attempts > 0))  -- 0019: a sleeping run's
     ORDER BY h.seq
     LIMIT 1;
    RETURN NEW;
END
$fn$;
CREATE OR REPLACE FUNCTION @schema@.slot_ahead(p_thread text, OUT o_behind text, OUT o_busy text,
                                    OUT o_busy_kind text, OUT o_busy_payload text,
                                    OUT o_holder boolean)
LANGUAGE plpgsql AS $fn$
DECLARE
    h @schema@.dispatches%ROWTYPE;
BEGIN
    SELECT * INTO h FROM @schema@.dispatches
     WHERE thread_id = p_thread
       AND (status IN ('pending', 'leased', 'awaiting', 'quarantined')
            OR (status = 'scheduled' AND attempts > 0))  -- 0019: a retry's backoff, a sleep
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

CREATE OR REPLACE FUNCTION @schema@.admit_next() RETURNS trigger
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
                  AND (status IN ('pending', 'leased', 'awaiting', 'quarantined')
                       OR (status = 'scheduled' AND attempts > 0))) THEN  -- 0019
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

CREATE OR REPLACE FUNCTION @schema@.fence_thread(p_thread text, p_epoch bigint, p_reason text,
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
     WHERE thread_id = p_thread AND status IN ('scheduled', 'pending', 'leased', 'awaiting')
       AND dispatch_id <> p_dispatch;
    -- Advancing the epoch fences the running owner: its commit, renew and settle carry a
    -- token that is no longer the thread's.
    UPDATE @schema@.threads
       SET epoch = p_epoch + 1, claim_holder = NULL, claim_token = NULL, claim_expires = NULL
     WHERE thread_id = p_thread;
    RETURN d;
END
$fn$;

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
    later boolean := coalesce(p_available_at > n, false);  -- 0019: scheduled, admitted when due
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
        IF NOT later THEN
            SELECT * INTO behind, busy, busy_kind, busy_payload, holder
              FROM @schema@.slot_ahead(p_thread);
        END IF;
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
            CASE WHEN later THEN 'scheduled' WHEN busy IS NOT NULL THEN 'queued'
                 ELSE 'pending' END,
            0, n, n, p_tenant, p_if_busy, behind)
    ON CONFLICT DO NOTHING
    RETURNING * INTO d;
    inserted := FOUND;
    IF inserted AND p_tenant IS NOT NULL AND t.version = 0 AND t.tenant IS NULL THEN
        UPDATE @schema@.threads SET tenant = p_tenant, present = true
         WHERE thread_id = p_thread;
    END IF;
    IF inserted AND p_kind = 'resume' AND NOT later THEN  -- (when due if later)
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
          FROM unnest(ARRAY['scheduled', 'queued', 'pending', 'leased', 'awaiting',
                            'quarantined'])
               AS s(status);
END
$fn$;

CREATE OR REPLACE FUNCTION @schema@.claim_next_read(p_holder text, p_ttl double precision,
                                         p_limit integer, p_version text, p_starts boolean)
RETURNS TABLE (o_dispatch @schema@.dispatches, o_version bigint, o_tenant text,
               o_message_count bigint, o_next_seq bigint, o_event_floor bigint,
               o_checkpoint text, o_writes text[])
LANGUAGE plpgsql
SET enable_seqscan = off
SET enable_bitmapscan = off
SET jit = off
SET plan_cache_mode = force_generic_plan
AS $fn$
DECLARE
    n timestamptz := @schema@.store_now();
    expires timestamptz := n + make_interval(secs => p_ttl);
    n_due bigint;
    n_pinned bigint;
    n_lapsed bigint;
    g_dispatch text[];
    g_thread text[];
    g_epoch bigint[];
    g_tenant text[];
    granted integer;
    passed text[];
    cand record;
    th @schema@.threads%ROWTYPE;
    d @schema@.dispatches;
BEGIN
    PERFORM @schema@.promote_due(n, 100);  -- 0019: the due step (scheduled work whose time came)
    -- 1. candidates and their threads, locked
    WITH due AS MATERIALIZED (
        SELECT x.dispatch_id, x.thread_id, x.priority, x.seq, x.status, x.available_at,
               x.tenant
          FROM @schema@.dispatches x
         WHERE p_starts AND x.status = 'pending' AND x.pinned_version IS NULL
           AND NOT coalesce((SELECT y.claim_token IS NOT NULL AND y.claim_expires >= n
                               FROM @schema@.threads y WHERE y.thread_id = x.thread_id), false)
         ORDER BY x.priority DESC, x.seq
         LIMIT p_limit
           FOR UPDATE OF x SKIP LOCKED
    ), pinned AS MATERIALIZED (
        SELECT x.dispatch_id, x.thread_id, x.priority, x.seq, x.status, x.available_at,
               x.tenant
          FROM @schema@.dispatches x
         WHERE x.status = 'pending' AND x.pinned_version = p_version
           AND NOT coalesce((SELECT y.claim_token IS NOT NULL AND y.claim_expires >= n
                               FROM @schema@.threads y WHERE y.thread_id = x.thread_id), false)
         ORDER BY x.pinned_version, x.priority DESC, x.seq
         LIMIT p_limit
           FOR UPDATE OF x SKIP LOCKED
    ), lapsed AS MATERIALIZED (
        SELECT x.dispatch_id, x.thread_id, x.priority, x.seq, x.status, x.available_at,
               x.tenant
          FROM @schema@.dispatches x
         WHERE x.status = 'leased' AND x.lease_expires < n
           AND CASE WHEN x.pinned_version IS NULL THEN p_starts
                    ELSE x.pinned_version = p_version END
           AND NOT coalesce((SELECT y.claim_token IS NOT NULL AND y.claim_expires >= n
                               FROM @schema@.threads y WHERE y.thread_id = x.thread_id), false)
         ORDER BY x.priority DESC, x.seq
         LIMIT p_limit
           FOR UPDATE OF x SKIP LOCKED
    ), firsts AS MATERIALIZED (
        -- the locked row is the latest version: check it again, then the first per thread
        SELECT c.dispatch_id, c.thread_id, c.priority, c.seq, c.tenant
          FROM (SELECT u.*, row_number() OVER (PARTITION BY u.thread_id
                                               ORDER BY u.priority DESC, u.seq) AS r
                  FROM (SELECT * FROM due UNION ALL SELECT * FROM pinned
                        UNION ALL SELECT * FROM lapsed) u
                 WHERE (u.status = 'pending' AND u.available_at <= n)
                    OR u.status = 'leased') c
         WHERE c.r = 1
         ORDER BY c.priority DESC, c.seq
         LIMIT p_limit
    ), held AS MATERIALIZED (
        SELECT y.thread_id, y.epoch, y.version, y.tenant, y.claim_token, y.claim_expires
          FROM @schema@.threads y
         WHERE y.thread_id = ANY (ARRAY(SELECT f.thread_id FROM firsts f))
         ORDER BY y.thread_id
           FOR UPDATE SKIP LOCKED
    )
    SELECT (SELECT count(*) FROM due), (SELECT count(*) FROM pinned),
           (SELECT count(*) FROM lapsed),
           array_agg(f.dispatch_id ORDER BY f.priority DESC, f.seq),
           array_agg(f.thread_id ORDER BY f.priority DESC, f.seq),
           array_agg(h.epoch ORDER BY f.priority DESC, f.seq),
           -- the tenant this lease fixes on its thread, NULL when it fixes none
           array_agg(CASE WHEN h.version = 0 AND h.tenant IS NULL THEN f.tenant END
                     ORDER BY f.priority DESC, f.seq)
      INTO n_due, n_pinned, n_lapsed, g_dispatch, g_thread, g_epoch, g_tenant
      FROM firsts f
      JOIN held h ON h.thread_id = f.thread_id
     -- held by another transaction right now (skipped above), or claimed since our snapshot
     WHERE NOT (h.claim_token IS NOT NULL AND h.claim_expires >= n);
    granted := coalesce(cardinality(g_dispatch), 0);

    IF granted > 0 THEN
        -- 2. tenant only in the SET list when the lease fixes it (see commit())
        IF EXISTS (SELECT FROM unnest(g_tenant) AS v(tenant) WHERE v.tenant IS NOT NULL) THEN
            UPDATE @schema@.threads y SET tenant = v.tenant
              FROM unnest(g_thread, g_tenant) AS v(thread_id, tenant)
             WHERE y.thread_id = v.thread_id AND v.tenant IS NOT NULL;
        END IF;
        -- 3. the claims and the leases (pinning what they grant) in one statement, with each
        --    leased thread's snapshot
        RETURN QUERY
        WITH g AS (
            SELECT * FROM unnest(g_dispatch, g_thread, g_epoch) AS g(dispatch_id, thread_id, epoch)
        ), claims AS (
            UPDATE @schema@.threads y
               SET present = true, epoch = g.epoch + 1, claim_holder = p_holder,
                   claim_token = g.epoch + 1, claim_expires = expires
              FROM g
             WHERE y.thread_id = g.thread_id
        ), leases AS (
            UPDATE @schema@.dispatches x
               SET status = 'leased', attempts = x.attempts + 1, token = g.epoch + 1,
                   holder = p_holder, lease_until = expires, lease_expires = expires,
                   updated_at = n,
                   pinned_version = CASE WHEN x.kind = 'cancel' THEN x.pinned_version
                                         ELSE coalesce(x.pinned_version, p_version) END
              FROM g
             WHERE x.dispatch_id = g.dispatch_id
            RETURNING x.*
        )
        SELECT ROW(l.*)::@schema@.dispatches, t.version, t.tenant, t.message_count + t.message_offset,
               t.next_seq, t.event_floor, c.body,
               ARRAY(SELECT w.body FROM @schema@.writes w WHERE w.thread_id = t.thread_id
                      ORDER BY w.version, w.idx)
          FROM leases l
          JOIN @schema@.threads t ON t.thread_id = l.thread_id
          LEFT JOIN @schema@.checkpoints c
            ON c.thread_id = t.thread_id AND c.checkpoint_id = t.latest_checkpoint
         ORDER BY l.priority DESC, l.seq;
    END IF;

    IF granted >= p_limit OR NOT (n_due = p_limit OR n_pinned = p_limit OR n_lapsed = p_limit)
    THEN
        RETURN;
    END IF;
    -- 4. a refused candidate left room, and a source may hold more: the rest one by one
    passed := coalesce(g_thread, '{}');
    WHILE granted < p_limit LOOP
        WITH a AS MATERIALIZED (
            SELECT x.dispatch_id, x.thread_id, x.priority, x.seq, x.tenant
              FROM @schema@.dispatches x
             WHERE p_starts AND x.status = 'pending' AND x.pinned_version IS NULL
               AND x.thread_id <> ALL (passed)
             ORDER BY x.priority DESC, x.seq
             LIMIT 1
               FOR UPDATE OF x SKIP LOCKED
        ), b AS MATERIALIZED (
            SELECT x.dispatch_id, x.thread_id, x.priority, x.seq, x.tenant
              FROM @schema@.dispatches x
             WHERE x.status = 'pending' AND x.pinned_version = p_version
               AND x.thread_id <> ALL (passed)
             ORDER BY x.pinned_version, x.priority DESC, x.seq
             LIMIT 1
               FOR UPDATE OF x SKIP LOCKED
        ), l AS MATERIALIZED (
            SELECT x.dispatch_id, x.thread_id, x.priority, x.seq, x.tenant
              FROM @schema@.dispatches x
             WHERE x.status = 'leased' AND x.lease_expires < n
               AND CASE WHEN x.pinned_version IS NULL THEN p_starts
                        ELSE x.pinned_version = p_version END
               AND x.thread_id <> ALL (passed)
             ORDER BY x.priority DESC, x.seq
             LIMIT 1
               FOR UPDATE OF x SKIP LOCKED
        )
        SELECT u.dispatch_id, u.thread_id, u.tenant INTO cand
          FROM (SELECT * FROM a UNION ALL SELECT * FROM b UNION ALL SELECT * FROM l) u
         ORDER BY u.priority DESC, u.seq
         LIMIT 1;
        EXIT WHEN NOT FOUND;
        passed := passed || cand.thread_id;
        SELECT * INTO th FROM @schema@.threads y WHERE y.thread_id = cand.thread_id
           FOR UPDATE SKIP LOCKED;
        -- held by another transaction right now, or claimed since our snapshot
        CONTINUE WHEN NOT FOUND OR (th.claim_token IS NOT NULL AND th.claim_expires >= n);
        IF th.version = 0 AND th.tenant IS NULL AND cand.tenant IS NOT NULL THEN
            UPDATE @schema@.threads SET tenant = cand.tenant WHERE thread_id = cand.thread_id;
        END IF;
        WITH granted_claim AS (
            UPDATE @schema@.threads
               SET present = true, epoch = th.epoch + 1, claim_holder = p_holder,
                   claim_token = th.epoch + 1, claim_expires = expires
             WHERE thread_id = cand.thread_id
        )
        UPDATE @schema@.dispatches x
           SET status = 'leased', attempts = x.attempts + 1, token = th.epoch + 1,
               holder = p_holder, lease_until = expires, lease_expires = expires,
               updated_at = n,
               pinned_version = CASE WHEN x.kind = 'cancel' THEN x.pinned_version
                                     ELSE coalesce(x.pinned_version, p_version) END
         WHERE x.dispatch_id = cand.dispatch_id
        RETURNING x.* INTO d;
        granted := granted + 1;
        o_dispatch := d;
        SELECT y.version, y.tenant, y.message_count + y.message_offset, y.next_seq,
               y.event_floor, k.body,
               ARRAY(SELECT w.body FROM @schema@.writes w WHERE w.thread_id = y.thread_id
                      ORDER BY w.version, w.idx)
          INTO o_version, o_tenant, o_message_count, o_next_seq, o_event_floor,
               o_checkpoint, o_writes
          FROM @schema@.threads y
          LEFT JOIN @schema@.checkpoints k
            ON k.thread_id = y.thread_id AND k.checkpoint_id = y.latest_checkpoint
         WHERE y.thread_id = d.thread_id;
        RETURN NEXT;
    END LOOP;
END
$fn$;

-- Existing delayed work, last (with the triggers and functions above in place: a delayed
-- run's row that held its thread's slot while pending frees it now, admitting the next as a
-- settle would).
UPDATE @schema@.dispatches SET status = 'scheduled'
 WHERE status = 'pending' AND available_at > updated_at;
