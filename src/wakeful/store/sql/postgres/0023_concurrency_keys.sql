-- wakeful PostgreSQL schema, version 23: concurrency keys (issue 39, decision 0035 "Slots").
--
-- dispatches.concurrency_key / concurrency_limit: at most the key's limit of its dispatches
-- are admitted (status pending or leased, a lapsed lease included) at once; the others wait
-- with status 'waiting_key', outside every claim index, holding their thread's run slot. The
-- key's limit is the latest enqueue's (concurrency_keys.lim). Holding is a function of the
-- status, as for the thread's slot: the rows are counted over dispatches_key_held, under the
-- key row's lock (at most the limit's worth of index entries).
--
-- Admission is in triggers (the thread's admission of version 14 is too), so that every
-- write that moves a keyed row keeps the rule without code in each path:
--   gate (BEFORE INSERT / BEFORE UPDATE): a keyed row becoming pending from outside (a
--        keyed insert, queued -> pending by admit_next, quarantined -> pending by requeue,
--        an unkeyed row given a key by enqueue_keyed) locks its key row (creating it; an
--        insert sets its limit and first admits the rows a raised limit makes room for),
--        then waits instead when the key is full or other rows of the key wait already;
--   release (AFTER UPDATE): a keyed row that stops being pending or leased (done, awaiting,
--        quarantined), or a waiting row retired (a cancel), share-locks the key row and admits
--        the key's waiting rows into the free slots, by priority then seq (SKIP LOCKED: a
--        waiting row some transaction is retiring right now is passed over; that
--        transaction's own release trigger fills after it).
-- Lock order: thread row, dispatch row, key row. Two transactions that each settle rows of
-- two keys in opposite orders can deadlock; the server detects it and Database.run retries
-- the one rolled back.
--
-- Tenant fairness (issue 39.3, decision 0035 "Fairness"): dispatches.fair_tag is fixed when
-- a row enters pending from outside (enqueue, the thread's admission admit_next, the key's
-- admission fill_key) by fair_tag(priority, tenant): max(V, last + 1), V one below the
-- lowest unpinned pending tag at the priority (0 when none: dispatches_pending's first
-- entry), last the tenant's highest pending tag there (dispatches_fair's last entry). The
-- claim orders every source by (priority DESC, fair_tag, seq), over the same indexes
-- rebuilt with the tag. A retry, a lapsed lease and a requeue keep their tag; a message
-- the relay inserts pending and a cancel intent keep 0 (they go first at their priority).
--
-- Function bodies of earlier versions changed here, and only in these ways:
--   enqueue (13 arguments, version 15): the INSERT sets fair_tag (two lines);
--   claim_next_read (5 arguments, version 18): every ORDER BY of the candidates and the
--       grants is (priority DESC, fair_tag, seq), and the candidate rows carry fair_tag;
--   slot_ahead, admit_next (version 14): 'waiting_key' holds the thread's run slot;
--       admit_next also sets the admitted row's fair_tag;
--   fence_thread (version 14): a cancel retires a 'waiting_key' row too.
-- enqueue_keyed wraps enqueue for a keyed submission.
--
-- Merged after version 22 (the 'scheduled' status): every function body above is version
-- 22's with these changes applied (a 'scheduled' row leased before still holds its thread's
-- slot beside 'waiting_key'; the claim keeps the due step and filters no time); the status
-- check keeps 'scheduled'; the thread's admission trigger counts 'waiting_key' as a holder.
-- A retry with a delay ('scheduled') gives its key slot back (release_key) and goes through
-- the key's gate again when due.

ALTER TABLE @schema@.dispatches
    DROP CONSTRAINT dispatches_status_check,
    ADD CONSTRAINT dispatches_status_check
        CHECK (status IN ('scheduled', 'queued', 'waiting_key', 'pending', 'leased',
                          'awaiting', 'done', 'quarantined')),
    ADD COLUMN concurrency_key text,
    ADD COLUMN concurrency_limit integer CHECK (concurrency_limit >= 1),
    ADD CONSTRAINT dispatches_key_and_limit
        CHECK ((concurrency_key IS NULL) = (concurrency_limit IS NULL));

ALTER TABLE @schema@.dispatches ADD COLUMN fair_tag double precision NOT NULL DEFAULT 0;
DROP INDEX @schema@.dispatches_pending;
CREATE INDEX dispatches_pending ON @schema@.dispatches (priority DESC, fair_tag, seq)
    WHERE status = 'pending' AND pinned_version IS NULL;
DROP INDEX @schema@.dispatches_pinned;
CREATE INDEX dispatches_pinned ON @schema@.dispatches (pinned_version, priority DESC, fair_tag, seq)
    WHERE status = 'pending' AND pinned_version IS NOT NULL;
CREATE INDEX dispatches_fair ON @schema@.dispatches (tenant, priority, fair_tag)
    WHERE status = 'pending';

-- The fair tag of a row of p_tenant at p_priority entering pending now (see above).
CREATE FUNCTION @schema@.fair_tag(p_priority integer, p_tenant text)
RETURNS double precision
LANGUAGE plpgsql STABLE AS $fn$
DECLARE
    v double precision;
    l double precision;
BEGIN
    -- PL/pgSQL, not SQL: its two probes keep their plans for the session
    SELECT h.fair_tag - 1 INTO v FROM @schema@.dispatches h
     WHERE h.status = 'pending' AND h.pinned_version IS NULL AND h.priority = p_priority
     ORDER BY h.priority DESC, h.fair_tag, h.seq LIMIT 1;
    IF p_tenant IS NULL THEN
        SELECT m.fair_tag INTO l FROM @schema@.dispatches m
         WHERE m.status = 'pending' AND m.tenant IS NULL AND m.priority = p_priority
         ORDER BY m.tenant, m.priority, m.fair_tag DESC LIMIT 1;
    ELSE
        SELECT m.fair_tag INTO l FROM @schema@.dispatches m
         WHERE m.status = 'pending' AND m.tenant = p_tenant AND m.priority = p_priority
         ORDER BY m.tenant, m.priority, m.fair_tag DESC LIMIT 1;
    END IF;
    v := coalesce(v, 0);
    RETURN CASE WHEN l IS NULL THEN v ELSE greatest(v, l + 1) END;
END
$fn$;

CREATE TABLE @schema@.concurrency_keys (
    key text PRIMARY KEY,
    lim integer NOT NULL CHECK (lim >= 1)
);

CREATE INDEX dispatches_key_held ON @schema@.dispatches (concurrency_key)
    WHERE status IN ('pending', 'leased') AND concurrency_key IS NOT NULL;
CREATE INDEX dispatches_key_waiting ON @schema@.dispatches (concurrency_key, priority DESC, seq)
    WHERE status = 'waiting_key';

-- Admit up to the key's free slots from its waiting rows. The caller holds the key row lock.
CREATE FUNCTION @schema@.fill_key(p_key text, p_lim integer, p_at timestamptz)
RETURNS void
LANGUAGE plpgsql AS $fn$
DECLARE
    room bigint;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM @schema@.dispatches
                    WHERE concurrency_key = p_key AND status = 'waiting_key') THEN
        RETURN;
    END IF;
    room := p_lim - (SELECT count(*) FROM @schema@.dispatches
                      WHERE concurrency_key = p_key AND status IN ('pending', 'leased'));
    IF room > 0 THEN
        UPDATE @schema@.dispatches x
           SET status = 'pending', updated_at = p_at,
               fair_tag = @schema@.fair_tag(x.priority, x.tenant)
         WHERE x.dispatch_id IN (SELECT w.dispatch_id FROM @schema@.dispatches w
                                  WHERE w.concurrency_key = p_key AND w.status = 'waiting_key'
                                  ORDER BY w.priority DESC, w.seq
                                  LIMIT room
                                    FOR UPDATE SKIP LOCKED);
    END IF;
END
$fn$;

CREATE FUNCTION @schema@.gate_key() RETURNS trigger
LANGUAGE plpgsql AS $fn$
DECLARE
    lim integer;
    n timestamptz := @schema@.store_now();
    fresh boolean := TG_OP = 'INSERT';  -- a submission: it sets the key's limit
BEGIN
    IF NOT fresh THEN
        fresh := OLD.concurrency_key IS NULL;  -- given its key by enqueue_keyed
    END IF;
    SELECT k.lim INTO lim FROM @schema@.concurrency_keys k
     WHERE k.key = NEW.concurrency_key FOR UPDATE;
    IF NOT FOUND THEN
        INSERT INTO @schema@.concurrency_keys AS k (key, lim)
        VALUES (NEW.concurrency_key, NEW.concurrency_limit)
        ON CONFLICT (key) DO UPDATE SET lim = excluded.lim
        RETURNING k.lim INTO lim;
    ELSIF fresh AND lim <> NEW.concurrency_limit THEN
        -- a new submission sets the key's limit: a raised one admits waiting rows first
        UPDATE @schema@.concurrency_keys SET lim = NEW.concurrency_limit
         WHERE key = NEW.concurrency_key;
        lim := NEW.concurrency_limit;
        PERFORM @schema@.fill_key(NEW.concurrency_key, lim, n);
    END IF;
    IF EXISTS (SELECT 1 FROM @schema@.dispatches
                WHERE concurrency_key = NEW.concurrency_key AND status = 'waiting_key'
                  AND dispatch_id <> NEW.dispatch_id)
       OR (SELECT count(*) FROM @schema@.dispatches
            WHERE concurrency_key = NEW.concurrency_key AND status IN ('pending', 'leased')
              AND dispatch_id <> NEW.dispatch_id) >= lim THEN
        NEW.status := 'waiting_key';
    END IF;
    RETURN NEW;
END
$fn$;

-- trigger names order their firing: a resume takes its run's key (resume_key) before the
-- gate (take_key) judges it
CREATE TRIGGER dispatches_take_key BEFORE INSERT ON @schema@.dispatches
    FOR EACH ROW WHEN (NEW.concurrency_key IS NOT NULL AND NEW.status = 'pending')
    EXECUTE FUNCTION @schema@.gate_key();
CREATE TRIGGER dispatches_take_key_again BEFORE UPDATE OF status, concurrency_key
    ON @schema@.dispatches
    FOR EACH ROW WHEN (NEW.concurrency_key IS NOT NULL AND NEW.status = 'pending'
                       AND (OLD.status NOT IN ('pending', 'leased', 'waiting_key')
                            OR OLD.concurrency_key IS NULL))
    EXECUTE FUNCTION @schema@.gate_key();

-- A release takes the key row FOR KEY SHARE, not FOR UPDATE: releases of one key do not
-- queue behind each other (a hot key's settles would serialise on it), while a gate (FOR
-- UPDATE) and a release still exclude each other, so neither decides on a snapshot that
-- misses the other's row. Two concurrent releases may both fill: each counts the other's
-- released row as still held (not committed yet), so each admits at most the slots it can
-- see free, and SKIP LOCKED keeps them off each other's waiting rows.
CREATE FUNCTION @schema@.release_key() RETURNS trigger
LANGUAGE plpgsql AS $fn$
DECLARE
    lim integer;
BEGIN
    SELECT k.lim INTO lim FROM @schema@.concurrency_keys k
     WHERE k.key = OLD.concurrency_key FOR KEY SHARE;
    IF FOUND THEN
        PERFORM @schema@.fill_key(OLD.concurrency_key, lim, NEW.updated_at);
    END IF;
    RETURN NULL;
END
$fn$;

CREATE TRIGGER dispatches_release_key AFTER UPDATE OF status ON @schema@.dispatches
    FOR EACH ROW
    WHEN (OLD.concurrency_key IS NOT NULL
          AND ((OLD.status IN ('pending', 'leased')
                AND NEW.status NOT IN ('pending', 'leased', 'waiting_key'))
               OR (OLD.status = 'waiting_key' AND NEW.status <> 'pending')))
    EXECUTE FUNCTION @schema@.release_key();

-- A resume takes its run's key when that run has one: the key of the dispatch holding the
-- thread's run slot (the suspended run's), none behind a cancel. (enqueue inserts the row
-- without the key enqueue_keyed was given, so a key given with a resume applies only when
-- its run has none.)
CREATE FUNCTION @schema@.resume_key() RETURNS trigger
LANGUAGE plpgsql AS $fn$
BEGIN
    SELECT h.concurrency_key, h.concurrency_limit
      INTO NEW.concurrency_key, NEW.concurrency_limit
      FROM @schema@.dispatches h
     WHERE h.thread_id = NEW.thread_id
       AND (h.status IN ('waiting_key', 'pending', 'leased', 'awaiting', 'quarantined')
            OR (h.status = 'scheduled' AND h.attempts > 0))  -- a sleeping run's wake-up
       AND h.kind <> 'cancel'
     ORDER BY h.seq
     LIMIT 1;
    RETURN NEW;
END
$fn$;
CREATE TRIGGER dispatches_resume_key BEFORE INSERT ON @schema@.dispatches
    FOR EACH ROW WHEN (NEW.kind = 'resume' AND NEW.concurrency_key IS NULL)
    EXECUTE FUNCTION @schema@.resume_key();

-- enqueue with a key: enqueue() as it is, then, in the same transaction, the key on the row
-- it inserted (the gate judges it there). A retried submission (the row existed) is
-- returned as stored.
CREATE FUNCTION @schema@.enqueue_keyed(
    p_dispatch text, p_thread text, p_kind text, p_payload text, p_priority integer,
    p_available_at timestamptz, p_max_attempts bigint, p_dedupe text, p_tenant text,
    p_if_busy text, p_cancel text, p_cancel_priority integer, p_cancel_budget bigint,
    p_key text, p_key_limit integer)
RETURNS SETOF @schema@.dispatches
LANGUAGE plpgsql AS $fn$
DECLARE
    d @schema@.dispatches%ROWTYPE;
BEGIN
    SELECT * INTO d FROM @schema@.enqueue(p_dispatch, p_thread, p_kind, p_payload, p_priority,
                                          p_available_at, p_max_attempts, p_dedupe, p_tenant,
                                          p_if_busy, p_cancel, p_cancel_priority,
                                          p_cancel_budget);
    IF NOT FOUND THEN
        RETURN;
    END IF;
    IF d.dispatch_id = p_dispatch AND d.concurrency_key IS NULL AND p_key IS NOT NULL
       AND (SELECT x.xmin = pg_current_xact_id()::xid FROM @schema@.dispatches x
             WHERE x.dispatch_id = p_dispatch) THEN
        UPDATE @schema@.dispatches
           SET concurrency_key = p_key, concurrency_limit = p_key_limit
         WHERE dispatch_id = p_dispatch
        RETURNING * INTO d;
    END IF;
    RETURN NEXT d;
END
$fn$;

-- Version 14's functions, with 'waiting_key' holding the thread's run slot.
CREATE OR REPLACE FUNCTION @schema@.slot_ahead(p_thread text, OUT o_behind text,
                                               OUT o_busy text, OUT o_busy_kind text,
                                               OUT o_busy_payload text, OUT o_holder boolean)
LANGUAGE plpgsql AS $fn$
DECLARE
    h @schema@.dispatches%ROWTYPE;
BEGIN
    SELECT * INTO h FROM @schema@.dispatches
     WHERE thread_id = p_thread
       AND (status IN ('waiting_key', 'pending', 'leased', 'awaiting', 'quarantined')
            OR (status = 'scheduled' AND attempts > 0))  -- a retry's backoff, a sleep
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
                  AND (status IN ('waiting_key', 'pending', 'leased', 'awaiting',
                                  'quarantined')
                       OR (status = 'scheduled' AND attempts > 0))) THEN
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
       SET status = 'pending', coalesced = merged, updated_at = NEW.updated_at,
           fair_tag = @schema@.fair_tag(h.priority, h.tenant)
     WHERE dispatch_id = h.dispatch_id;
    RETURN NULL;
END
$fn$;

CREATE OR REPLACE FUNCTION @schema@.fence_thread(p_thread text, p_epoch bigint, p_reason text,
                                                 p_dispatch text, p_payload text,
                                                 p_priority integer, p_max_attempts bigint,
                                                 n timestamptz)
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
     WHERE thread_id = p_thread
       AND status IN ('scheduled', 'waiting_key', 'pending', 'leased', 'awaiting')
       AND dispatch_id <> p_dispatch;
    -- Advancing the epoch fences the running owner: its commit, renew and settle carry a
    -- token that is no longer the thread's.
    UPDATE @schema@.threads
       SET epoch = p_epoch + 1, claim_holder = NULL, claim_token = NULL, claim_expires = NULL
     WHERE thread_id = p_thread;
    RETURN d;
END
$fn$;

-- The keys in use, for operators: each key row with its admitted and waiting rows counted
-- over their indexes (a key with neither is left out).
CREATE FUNCTION @schema@.concurrency_use()
RETURNS TABLE (o_key text, o_limit integer, o_admitted bigint, o_waiting bigint)
LANGUAGE sql STABLE AS $fn$
    SELECT u.key, u.lim, u.admitted, u.waiting FROM (
        SELECT k.key, k.lim,
               (SELECT count(*) FROM @schema@.dispatches d
                 WHERE d.concurrency_key = k.key AND d.status IN ('pending', 'leased'))
                   AS admitted,
               (SELECT count(*) FROM @schema@.dispatches d
                 WHERE d.concurrency_key = k.key AND d.status = 'waiting_key') AS waiting
          FROM @schema@.concurrency_keys k) u
     WHERE u.admitted > 0 OR u.waiting > 0
     ORDER BY u.key
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
          FROM unnest(ARRAY['scheduled', 'queued', 'waiting_key', 'pending', 'leased',
                            'awaiting', 'quarantined']) AS s(status);
END
$fn$;

-- Version 15's enqueue, with the fair tag of a row inserted pending.
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
            queued_behind, fair_tag)
    VALUES (p_dispatch, p_thread, p_kind, p_payload, p_priority, coalesce(p_available_at, n),
            p_max_attempts, p_dedupe,
            CASE WHEN later THEN 'scheduled' WHEN busy IS NOT NULL THEN 'queued'
                 ELSE 'pending' END,
            0, n, n, p_tenant, p_if_busy, behind,
            -- the fair tag of a row entering pending or scheduled (a queued one takes it later)
            CASE WHEN busy IS NULL THEN @schema@.fair_tag(p_priority, p_tenant) ELSE 0 END)
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

-- Version 18's claim_next_read, in (priority, fair tag, seq) order.
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
        SELECT x.dispatch_id, x.thread_id, x.priority, x.fair_tag, x.seq, x.status,
               x.available_at, x.tenant
          FROM @schema@.dispatches x
         WHERE p_starts AND x.status = 'pending' AND x.pinned_version IS NULL
           AND NOT coalesce((SELECT y.claim_token IS NOT NULL AND y.claim_expires >= n
                               FROM @schema@.threads y WHERE y.thread_id = x.thread_id), false)
         ORDER BY x.priority DESC, x.fair_tag, x.seq
         LIMIT p_limit
           FOR UPDATE OF x SKIP LOCKED
    ), pinned AS MATERIALIZED (
        SELECT x.dispatch_id, x.thread_id, x.priority, x.fair_tag, x.seq, x.status,
               x.available_at, x.tenant
          FROM @schema@.dispatches x
         WHERE x.status = 'pending' AND x.pinned_version = p_version
           AND NOT coalesce((SELECT y.claim_token IS NOT NULL AND y.claim_expires >= n
                               FROM @schema@.threads y WHERE y.thread_id = x.thread_id), false)
         ORDER BY x.pinned_version, x.priority DESC, x.fair_tag, x.seq
         LIMIT p_limit
           FOR UPDATE OF x SKIP LOCKED
    ), lapsed AS MATERIALIZED (
        SELECT x.dispatch_id, x.thread_id, x.priority, x.fair_tag, x.seq, x.status,
               x.available_at, x.tenant
          FROM @schema@.dispatches x
         WHERE x.status = 'leased' AND x.lease_expires < n
           AND CASE WHEN x.pinned_version IS NULL THEN p_starts
                    ELSE x.pinned_version = p_version END
           AND NOT coalesce((SELECT y.claim_token IS NOT NULL AND y.claim_expires >= n
                               FROM @schema@.threads y WHERE y.thread_id = x.thread_id), false)
         ORDER BY x.priority DESC, x.fair_tag, x.seq
         LIMIT p_limit
           FOR UPDATE OF x SKIP LOCKED
    ), firsts AS MATERIALIZED (
        -- the locked row is the latest version: check it again, then the first per thread
        SELECT c.dispatch_id, c.thread_id, c.priority, c.fair_tag, c.seq, c.tenant
          FROM (SELECT u.*, row_number() OVER (PARTITION BY u.thread_id
                                               ORDER BY u.priority DESC, u.fair_tag, u.seq) AS r
                  FROM (SELECT * FROM due UNION ALL SELECT * FROM pinned
                        UNION ALL SELECT * FROM lapsed) u
                 WHERE (u.status = 'pending' AND u.available_at <= n)
                    OR u.status = 'leased') c
         WHERE c.r = 1
         ORDER BY c.priority DESC, c.fair_tag, c.seq
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
           array_agg(f.dispatch_id ORDER BY f.priority DESC, f.fair_tag, f.seq),
           array_agg(f.thread_id ORDER BY f.priority DESC, f.fair_tag, f.seq),
           array_agg(h.epoch ORDER BY f.priority DESC, f.fair_tag, f.seq),
           -- the tenant this lease fixes on its thread, NULL when it fixes none
           array_agg(CASE WHEN h.version = 0 AND h.tenant IS NULL THEN f.tenant END
                     ORDER BY f.priority DESC, f.fair_tag, f.seq)
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
         ORDER BY l.priority DESC, l.fair_tag, l.seq;
    END IF;

    IF granted >= p_limit OR NOT (n_due = p_limit OR n_pinned = p_limit OR n_lapsed = p_limit)
    THEN
        RETURN;
    END IF;
    -- 4. a refused candidate left room, and a source may hold more: the rest one by one
    passed := coalesce(g_thread, '{}');
    WHILE granted < p_limit LOOP
        WITH a AS MATERIALIZED (
            SELECT x.dispatch_id, x.thread_id, x.priority, x.fair_tag, x.seq, x.tenant
              FROM @schema@.dispatches x
             WHERE p_starts AND x.status = 'pending' AND x.pinned_version IS NULL
               AND x.thread_id <> ALL (passed)
             ORDER BY x.priority DESC, x.fair_tag, x.seq
             LIMIT 1
               FOR UPDATE OF x SKIP LOCKED
        ), b AS MATERIALIZED (
            SELECT x.dispatch_id, x.thread_id, x.priority, x.fair_tag, x.seq, x.tenant
              FROM @schema@.dispatches x
             WHERE x.status = 'pending' AND x.pinned_version = p_version
               AND x.thread_id <> ALL (passed)
             ORDER BY x.pinned_version, x.priority DESC, x.fair_tag, x.seq
             LIMIT 1
               FOR UPDATE OF x SKIP LOCKED
        ), l AS MATERIALIZED (
            SELECT x.dispatch_id, x.thread_id, x.priority, x.fair_tag, x.seq, x.tenant
              FROM @schema@.dispatches x
             WHERE x.status = 'leased' AND x.lease_expires < n
               AND CASE WHEN x.pinned_version IS NULL THEN p_starts
                        ELSE x.pinned_version = p_version END
               AND x.thread_id <> ALL (passed)
             ORDER BY x.priority DESC, x.fair_tag, x.seq
             LIMIT 1
               FOR UPDATE OF x SKIP LOCKED
        )
        SELECT u.dispatch_id, u.thread_id, u.tenant INTO cand
          FROM (SELECT * FROM a UNION ALL SELECT * FROM b UNION ALL SELECT * FROM l) u
         ORDER BY u.priority DESC, u.fair_tag, u.seq
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

-- The thread's admission (version 22's trigger): 'waiting_key' holds the thread's run slot too.
DROP TRIGGER dispatches_admit ON @schema@.dispatches;
CREATE TRIGGER dispatches_admit AFTER UPDATE OF status ON @schema@.dispatches
    FOR EACH ROW
    WHEN (OLD.status IN ('waiting_key', 'pending', 'leased', 'awaiting', 'quarantined')
          AND NEW.status NOT IN ('waiting_key', 'pending', 'leased', 'awaiting', 'quarantined')
          AND NOT (NEW.status = 'scheduled' AND NEW.attempts > 0))
    EXECUTE FUNCTION @schema@.admit_next();
