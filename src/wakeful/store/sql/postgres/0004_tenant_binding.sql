-- wakeful PostgreSQL store, schema version 4: a thread's tenant is fixed by the first write
-- that names one.
--
-- Applied after 0003, under the same rules (one transaction, advisory lock, @schema@ and
-- @channel@ placeholders). Functions whose signature changes are dropped and created again;
-- the others are replaced in place.
--
-- dispatches.tenant: the tenant the work was submitted for (NULL: it names none). Dispatches
-- stored before this version keep NULL (their payload may still name one).
--
-- The binding, always inside the write's transaction and under the thread row's lock:
--   enqueue(p_tenant)  refuses (WK005) a thread whose tenant is fixed to another, else fixes
--                      an unbound thread's tenant with the insert (an existing dispatch
--                      returned for comparison fixes nothing);
--   claim(p_tenant)    the same, before the busy check (a busy refusal names the holder);
--   claim_and_commit() checks the checkpoint's tenant before the claim, for that reason;
--   claim_next()       a lease of a dispatch with a tenant fixes an unbound thread's tenant;
--   commit()           a checkpoint's tenant must be the thread's once it is fixed (before
--                      this version: once the thread had a commit); the first checkpoint
--                      fixes it only if nothing did, and a checkpoint-less first commit
--                      leaves an unbound thread's tenant NULL (fixed by its version then).
-- A thread is bound when version > 0 or tenant IS NOT NULL. Binding sets present = true, so
-- read() shows the thread (version 0) and delete_thread() clears the binding.

ALTER TABLE @schema@.dispatches ADD COLUMN tenant text;

-- ------------------------------------------------------------------- claims

DROP FUNCTION @schema@.claim(text, text, double precision);

CREATE FUNCTION @schema@.claim(p_thread text, p_holder text, p_ttl double precision,
                               p_tenant text DEFAULT NULL,
                               OUT o_token bigint, OUT o_expires timestamptz)
LANGUAGE plpgsql AS $fn$
DECLARE
    t @schema@.threads%ROWTYPE;
    n timestamptz := @schema@.store_now();
BEGIN
    -- The row may not exist yet: create it, then lock it. Concurrent first claimers queue
    -- on the insert and then on the row lock; each sees the winner's committed claim.
    INSERT INTO @schema@.threads (thread_id) VALUES (p_thread) ON CONFLICT (thread_id) DO NOTHING;
    SELECT * INTO t FROM @schema@.threads WHERE thread_id = p_thread FOR UPDATE;
    IF p_tenant IS NOT NULL AND (t.version > 0 OR t.tenant IS NOT NULL)
       AND t.tenant IS DISTINCT FROM p_tenant THEN
        RAISE EXCEPTION USING ERRCODE = 'WK005', MESSAGE = 'tenant mismatch',
            DETAIL = json_build_object('thread_id', p_thread)::text;
    END IF;
    IF t.claim_token IS NOT NULL AND n <= t.claim_expires THEN
        RAISE EXCEPTION USING ERRCODE = 'WK010', MESSAGE = 'thread busy',
            DETAIL = json_build_object('thread_id', p_thread, 'holder', t.claim_holder,
                'checkpoint_id', t.latest_checkpoint, 'expires_at', t.claim_expires)::text;
    END IF;
    o_token := t.epoch + 1;
    o_expires := n + make_interval(secs => p_ttl);
    UPDATE @schema@.threads
       SET present = true, epoch = o_token, claim_holder = p_holder, claim_token = o_token,
           claim_expires = o_expires,
           tenant = CASE WHEN t.version = 0 AND t.tenant IS NULL THEN p_tenant
                         ELSE t.tenant END
     WHERE thread_id = p_thread;
END
$fn$;

-- -------------------------------------------------------------------- commit

CREATE OR REPLACE FUNCTION @schema@.commit(
    p_thread text, p_token bigint, p_operation text, p_hash text, p_expected bigint,
    p_cp_id text, p_cp_parent text, p_cp_tenant text, p_cp_status text, p_cp_body text,
    p_write_tasks text[], p_write_checkpoints text[], p_write_bodies text[],
    p_events text[],
    p_message_ids text[], p_message_bodies text[],
    p_outbox_ids text[], p_outbox_targets text[], p_outbox_correlations text[],
    p_outbox_payloads text[],
    p_consume text[],
    p_release boolean, p_settle_dispatch text, p_settle_status text,
    p_settle_delay double precision, p_settle_error text,
    OUT o_replayed boolean, OUT o_version bigint, OUT o_checkpoint text,
    OUT o_first_seq bigint, OUT o_event_count bigint)
LANGUAGE plpgsql AS $fn$
DECLARE
    t @schema@.threads%ROWTYPE;
    r @schema@.receipts%ROWTYPE;
    n timestamptz := @schema@.store_now();
    resulting text;
    bad text;
    bad_cp text;
    -- an empty list arrives as NULL (cheaper to send)
    n_events bigint := coalesce(cardinality(p_events), 0);
    n_writes bigint := coalesce(cardinality(p_write_tasks), 0);
    n_messages bigint := coalesce(cardinality(p_message_ids), 0);
    n_outbox bigint := coalesce(cardinality(p_outbox_ids), 0);
    n_consume bigint := coalesce(cardinality(p_consume), 0);
    owner text;
BEGIN
    -- 1. fencing, always first
    SELECT * INTO t FROM @schema@.threads WHERE thread_id = p_thread FOR UPDATE;
    IF NOT FOUND OR t.claim_token IS DISTINCT FROM p_token THEN
        -- A retried operation whose commit ended its own claim (release or settle) still
        -- gets its receipt, as long as no claim was granted after its token.
        IF FOUND AND p_operation IS NOT NULL AND t.epoch = p_token
           AND t.claim_token IS NULL THEN
            SELECT * INTO r FROM @schema@.receipts
             WHERE thread_id = p_thread AND operation_id = p_operation AND payload_hash = p_hash;
            IF FOUND THEN
                o_replayed := true;
                o_version := r.version;
                o_checkpoint := r.checkpoint_id;
                o_first_seq := r.first_seq;
                o_event_count := r.event_count;
                RETURN;
            END IF;
        END IF;
        RAISE EXCEPTION USING ERRCODE = 'WK001', MESSAGE = 'stale claim',
            DETAIL = json_build_object('thread_id', p_thread, 'token', p_token,
                'current', t.claim_token)::text;
    END IF;
    -- 2. a retried operation returns its receipt and changes nothing
    IF p_operation IS NOT NULL THEN
        SELECT * INTO r FROM @schema@.receipts
         WHERE thread_id = p_thread AND operation_id = p_operation;
        IF FOUND THEN
            IF r.payload_hash <> p_hash THEN
                RAISE EXCEPTION USING ERRCODE = 'WK002', MESSAGE = 'operation conflict',
                    DETAIL = json_build_object('thread_id', p_thread,
                        'operation_id', p_operation)::text;
            END IF;
            o_replayed := true;
            o_version := r.version;
            o_checkpoint := r.checkpoint_id;
            o_first_seq := r.first_seq;
            o_event_count := r.event_count;
            RETURN;
        END IF;
    END IF;
    -- 3. the view the commit was prepared against
    IF p_expected IS NOT NULL AND p_expected <> t.version THEN
        RAISE EXCEPTION USING ERRCODE = 'WK003', MESSAGE = 'version conflict',
            DETAIL = json_build_object('thread_id', p_thread, 'expected', p_expected,
                'actual', t.version, 'what', 'version')::text;
    END IF;
    IF p_cp_body IS NOT NULL AND p_cp_parent IS DISTINCT FROM t.latest_checkpoint THEN
        RAISE EXCEPTION USING ERRCODE = 'WK003', MESSAGE = 'version conflict',
            DETAIL = json_build_object('thread_id', p_thread, 'expected', p_cp_parent,
                'actual', t.latest_checkpoint, 'what', 'parent checkpoint')::text;
    END IF;
    -- 4. consistency with the thread
    resulting := CASE WHEN p_cp_body IS NOT NULL THEN p_cp_id ELSE t.latest_checkpoint END;
    IF p_cp_body IS NOT NULL THEN
        IF EXISTS (SELECT 1 FROM @schema@.checkpoints c
                    WHERE c.thread_id = p_thread AND c.checkpoint_id = p_cp_id) THEN
            RAISE EXCEPTION USING ERRCODE = 'WK004', MESSAGE = 'invalid commit',
                DETAIL = json_build_object('thread_id', p_thread, 'problem',
                    format('checkpoint id %L was used before', p_cp_id))::text;
        END IF;
        IF (t.version > 0 OR t.tenant IS NOT NULL) AND p_cp_tenant IS DISTINCT FROM t.tenant THEN
            RAISE EXCEPTION USING ERRCODE = 'WK005', MESSAGE = 'tenant mismatch',
                DETAIL = json_build_object('thread_id', p_thread)::text;
        END IF;
    END IF;
    IF n_writes > 0 THEN
        SELECT w.task, w.cp INTO bad, bad_cp
          FROM unnest(p_write_tasks, p_write_checkpoints) WITH ORDINALITY AS w(task, cp, o)
         WHERE w.cp IS DISTINCT FROM resulting ORDER BY w.o LIMIT 1;
        IF FOUND THEN
            RAISE EXCEPTION USING ERRCODE = 'WK004', MESSAGE = 'invalid commit',
                DETAIL = json_build_object('thread_id', p_thread, 'problem',
                    format('write of task %L names checkpoint %L but the latest after this '
                           'commit is %L', bad, bad_cp, resulting))::text;
        END IF;
        SELECT w.task INTO bad FROM unnest(p_write_tasks) WITH ORDINALITY AS w(task, o)
         GROUP BY w.task HAVING count(*) > 1 ORDER BY min(w.o) LIMIT 1;
        IF NOT FOUND AND p_cp_body IS NULL AND t.write_count > 0 THEN
            SELECT x.task_id INTO bad FROM @schema@.writes x
             WHERE x.thread_id = p_thread AND x.task_id = ANY (p_write_tasks) LIMIT 1;
        END IF;
        IF FOUND THEN
            RAISE EXCEPTION USING ERRCODE = 'WK004', MESSAGE = 'invalid commit',
                DETAIL = json_build_object('thread_id', p_thread, 'problem',
                    format('task %L already has a write', bad))::text;
        END IF;
    END IF;
    IF n_messages > 0 THEN
        SELECT m.id INTO bad FROM unnest(p_message_ids) WITH ORDINALITY AS m(id, o)
         GROUP BY m.id HAVING count(*) > 1 ORDER BY min(m.o) LIMIT 1;
        IF NOT FOUND AND t.message_count > 0 THEN
            SELECT x.message_id INTO bad FROM @schema@.messages x
             WHERE x.thread_id = p_thread AND x.message_id = ANY (p_message_ids) LIMIT 1;
        END IF;
        IF FOUND THEN
            RAISE EXCEPTION USING ERRCODE = 'WK004', MESSAGE = 'invalid commit',
                DETAIL = json_build_object('thread_id', p_thread, 'problem',
                    format('message id %L is already on the thread', bad))::text;
        END IF;
    END IF;
    IF n_outbox > 0 THEN
        SELECT m.id INTO bad FROM unnest(p_outbox_ids) WITH ORDINALITY AS m(id, o)
         GROUP BY m.id HAVING count(*) > 1 ORDER BY min(m.o) LIMIT 1;
        IF FOUND THEN
            RAISE EXCEPTION USING ERRCODE = 'WK004', MESSAGE = 'invalid commit',
                DETAIL = json_build_object('thread_id', p_thread, 'problem',
                    format('outbox message id %L appears twice', bad))::text;
        END IF;
    END IF;
    IF n_consume > 0 THEN
        SELECT c.id INTO bad FROM unnest(p_consume) WITH ORDINALITY AS c(id, o)
         WHERE NOT EXISTS (SELECT 1 FROM @schema@.inbox i
                            WHERE i.thread_id = p_thread AND i.message_id = c.id
                              AND NOT i.consumed)
         ORDER BY c.o LIMIT 1;
        IF NOT FOUND THEN
            SELECT c.id INTO bad FROM unnest(p_consume) WITH ORDINALITY AS c(id, o)
             GROUP BY c.id HAVING count(*) > 1 ORDER BY min(c.o) LIMIT 1;
        END IF;
        IF FOUND THEN
            RAISE EXCEPTION USING ERRCODE = 'WK004', MESSAGE = 'invalid commit',
                DETAIL = json_build_object('thread_id', p_thread, 'problem',
                    format('inbox message %L is not waiting to be consumed', bad))::text;
        END IF;
    END IF;
    -- apply everything
    IF p_cp_body IS NOT NULL THEN
        INSERT INTO @schema@.checkpoints (thread_id, version, checkpoint_id, at, body)
        VALUES (p_thread, t.version + 1, p_cp_id, n, p_cp_body);
        IF t.write_count > 0 THEN
            DELETE FROM @schema@.writes WHERE thread_id = p_thread;
        END IF;
    END IF;
    IF n_writes > 0 THEN
        INSERT INTO @schema@.writes (thread_id, task_id, version, idx, body)
        SELECT p_thread, w.task, t.version + 1, w.o, w.body
          FROM unnest(p_write_tasks, p_write_bodies) WITH ORDINALITY AS w(task, body, o);
    END IF;
    IF n_events > 0 THEN
        INSERT INTO @schema@.events (thread_id, seq, at, body)
        SELECT p_thread, t.next_seq + e.o - 1, n, e.body
          FROM unnest(p_events) WITH ORDINALITY AS e(body, o);
    END IF;
    IF n_messages > 0 THEN
        INSERT INTO @schema@.messages (thread_id, pos, message_id, body)
        SELECT p_thread, t.message_count + m.o - 1, m.id, m.body
          FROM unnest(p_message_ids, p_message_bodies) WITH ORDINALITY AS m(id, body, o);
    END IF;
    IF n_outbox > 0 THEN
        INSERT INTO @schema@.outbox
               (source_thread, target_thread, message_id, correlation_id, payload, at)
        SELECT p_thread, x.target, x.id, x.corr, x.payload, n
          FROM unnest(p_outbox_ids, p_outbox_targets, p_outbox_correlations, p_outbox_payloads)
               WITH ORDINALITY AS x(id, target, corr, payload, o)
         ORDER BY x.o;
    END IF;
    IF n_consume > 0 THEN
        UPDATE @schema@.inbox SET consumed = true
         WHERE thread_id = p_thread AND message_id = ANY (p_consume);
    END IF;
    IF p_operation IS NOT NULL THEN
        INSERT INTO @schema@.receipts (thread_id, operation_id, payload_hash, version,
                                       checkpoint_id, first_seq, event_count, at)
        VALUES (p_thread, p_operation, p_hash, t.version + 1, resulting, t.next_seq,
                n_events, n);
    END IF;
    UPDATE @schema@.threads
       SET version = t.version + 1,
           tenant = CASE WHEN t.version = 0 AND t.tenant IS NULL AND p_cp_body IS NOT NULL
                         THEN p_cp_tenant ELSE t.tenant END,
           status = CASE WHEN p_cp_body IS NOT NULL THEN p_cp_status ELSE t.status END,
           latest_checkpoint = resulting,
           write_count = CASE WHEN p_cp_body IS NOT NULL THEN 0 ELSE t.write_count END
                         + n_writes,
           next_seq = t.next_seq + n_events,
           message_count = t.message_count + n_messages,
           updated_at = n
     WHERE thread_id = p_thread AND claim_token = p_token;
    -- 5. the dispatch it settles, checked and settled by the code settle() runs; a refusal
    -- here rolls back everything above with it. Settling ends the claim; so does release.
    IF p_settle_dispatch IS NOT NULL THEN
        SELECT d.thread_id INTO owner FROM @schema@.dispatches d
         WHERE d.dispatch_id = p_settle_dispatch;
        IF FOUND AND owner <> p_thread THEN
            RAISE EXCEPTION USING ERRCODE = 'WK004', MESSAGE = 'invalid commit',
                DETAIL = json_build_object('thread_id', p_thread, 'problem',
                    format('it settles dispatch %L, which belongs to thread %L',
                           p_settle_dispatch, owner))::text;
        END IF;
        -- this thread's row is locked above, as settle_locked requires
        PERFORM @schema@.settle_locked(p_settle_dispatch, p_token, p_settle_status,
                                       p_settle_delay, p_settle_error);
    ELSIF p_release THEN
        PERFORM @schema@.release(p_thread, p_token);
    END IF;
    o_replayed := false;
    o_version := t.version + 1;
    o_checkpoint := resulting;
    o_first_seq := t.next_seq;
    o_event_count := n_events;
END
$fn$;

-- As in version 2 (claim() then commit() under the granted token, in one transaction), with
-- the tenant checked before the claim.
CREATE OR REPLACE FUNCTION @schema@.claim_and_commit(
    p_thread text, p_holder text, p_ttl double precision,
    p_operation text, p_hash text, p_expected bigint,
    p_cp_id text, p_cp_parent text, p_cp_tenant text, p_cp_status text, p_cp_body text,
    p_write_tasks text[], p_write_checkpoints text[], p_write_bodies text[],
    p_events text[],
    p_message_ids text[], p_message_bodies text[],
    p_outbox_ids text[], p_outbox_targets text[], p_outbox_correlations text[],
    p_outbox_payloads text[],
    p_consume text[],
    p_release boolean, p_settle_dispatch text, p_settle_status text,
    p_settle_delay double precision, p_settle_error text,
    OUT o_token bigint, OUT o_expires timestamptz,
    OUT o_replayed boolean, OUT o_version bigint, OUT o_checkpoint text,
    OUT o_first_seq bigint, OUT o_event_count bigint)
LANGUAGE plpgsql AS $fn$
DECLARE
    t @schema@.threads%ROWTYPE;
BEGIN
    -- The checkpoint's tenant first, under the row lock that claim() and commit() then
    -- hold on to: a busy refusal would name another tenant's holder.
    IF p_cp_body IS NOT NULL THEN
        INSERT INTO @schema@.threads (thread_id) VALUES (p_thread)
            ON CONFLICT (thread_id) DO NOTHING;
        SELECT * INTO t FROM @schema@.threads WHERE thread_id = p_thread FOR UPDATE;
        IF (t.version > 0 OR t.tenant IS NOT NULL) AND p_cp_tenant IS DISTINCT FROM t.tenant THEN
            RAISE EXCEPTION USING ERRCODE = 'WK005', MESSAGE = 'tenant mismatch',
                DETAIL = json_build_object('thread_id', p_thread)::text;
        END IF;
    END IF;
    SELECT c.o_token, c.o_expires INTO o_token, o_expires
      FROM @schema@.claim(p_thread, p_holder, p_ttl) c;
    SELECT c.o_replayed, c.o_version, c.o_checkpoint, c.o_first_seq, c.o_event_count
      INTO o_replayed, o_version, o_checkpoint, o_first_seq, o_event_count
      FROM @schema@.commit(p_thread, o_token, p_operation, p_hash, p_expected,
                           p_cp_id, p_cp_parent, p_cp_tenant, p_cp_status, p_cp_body,
                           p_write_tasks, p_write_checkpoints, p_write_bodies,
                           p_events,
                           p_message_ids, p_message_bodies,
                           p_outbox_ids, p_outbox_targets, p_outbox_correlations,
                           p_outbox_payloads,
                           p_consume,
                           p_release, p_settle_dispatch, p_settle_status,
                           p_settle_delay, p_settle_error) c;
END
$fn$;

-- --------------------------------------------------------------------- queue

DROP FUNCTION @schema@.enqueue(text, text, text, text, integer, timestamptz, bigint, text);

CREATE FUNCTION @schema@.enqueue(
    p_dispatch text, p_thread text, p_kind text, p_payload text, p_priority integer,
    p_available_at timestamptz, p_max_attempts bigint, p_dedupe text, p_tenant text)
RETURNS SETOF @schema@.dispatches
LANGUAGE plpgsql AS $fn$
DECLARE
    n timestamptz := @schema@.store_now();
    d @schema@.dispatches%ROWTYPE;
    t @schema@.threads%ROWTYPE;
    inserted boolean;
BEGIN
    -- claim_next locks thread rows with SKIP LOCKED and never creates them: every dispatch
    -- has its thread row from the start.
    INSERT INTO @schema@.threads (thread_id) VALUES (p_thread) ON CONFLICT (thread_id) DO NOTHING;
    IF p_tenant IS NOT NULL THEN
        -- Concurrent first writes of two tenants queue on this lock; the second sees the
        -- first's binding (READ COMMITTED reads the latest row version after the wait).
        SELECT * INTO t FROM @schema@.threads WHERE thread_id = p_thread FOR UPDATE;
        IF (t.version > 0 OR t.tenant IS NOT NULL) AND t.tenant IS DISTINCT FROM p_tenant THEN
            RAISE EXCEPTION USING ERRCODE = 'WK005', MESSAGE = 'tenant mismatch',
                DETAIL = json_build_object('thread_id', p_thread)::text;
        END IF;
    END IF;
    -- A concurrent enqueue of the same id or dedupe key waits here for the other
    -- transaction; then the existing row is returned for the caller to compare.
    INSERT INTO @schema@.dispatches
           (dispatch_id, thread_id, kind, payload, priority, available_at, max_attempts,
            dedupe_key, status, attempts, created_at, updated_at, tenant)
    VALUES (p_dispatch, p_thread, p_kind, p_payload, p_priority, coalesce(p_available_at, n),
            p_max_attempts, p_dedupe, 'pending', 0, n, n, p_tenant)
    ON CONFLICT DO NOTHING
    RETURNING * INTO d;
    inserted := FOUND;
    IF inserted AND p_tenant IS NOT NULL AND t.version = 0 AND t.tenant IS NULL THEN
        UPDATE @schema@.threads SET tenant = p_tenant, present = true
         WHERE thread_id = p_thread;
    END IF;
    IF inserted AND p_kind = 'resume' THEN
        -- a resume takes over from the dispatches parked while the run waited for input
        UPDATE @schema@.dispatches SET status = 'done', updated_at = n
         WHERE thread_id = p_thread AND status = 'awaiting';
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

CREATE OR REPLACE FUNCTION @schema@.claim_next(p_holder text, p_ttl double precision, p_limit integer)
RETURNS SETOF @schema@.dispatches
LANGUAGE plpgsql AS $fn$
DECLARE
    n timestamptz := @schema@.store_now();
    expires timestamptz := n + make_interval(secs => p_ttl);
    due refcursor;
    lapsed refcursor;
    a @schema@.dispatches%ROWTYPE;
    b @schema@.dispatches%ROWTYPE;
    have_a boolean;
    have_b boolean;
    d @schema@.dispatches%ROWTYPE;
    t @schema@.threads%ROWTYPE;
    passed text[] := '{}';
    granted integer := 0;
BEGIN
    OPEN due FOR
        SELECT * FROM @schema@.dispatches x
         WHERE x.status = 'pending' AND x.available_at <= n
           AND NOT EXISTS (SELECT 1 FROM @schema@.threads y
                            WHERE y.thread_id = x.thread_id AND y.claim_token IS NOT NULL
                              AND y.claim_expires >= n)
         ORDER BY x.priority DESC, x.seq
           FOR UPDATE OF x SKIP LOCKED;
    OPEN lapsed FOR
        SELECT * FROM @schema@.dispatches x
         WHERE x.status = 'leased' AND x.lease_expires < n
           AND NOT EXISTS (SELECT 1 FROM @schema@.threads y
                            WHERE y.thread_id = x.thread_id AND y.claim_token IS NOT NULL
                              AND y.claim_expires >= n)
         ORDER BY x.priority DESC, x.seq
           FOR UPDATE OF x SKIP LOCKED;
    FETCH due INTO a;
    have_a := FOUND;
    FETCH lapsed INTO b;
    have_b := FOUND;
    WHILE granted < p_limit AND (have_a OR have_b) LOOP
        IF have_a AND (NOT have_b OR a.priority > b.priority
                       OR (a.priority = b.priority AND a.seq < b.seq)) THEN
            d := a;
            FETCH due INTO a;
            have_a := FOUND;
        ELSE
            d := b;
            FETCH lapsed INTO b;
            have_b := FOUND;
        END IF;
        CONTINUE WHEN d.thread_id = ANY (passed);
        -- the locked row is the latest version; check it again
        CONTINUE WHEN NOT ((d.status = 'pending' AND d.available_at <= n)
                           OR d.status = 'leased');
        SELECT * INTO t FROM @schema@.threads y WHERE y.thread_id = d.thread_id
           FOR UPDATE SKIP LOCKED;
        passed := passed || d.thread_id;
        -- held by another transaction right now, or claimed since our snapshot
        CONTINUE WHEN NOT FOUND OR (t.claim_token IS NOT NULL AND t.claim_expires >= n);
        UPDATE @schema@.threads
           SET present = true, epoch = t.epoch + 1, claim_holder = p_holder,
               claim_token = t.epoch + 1, claim_expires = expires,
               tenant = CASE WHEN t.version = 0 AND t.tenant IS NULL THEN d.tenant
                             ELSE t.tenant END
         WHERE thread_id = d.thread_id;
        UPDATE @schema@.dispatches
           SET status = 'leased', attempts = attempts + 1, token = t.epoch + 1,
               holder = p_holder, lease_until = expires, lease_expires = expires,
               updated_at = n
         WHERE dispatch_id = d.dispatch_id
        RETURNING * INTO d;
        RETURN NEXT d;
        granted := granted + 1;
    END LOOP;
    CLOSE due;
    CLOSE lapsed;
END
$fn$;
