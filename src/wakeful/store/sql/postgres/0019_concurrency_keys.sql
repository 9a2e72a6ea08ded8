-- wakeful PostgreSQL schema, version 19: concurrency keys (issue 39, decision 0035 "Slots").
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
--        quarantined), or a waiting row retired (a cancel), locks the key row and admits
--        the key's waiting rows into the free slots, by priority then seq (SKIP LOCKED: a
--        waiting row some transaction is retiring right now is passed over; that
--        transaction's own release trigger fills after it).
-- Lock order: thread row, dispatch row, key row. Two transactions that each settle rows of
-- two keys in opposite orders can deadlock; the server detects it and Database.run retries
-- the one rolled back.
--
-- Function bodies of earlier versions changed here (each only to know 'waiting_key' as a
-- holder of the thread's run slot): slot_ahead and admit_next (version 14) and
-- fence_thread (version 14: a cancel retires a waiting row too). enqueue and
-- claim_next_read are unchanged: enqueue_keyed wraps enqueue.

ALTER TABLE @schema@.dispatches
    DROP CONSTRAINT dispatches_status_check,
    ADD CONSTRAINT dispatches_status_check
        CHECK (status IN ('queued', 'waiting_key', 'pending', 'leased', 'awaiting', 'done',
                          'quarantined')),
    ADD COLUMN concurrency_key text,
    ADD COLUMN concurrency_limit integer CHECK (concurrency_limit >= 1),
    ADD CONSTRAINT dispatches_key_and_limit
        CHECK ((concurrency_key IS NULL) = (concurrency_limit IS NULL));

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
        UPDATE @schema@.dispatches x SET status = 'pending', updated_at = p_at
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

CREATE FUNCTION @schema@.release_key() RETURNS trigger
LANGUAGE plpgsql AS $fn$
DECLARE
    lim integer;
BEGIN
    SELECT k.lim INTO lim FROM @schema@.concurrency_keys k
     WHERE k.key = OLD.concurrency_key FOR UPDATE;
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

-- A resume that names no key takes its run's: the key of the dispatch holding the thread's
-- run slot (the suspended run's), none behind a cancel.
CREATE FUNCTION @schema@.resume_key() RETURNS trigger
LANGUAGE plpgsql AS $fn$
BEGIN
    SELECT h.concurrency_key, h.concurrency_limit
      INTO NEW.concurrency_key, NEW.concurrency_limit
      FROM @schema@.dispatches h
     WHERE h.thread_id = NEW.thread_id
       AND h.status IN ('waiting_key', 'pending', 'leased', 'awaiting', 'quarantined')
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
       AND status IN ('waiting_key', 'pending', 'leased', 'awaiting', 'quarantined')
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
                  AND status IN ('waiting_key', 'pending', 'leased', 'awaiting',
                                 'quarantined')) THEN
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
     WHERE thread_id = p_thread AND status IN ('waiting_key', 'pending', 'leased', 'awaiting')
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
          FROM unnest(ARRAY['queued', 'waiting_key', 'pending', 'leased', 'awaiting',
                            'quarantined']) AS s(status);
END
$fn$;
