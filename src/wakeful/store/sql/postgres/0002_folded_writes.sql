-- wakeful PostgreSQL store, schema version 2: folded writes, and notifications sent after
-- the commit instead of inside it.
--
-- Applied after 0001_initial.sql, under the same rules (one transaction, advisory lock,
-- @schema@ and @channel@ placeholders). Functions whose signature changes are dropped and
-- created again; the others are replaced in place.
--
-- Folded writes: commit() gains p_release (end the claim with the commit) and p_settle_*
-- (settle the thread's leased dispatch with the commit); claim_and_commit() runs claim()
-- and then commit() under the granted token. Each is still one call, one transaction: a
-- refusal anywhere rolls everything back. The settle body lives once, in settle_locked(),
-- which settle() and commit() both run.
--
-- Notifications: commit() and delete_thread() no longer call pg_notify. A transaction that
-- notifies takes a cluster-wide lock at commit and holds it through its WAL flush, which
-- serialises concurrent committers. The store now sends the notifications itself after the
-- write returned, coalesced, in a transaction of their own (postgres/notify.py).

-- -------------------------------------------------------------------- settle

-- Settle p_dispatch leased with p_token: the checks and the writes of settle(). The caller
-- holds the lock on the dispatch's thread row (lock order: thread row, then dispatch).
CREATE FUNCTION @schema@.settle_locked(p_dispatch text, p_token bigint, p_status text,
                                       p_delay double precision, p_error text)
RETURNS @schema@.dispatches
LANGUAGE plpgsql AS $fn$
DECLARE
    n timestamptz := @schema@.store_now();
    t @schema@.threads%ROWTYPE;
    d @schema@.dispatches%ROWTYPE;
BEGIN
    SELECT * INTO d FROM @schema@.dispatches WHERE dispatch_id = p_dispatch FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'WK006', MESSAGE = 'not found',
            DETAIL = json_build_object('what', 'dispatch', 'ident', p_dispatch)::text;
    END IF;
    SELECT * INTO t FROM @schema@.threads WHERE thread_id = d.thread_id;
    IF d.status <> 'leased' OR d.token IS DISTINCT FROM p_token
       OR t.epoch IS DISTINCT FROM p_token THEN
        RAISE EXCEPTION USING ERRCODE = 'WK001', MESSAGE = 'stale claim',
            DETAIL = json_build_object('thread_id', d.thread_id, 'token', p_token,
                'current', t.claim_token)::text;
    END IF;
    UPDATE @schema@.threads SET claim_holder = NULL, claim_token = NULL, claim_expires = NULL
     WHERE thread_id = d.thread_id AND claim_token = p_token;
    IF p_status = 'pending' THEN
        UPDATE @schema@.dispatches
           SET status = 'pending', token = NULL, holder = NULL, lease_until = NULL,
               lease_expires = NULL, available_at = n + make_interval(secs => p_delay),
               last_error = p_error, updated_at = n
         WHERE dispatch_id = p_dispatch AND token = p_token
        RETURNING * INTO d;
    ELSE
        UPDATE @schema@.dispatches
           SET status = p_status, lease_until = NULL, lease_expires = NULL, updated_at = n
         WHERE dispatch_id = p_dispatch AND token = p_token
        RETURNING * INTO d;
    END IF;
    RETURN d;
END
$fn$;

CREATE OR REPLACE FUNCTION @schema@.settle(p_dispatch text, p_token bigint, p_status text,
                                           p_delay double precision, p_error text)
RETURNS SETOF @schema@.dispatches
LANGUAGE plpgsql AS $fn$
DECLARE
    tid text;
    d @schema@.dispatches%ROWTYPE;
BEGIN
    SELECT thread_id INTO tid FROM @schema@.dispatches WHERE dispatch_id = p_dispatch;
    IF FOUND THEN
        PERFORM 1 FROM @schema@.threads WHERE thread_id = tid FOR UPDATE;
    END IF;
    -- raises not found when the dispatch does not exist (or was purged meanwhile)
    SELECT * INTO d FROM @schema@.settle_locked(p_dispatch, p_token, p_status, p_delay, p_error);
    RETURN NEXT d;
END
$fn$;

-- -------------------------------------------------------------------- commit

DROP FUNCTION @schema@.commit(text, bigint, text, text, bigint, text, text, text, text, text,
                              text[], text[], text[], text[], text[], text[], text[], text[],
                              text[], text[], text[]);

CREATE FUNCTION @schema@.commit(
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
        IF t.version > 0 AND p_cp_tenant IS DISTINCT FROM t.tenant THEN
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
           tenant = CASE WHEN t.version = 0 THEN p_cp_tenant ELSE t.tenant END,
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

-- claim() then commit() under the granted token, in one transaction: any refusal of the
-- commit rolls the claim back too (no claim granted, no token spent).
CREATE FUNCTION @schema@.claim_and_commit(
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
BEGIN
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

-- ---------------------------------------------------------------- maintenance

-- As in version 1, without the pg_notify: the store notifies after it returned true.
CREATE OR REPLACE FUNCTION @schema@.delete_thread(p_thread text) RETURNS boolean
LANGUAGE plpgsql AS $fn$
DECLARE
    t @schema@.threads%ROWTYPE;
BEGIN
    SELECT * INTO t FROM @schema@.threads WHERE thread_id = p_thread FOR UPDATE;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    IF NOT t.present
       AND NOT EXISTS (SELECT 1 FROM @schema@.outbox WHERE source_thread = p_thread) THEN
        RETURN false;
    END IF;
    DELETE FROM @schema@.checkpoints WHERE thread_id = p_thread;
    DELETE FROM @schema@.writes WHERE thread_id = p_thread;
    DELETE FROM @schema@.events WHERE thread_id = p_thread;
    DELETE FROM @schema@.messages WHERE thread_id = p_thread;
    DELETE FROM @schema@.receipts WHERE thread_id = p_thread;
    DELETE FROM @schema@.inbox WHERE thread_id = p_thread;
    DELETE FROM @schema@.outbox WHERE source_thread = p_thread;
    DELETE FROM @schema@.stream_checkpoints WHERE thread_id = p_thread;
    UPDATE @schema@.dispatches SET lease_expires = '-infinity'
     WHERE thread_id = p_thread AND status = 'leased';
    -- Keep the row for its epoch: the next token stays above every token issued before.
    UPDATE @schema@.threads
       SET epoch = t.epoch + 1, present = false, version = 0, tenant = NULL, status = NULL,
           claim_holder = NULL, claim_token = NULL, claim_expires = NULL,
           latest_checkpoint = NULL, write_count = 0, event_floor = 1, next_seq = 1,
           message_count = 0, inbox_revision = 0, updated_at = NULL
     WHERE thread_id = p_thread;
    RETURN true;
END
$fn$;
