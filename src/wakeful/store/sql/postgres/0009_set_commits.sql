-- wakeful PostgreSQL store, schema version 9: a group of commits is written set-based (issue
-- 22, second round).
--
-- Applied after 0008, under the same rules (one transaction, advisory lock, @schema@ and
-- @channel@ placeholders). No function changes its signature, so a process of the previous
-- version that is still running keeps working against this schema (its commit_many calls get
-- the new body, with the same rows back).
--
-- 1. commit_many() no longer runs commit() once per commit, each in a subtransaction. When
--    every commit of the call is to a different thread and none carries pending writes,
--    messages, outbox entries or consumed inbox ids (the commits a dispatch makes), the call
--    is three statements whatever its size: lock the threads (thread id order), lock the
--    dispatches they settle (each only with its own thread), then one statement that judges
--    every commit with commit()'s checks, in commit()'s order and with its SQLSTATE and
--    DETAIL, as set operations, and writes the checkpoints, events, receipts, settled
--    dispatches and thread rows of the commits that passed. A refused commit is reported in
--    its row and writes nothing; the others are written. Any other call (a thread twice, or
--    one of the rarer parts) runs as before: commit_each(), version 6's loop.
-- 2. The segment columns of migration 0008 are computed in the statements that insert a
--    checkpoint (commit(), as in version 6 otherwise, and commit_many()), the same way, and
--    the trigger only fills them for an insert that leaves them NULL: a row trigger is a
--    PL/pgSQL call and one more statement per checkpoint.

-- ---------------------------------------------------------------- segments

-- As in version 8, for inserts that do not fill the columns themselves.
DROP TRIGGER checkpoints_segment ON @schema@.checkpoints;
CREATE TRIGGER checkpoints_segment BEFORE INSERT ON @schema@.checkpoints
    FOR EACH ROW WHEN (NEW.ordinal IS NULL)
    EXECUTE FUNCTION @schema@.checkpoint_segment();

-- -------------------------------------------------------------------- commit

-- As in version 6, with the segment columns filled by its insert (see 2).
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
    d @schema@.dispatches%ROWTYPE;
    r_hash text;
    r_version bigint;
    r_checkpoint text;
    r_first bigint;
    r_count bigint;
    cp_used boolean := false;
    ending boolean := p_settle_dispatch IS NOT NULL OR coalesce(p_release, false);
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
    -- 2. a retried operation returns its receipt and changes nothing (read in one statement
    -- with 4's question whether the checkpoint id was used before)
    IF p_operation IS NOT NULL OR p_cp_body IS NOT NULL THEN
        SELECT x.payload_hash, x.version, x.checkpoint_id, x.first_seq, x.event_count,
               p_cp_body IS NOT NULL
               AND EXISTS (SELECT 1 FROM @schema@.checkpoints c
                            WHERE c.thread_id = p_thread AND c.checkpoint_id = p_cp_id)
          INTO r_hash, r_version, r_checkpoint, r_first, r_count, cp_used
          FROM (SELECT 1) one
          LEFT JOIN @schema@.receipts x
            ON x.thread_id = p_thread AND x.operation_id = p_operation;
        IF r_hash IS NOT NULL THEN
            IF r_hash <> p_hash THEN
                RAISE EXCEPTION USING ERRCODE = 'WK002', MESSAGE = 'operation conflict',
                    DETAIL = json_build_object('thread_id', p_thread,
                        'operation_id', p_operation)::text;
            END IF;
            o_replayed := true;
            o_version := r_version;
            o_checkpoint := r_checkpoint;
            o_first_seq := r_first;
            o_event_count := r_count;
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
        IF cp_used THEN
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
    -- 5. the dispatch it settles: the checks settle() makes, before anything is written
    -- (a refusal rolls everything back either way; checked first, the successful path
    -- writes the dispatch and the thread row once each). The thread row is locked above:
    -- lock order thread, then its dispatch.
    IF p_settle_dispatch IS NOT NULL THEN
        SELECT * INTO d FROM @schema@.dispatches x
         WHERE x.dispatch_id = p_settle_dispatch AND x.thread_id = p_thread FOR UPDATE;
        IF NOT FOUND THEN
            SELECT * INTO d FROM @schema@.dispatches x WHERE x.dispatch_id = p_settle_dispatch;
            IF FOUND THEN
                RAISE EXCEPTION USING ERRCODE = 'WK004', MESSAGE = 'invalid commit',
                    DETAIL = json_build_object('thread_id', p_thread, 'problem',
                        format('it settles dispatch %L, which belongs to thread %L',
                               p_settle_dispatch, d.thread_id))::text;
            END IF;
            RAISE EXCEPTION USING ERRCODE = 'WK006', MESSAGE = 'not found',
                DETAIL = json_build_object('what', 'dispatch', 'ident', p_settle_dispatch)::text;
        END IF;
        IF d.status <> 'leased' OR d.token IS DISTINCT FROM p_token
           OR t.epoch IS DISTINCT FROM p_token THEN
            RAISE EXCEPTION USING ERRCODE = 'WK001', MESSAGE = 'stale claim',
                DETAIL = json_build_object('thread_id', p_thread, 'token', p_token,
                    'current', t.claim_token)::text;
        END IF;
    END IF;
    -- apply everything: the rarer parts first, one statement each, then the common ones
    IF p_cp_body IS NOT NULL AND t.write_count > 0 THEN
        DELETE FROM @schema@.writes WHERE thread_id = p_thread;
    END IF;
    IF n_writes > 0 THEN
        INSERT INTO @schema@.writes (thread_id, task_id, version, idx, body)
        SELECT p_thread, w.task, t.version + 1, w.o, w.body
          FROM unnest(p_write_tasks, p_write_bodies) WITH ORDINALITY AS w(task, body, o);
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
    IF t.version = 0 AND t.tenant IS NULL AND p_cp_body IS NOT NULL AND p_cp_tenant IS NOT NULL
    THEN
        -- tenant is only in an UPDATE's SET list when it changes (the owner trigger of 0005
        -- watches it)
        UPDATE @schema@.threads SET tenant = p_cp_tenant
         WHERE thread_id = p_thread AND claim_token = p_token;
    END IF;
    -- The checkpoint, the events, the receipt, the settled dispatch and the thread row, in
    -- one statement: a statement's fixed cost (its executor, the indexes it opens) is most of
    -- what each of them costs. Each part writes nothing when its input is absent. The thread
    -- row is updated once, ending the claim when the commit settles or releases, and no
    -- indexed column changes, so the update is HOT.
    WITH cp AS (
        -- with the segment columns (see 2 above)
        INSERT INTO @schema@.checkpoints (thread_id, version, checkpoint_id, at, body,
                                          run_id, status, graph, seg_first, ordinal)
        SELECT p_thread, t.version + 1, p_cp_id, n, p_cp_body,
               b.doc ->> 'run_id', b.doc ->> 'status',
               CASE WHEN json_typeof(b.doc -> 'metadata' -> 'graph') = 'string'
                    THEN b.doc -> 'metadata' ->> 'graph' END,
               CASE WHEN p.run_id = b.doc ->> 'run_id' THEN p.seg_first ELSE t.version + 1 END,
               coalesce(p.ordinal, 0) + 1
          FROM (SELECT replace(p_cp_body, '\u0000', '\u0001')::json AS doc) b
          LEFT JOIN LATERAL (
               SELECT x.run_id, x.seg_first, x.ordinal FROM @schema@.checkpoints x
                WHERE x.thread_id = p_thread ORDER BY x.version DESC LIMIT 1) p ON true
         WHERE p_cp_body IS NOT NULL
    ), ev AS (
        INSERT INTO @schema@.events (thread_id, seq, at, body)
        SELECT p_thread, t.next_seq + e.o - 1, n, e.body
          FROM unnest(p_events) WITH ORDINALITY AS e(body, o)
    ), rc AS (
        INSERT INTO @schema@.receipts (thread_id, operation_id, payload_hash, version,
                                       checkpoint_id, first_seq, event_count, at)
        SELECT p_thread, p_operation, p_hash, t.version + 1, resulting, t.next_seq, n_events, n
         WHERE p_operation IS NOT NULL
    ), st AS (
        -- what settle_locked() writes, checked above
        UPDATE @schema@.dispatches
           SET status = p_settle_status,
               token = CASE WHEN p_settle_status = 'pending' THEN NULL ELSE token END,
               holder = CASE WHEN p_settle_status = 'pending' THEN NULL ELSE holder END,
               lease_until = NULL, lease_expires = NULL,
               available_at = CASE WHEN p_settle_status = 'pending'
                                   THEN n + make_interval(secs => p_settle_delay)
                                   ELSE available_at END,
               last_error = CASE WHEN p_settle_status = 'pending' THEN p_settle_error
                                 ELSE last_error END,
               updated_at = n
         WHERE dispatch_id = p_settle_dispatch AND token = p_token
    )
    UPDATE @schema@.threads
       SET version = t.version + 1,
           status = CASE WHEN p_cp_body IS NOT NULL THEN p_cp_status ELSE t.status END,
           latest_checkpoint = resulting,
           write_count = CASE WHEN p_cp_body IS NOT NULL THEN 0 ELSE t.write_count END
                         + n_writes,
           next_seq = t.next_seq + n_events,
           message_count = t.message_count + n_messages,
           updated_at = n,
           claim_holder = CASE WHEN ending THEN NULL ELSE t.claim_holder END,
           claim_token = CASE WHEN ending THEN NULL ELSE t.claim_token END,
           claim_expires = CASE WHEN ending THEN NULL ELSE t.claim_expires END
     WHERE thread_id = p_thread AND claim_token = p_token;
    IF ending AND p_settle_dispatch IS NULL THEN
        -- what release() writes besides the claim: a lease granted with it no longer holds
        -- the thread
        UPDATE @schema@.dispatches SET lease_expires = '-infinity'
         WHERE thread_id = p_thread AND status = 'leased' AND token = p_token;
    END IF;
    o_replayed := false;
    o_version := t.version + 1;
    o_checkpoint := resulting;
    o_first_seq := t.next_seq;
    o_event_count := n_events;
END
$fn$;

-- ------------------------------------------------------------- commit_each

-- Version 6's commit_many(): each commit through commit() in a subtransaction of its own.
CREATE FUNCTION @schema@.commit_each(
    p_threads text[], p_tokens bigint[], p_operations text[], p_hashes text[],
    p_expected bigint[],
    p_cp_ids text[], p_cp_parents text[], p_cp_tenants text[], p_cp_statuses text[],
    p_cp_bodies text[],
    p_write_counts integer[], p_write_tasks text[], p_write_checkpoints text[],
    p_write_bodies text[],
    p_event_counts integer[], p_events text[],
    p_message_counts integer[], p_message_ids text[], p_message_bodies text[],
    p_outbox_counts integer[], p_outbox_ids text[], p_outbox_targets text[],
    p_outbox_correlations text[], p_outbox_payloads text[],
    p_consume_counts integer[], p_consume text[],
    p_releases boolean[], p_settle_dispatches text[], p_settle_statuses text[],
    p_settle_delays double precision[], p_settle_errors text[])
RETURNS TABLE (o_replayed boolean, o_version bigint, o_checkpoint text, o_first_seq bigint,
               o_event_count bigint, o_code text, o_detail text)
LANGUAGE plpgsql AS $fn$
DECLARE
    w integer := 0;
    e integer := 0;
    m integer := 0;
    x integer := 0;
    c integer := 0;
    nw integer;
    ne integer;
    nm integer;
    nx integer;
    nc integer;
BEGIN
    FOR i IN 1 .. coalesce(cardinality(p_threads), 0) LOOP
        nw := p_write_counts[i];
        ne := p_event_counts[i];
        nm := p_message_counts[i];
        nx := p_outbox_counts[i];
        nc := p_consume_counts[i];
        o_code := NULL;
        o_detail := NULL;
        BEGIN
            SELECT r.o_replayed, r.o_version, r.o_checkpoint, r.o_first_seq, r.o_event_count
              INTO o_replayed, o_version, o_checkpoint, o_first_seq, o_event_count
              FROM @schema@.commit(
                       p_threads[i], p_tokens[i], p_operations[i], p_hashes[i], p_expected[i],
                       p_cp_ids[i], p_cp_parents[i], p_cp_tenants[i], p_cp_statuses[i],
                       p_cp_bodies[i],
                       CASE WHEN nw > 0 THEN p_write_tasks[w + 1 : w + nw] END,
                       CASE WHEN nw > 0 THEN p_write_checkpoints[w + 1 : w + nw] END,
                       CASE WHEN nw > 0 THEN p_write_bodies[w + 1 : w + nw] END,
                       CASE WHEN ne > 0 THEN p_events[e + 1 : e + ne] END,
                       CASE WHEN nm > 0 THEN p_message_ids[m + 1 : m + nm] END,
                       CASE WHEN nm > 0 THEN p_message_bodies[m + 1 : m + nm] END,
                       CASE WHEN nx > 0 THEN p_outbox_ids[x + 1 : x + nx] END,
                       CASE WHEN nx > 0 THEN p_outbox_targets[x + 1 : x + nx] END,
                       CASE WHEN nx > 0 THEN p_outbox_correlations[x + 1 : x + nx] END,
                       CASE WHEN nx > 0 THEN p_outbox_payloads[x + 1 : x + nx] END,
                       CASE WHEN nc > 0 THEN p_consume[c + 1 : c + nc] END,
                       p_releases[i], p_settle_dispatches[i], p_settle_statuses[i],
                       p_settle_delays[i], p_settle_errors[i]) r;
        EXCEPTION WHEN OTHERS THEN
            GET STACKED DIAGNOSTICS o_code = RETURNED_SQLSTATE, o_detail = PG_EXCEPTION_DETAIL;
            IF o_code NOT LIKE 'WK%' THEN
                RAISE;  -- not a refusal: the whole call fails
            END IF;
            o_replayed := NULL;
            o_version := NULL;
            o_checkpoint := NULL;
            o_first_seq := NULL;
            o_event_count := NULL;
        END;
        RETURN NEXT;
        w := w + nw;
        e := e + ne;
        m := m + nm;
        x := x + nx;
        c := c + nc;
    END LOOP;
END
$fn$;

-- ------------------------------------------------------------- commit_many

-- The parameters and rows of version 6 (one row per commit, in order: o_code NULL and
-- commit()'s outputs, or the SQLSTATE and DETAIL of its refusal, nothing of it written).
CREATE OR REPLACE FUNCTION @schema@.commit_many(
    p_threads text[], p_tokens bigint[], p_operations text[], p_hashes text[],
    p_expected bigint[],
    p_cp_ids text[], p_cp_parents text[], p_cp_tenants text[], p_cp_statuses text[],
    p_cp_bodies text[],
    p_write_counts integer[], p_write_tasks text[], p_write_checkpoints text[],
    p_write_bodies text[],
    p_event_counts integer[], p_events text[],
    p_message_counts integer[], p_message_ids text[], p_message_bodies text[],
    p_outbox_counts integer[], p_outbox_ids text[], p_outbox_targets text[],
    p_outbox_correlations text[], p_outbox_payloads text[],
    p_consume_counts integer[], p_consume text[],
    p_releases boolean[], p_settle_dispatches text[], p_settle_statuses text[],
    p_settle_delays double precision[], p_settle_errors text[])
RETURNS TABLE (o_replayed boolean, o_version bigint, o_checkpoint text, o_first_seq bigint,
               o_event_count bigint, o_code text, o_detail text)
LANGUAGE plpgsql
-- One plan per session for its statements (planning the statement below costs more than
-- running it), made with index probes only: see j. (Also in effect for the commit() calls of
-- commit_each, whose statements are key lookups either way.)
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
AS $fn$
DECLARE
    n timestamptz := @schema@.store_now();
BEGIN
    IF coalesce(cardinality(p_threads), 0) = 0 THEN
        RETURN;
    END IF;
    -- A list parameter that is empty for every commit arrives as NULL.
    IF p_write_tasks IS NOT NULL OR p_message_ids IS NOT NULL OR p_outbox_ids IS NOT NULL
       OR p_consume IS NOT NULL
       OR cardinality(p_threads) > 1
          AND (SELECT count(DISTINCT x) FROM unnest(p_threads) x) < cardinality(p_threads)
    THEN
        RETURN QUERY SELECT * FROM @schema@.commit_each(
            p_threads, p_tokens, p_operations, p_hashes, p_expected,
            p_cp_ids, p_cp_parents, p_cp_tenants, p_cp_statuses, p_cp_bodies,
            p_write_counts, p_write_tasks, p_write_checkpoints, p_write_bodies,
            p_event_counts, p_events,
            p_message_counts, p_message_ids, p_message_bodies,
            p_outbox_counts, p_outbox_ids, p_outbox_targets, p_outbox_correlations,
            p_outbox_payloads,
            p_consume_counts, p_consume,
            p_releases, p_settle_dispatches, p_settle_statuses, p_settle_delays,
            p_settle_errors);
        RETURN;
    END IF;
    -- 1. every thread row, in thread id order (the one lock order of the schema: threads,
    -- then their dispatches; two batches never wait for each other in a cycle). Code point
    -- order (COLLATE "C"), the order the store sorts a batch in, which commit_each follows.
    PERFORM 1 FROM @schema@.threads WHERE thread_id = ANY (p_threads)
      ORDER BY thread_id COLLATE "C" FOR UPDATE;
    -- 2. each settled dispatch, only together with its own thread (a dispatch of another
    -- thread is refused below, unlocked, as commit() refuses it)
    IF array_remove(p_settle_dispatches, NULL) <> '{}' THEN
        -- (found by key: a thread may have any number of settled dispatches)
        PERFORM 1 FROM @schema@.dispatches x
         WHERE x.dispatch_id = ANY (p_settle_dispatches)
           AND (x.dispatch_id, x.thread_id) IN (
               SELECT s.dispatch, s.thread
                 FROM unnest(p_settle_dispatches, p_threads) s(dispatch, thread))
         ORDER BY x.dispatch_id FOR UPDATE OF x;
    END IF;
    -- 3. one statement: v judges each commit against its locked thread row with commit()'s
    -- checks, in commit()'s order (fencing; a receipt; the expected version and parent; the
    -- checkpoint id and tenant; the dispatch it settles); the CTEs after it write the
    -- commits that passed (go), each part writing nothing when its input is absent; the
    -- rows of v are the answer. Every sub-statement sees the rows as they were before the
    -- statement, so each commit's outputs are those commit() computes from its thread row.
    RETURN QUERY
    WITH c AS (
        SELECT u.*, p_cp_bodies[u.i] IS NOT NULL AS has_body,
               coalesce(p_event_counts[u.i], 0) AS ev_n,
               coalesce(sum(p_event_counts[u.i]) OVER (ORDER BY u.i), 0)
                   - coalesce(p_event_counts[u.i], 0) AS ev_off
          FROM unnest(p_threads, p_tokens, p_operations, p_hashes, p_expected, p_cp_ids,
                      p_cp_parents, p_cp_tenants, p_settle_dispatches, p_releases)
               WITH ORDINALITY AS u(thread, token, op, hash, expected, cp_id, parent, tenant,
                                    settle, release, i)
    ), j AS (
        -- each lookup a probe by key per commit (LATERAL ... LIMIT 1: never a hash join over
        -- a whole table, whatever the statistics of the session's first call said)
        SELECT c.*, t.found IS NOT NULL AS found, t.epoch, t.version, t.t_tenant, t.status,
               t.claim_token, t.latest_checkpoint, t.write_count, t.next_seq,
               r.r_hash, r.r_version, r.r_checkpoint, r.r_first, r.r_count,
               u.used IS NOT NULL AS cp_used,
               d.d_found IS NOT NULL AS d_found, d.d_thread, d.d_status, d.d_token
          FROM c
          LEFT JOIN LATERAL (
               SELECT true AS found, x.epoch, x.version, x.tenant AS t_tenant, x.status,
                      x.claim_token, x.latest_checkpoint, x.write_count, x.next_seq
                 FROM @schema@.threads x WHERE x.thread_id = c.thread LIMIT 1) t ON true
          LEFT JOIN LATERAL (
               SELECT x.payload_hash AS r_hash, x.version AS r_version,
                      x.checkpoint_id AS r_checkpoint, x.first_seq AS r_first,
                      x.event_count AS r_count
                 FROM @schema@.receipts x
                WHERE x.thread_id = c.thread AND x.operation_id = c.op LIMIT 1) r ON true
          LEFT JOIN LATERAL (
               SELECT true AS d_found, x.thread_id AS d_thread, x.status AS d_status,
                      x.token AS d_token
                 FROM @schema@.dispatches x WHERE x.dispatch_id = c.settle LIMIT 1) d ON true
          LEFT JOIN LATERAL (
               SELECT true AS used FROM @schema@.checkpoints x
                WHERE c.has_body AND x.thread_id = c.thread AND x.checkpoint_id = c.cp_id
                LIMIT 1) u ON true
    ), k AS (
        SELECT j.*,
               CASE
                   WHEN NOT j.found OR j.claim_token IS DISTINCT FROM j.token THEN
                       CASE WHEN j.found AND j.op IS NOT NULL AND j.epoch = j.token
                                 AND j.claim_token IS NULL AND j.r_hash = j.hash
                            THEN 'replay' ELSE 'stale' END
                   WHEN j.r_hash IS NOT NULL THEN
                       CASE WHEN j.r_hash <> j.hash THEN 'conflict' ELSE 'replay' END
                   WHEN j.expected IS NOT NULL AND j.expected <> j.version THEN 'version'
                   WHEN j.has_body AND j.parent IS DISTINCT FROM j.latest_checkpoint
                       THEN 'parent'
                   WHEN j.has_body AND j.cp_used THEN 'used'
                   WHEN j.has_body AND (j.version > 0 OR j.t_tenant IS NOT NULL)
                        AND j.tenant IS DISTINCT FROM j.t_tenant THEN 'tenant'
                   WHEN j.settle IS NOT NULL AND NOT j.d_found THEN 'no dispatch'
                   WHEN j.settle IS NOT NULL AND j.d_thread <> j.thread THEN 'other thread'
                   WHEN j.settle IS NOT NULL
                        AND (j.d_status <> 'leased' OR j.d_token IS DISTINCT FROM j.token
                             OR j.epoch IS DISTINCT FROM j.token) THEN 'stale'
                   ELSE 'go'
               END AS verdict,
               CASE WHEN j.has_body THEN j.cp_id ELSE j.latest_checkpoint END AS resulting
          FROM j
    ), v AS MATERIALIZED (
        SELECT k.*,
               k.settle IS NOT NULL OR coalesce(k.release, false) AS ending,
               k.has_body AND k.version = 0 AND k.t_tenant IS NULL AND k.tenant IS NOT NULL
                   AS binds_tenant
          FROM k
    ), cp AS (
        INSERT INTO @schema@.checkpoints (thread_id, version, checkpoint_id, at, body,
                                          run_id, status, graph, seg_first, ordinal)
        SELECT v.thread, v.version + 1, v.cp_id, n, p_cp_bodies[v.i],
               b.doc ->> 'run_id', b.doc ->> 'status',
               CASE WHEN json_typeof(b.doc -> 'metadata' -> 'graph') = 'string'
                    THEN b.doc -> 'metadata' ->> 'graph' END,
               -- what the trigger of 0008 computes (see there)
               CASE WHEN p.run_id = b.doc ->> 'run_id' THEN p.seg_first ELSE v.version + 1 END,
               coalesce(p.ordinal, 0) + 1
          FROM v
         CROSS JOIN LATERAL (
               SELECT replace(p_cp_bodies[v.i], '\u0000', '\u0001')::json AS doc) b
          LEFT JOIN LATERAL (
               SELECT x.run_id, x.seg_first, x.ordinal FROM @schema@.checkpoints x
                WHERE x.thread_id = v.thread ORDER BY x.version DESC LIMIT 1) p ON true
         WHERE v.verdict = 'go' AND v.has_body
    ), wd AS (
        -- a checkpoint supersedes the thread's pending writes
        DELETE FROM @schema@.writes x USING v
         WHERE v.verdict = 'go' AND v.has_body AND v.write_count > 0
           AND x.thread_id = v.thread
    ), ev AS (
        INSERT INTO @schema@.events (thread_id, seq, at, body)
        SELECT v.thread, v.next_seq + e.o - v.ev_off - 1, n, e.body
          FROM unnest(p_events) WITH ORDINALITY AS e(body, o)
          JOIN v ON e.o > v.ev_off AND e.o <= v.ev_off + v.ev_n
         WHERE v.verdict = 'go'
    ), rc AS (
        INSERT INTO @schema@.receipts (thread_id, operation_id, payload_hash, version,
                                       checkpoint_id, first_seq, event_count, at)
        SELECT v.thread, v.op, v.hash, v.version + 1, v.resulting, v.next_seq, v.ev_n, n
          FROM v
         WHERE v.verdict = 'go' AND v.op IS NOT NULL
    ), st AS (
        -- what settle_locked() writes, fenced by the token as in commit()
        UPDATE @schema@.dispatches x
           SET status = p_settle_statuses[v.i],
               token = CASE WHEN p_settle_statuses[v.i] = 'pending' THEN NULL ELSE x.token END,
               holder = CASE WHEN p_settle_statuses[v.i] = 'pending' THEN NULL
                             ELSE x.holder END,
               lease_until = NULL, lease_expires = NULL,
               available_at = CASE WHEN p_settle_statuses[v.i] = 'pending'
                                   THEN n + make_interval(secs => p_settle_delays[v.i])
                                   ELSE x.available_at END,
               last_error = CASE WHEN p_settle_statuses[v.i] = 'pending'
                                 THEN p_settle_errors[v.i] ELSE x.last_error END,
               updated_at = n
          FROM v
         WHERE v.verdict = 'go' AND x.dispatch_id = v.settle AND x.token = v.token
    ), rl AS (
        -- what release() writes besides the claim (a commit that releases, settling nothing):
        -- found from each such commit's thread (LATERAL, kept apart by OFFSET 0: never a
        -- scan of every leased dispatch), and not even that unless the call has a release
        UPDATE @schema@.dispatches x SET lease_expires = '-infinity'
          FROM v
         CROSS JOIN LATERAL (
               SELECT y.dispatch_id FROM @schema@.dispatches y
                WHERE y.thread_id = v.thread AND y.token = v.token
                  AND y.status || '' = 'leased'  -- no status index can serve this: by thread
               OFFSET 0) l
         WHERE true = ANY (p_releases)
           AND v.verdict = 'go' AND v.ending AND v.settle IS NULL
           AND x.dispatch_id = l.dispatch_id
    ), th AS (
        -- fenced by the token; no indexed column changes (tenant only when it is bound
        -- here, as in commit()), so the update is HOT
        UPDATE @schema@.threads x
           SET version = v.version + 1,
               tenant = CASE WHEN v.binds_tenant THEN v.tenant ELSE x.tenant END,
               status = CASE WHEN v.has_body THEN p_cp_statuses[v.i] ELSE x.status END,
               latest_checkpoint = v.resulting,
               write_count = CASE WHEN v.has_body THEN 0 ELSE x.write_count END,
               next_seq = v.next_seq + v.ev_n,
               updated_at = n,
               claim_holder = CASE WHEN v.ending THEN NULL ELSE x.claim_holder END,
               claim_token = CASE WHEN v.ending THEN NULL ELSE x.claim_token END,
               claim_expires = CASE WHEN v.ending THEN NULL ELSE x.claim_expires END
          FROM v
         WHERE v.verdict = 'go' AND x.thread_id = v.thread AND x.claim_token = v.token
    )
    SELECT CASE v.verdict WHEN 'go' THEN false WHEN 'replay' THEN true END,
           CASE v.verdict WHEN 'go' THEN v.version + 1 WHEN 'replay' THEN v.r_version END,
           CASE v.verdict WHEN 'go' THEN v.resulting WHEN 'replay' THEN v.r_checkpoint END,
           CASE v.verdict WHEN 'go' THEN v.next_seq WHEN 'replay' THEN v.r_first END,
           CASE v.verdict WHEN 'go' THEN v.ev_n::bigint WHEN 'replay' THEN v.r_count END,
           CASE v.verdict
               WHEN 'stale' THEN 'WK001' WHEN 'conflict' THEN 'WK002'
               WHEN 'version' THEN 'WK003' WHEN 'parent' THEN 'WK003'
               WHEN 'used' THEN 'WK004' WHEN 'other thread' THEN 'WK004'
               WHEN 'tenant' THEN 'WK005' WHEN 'no dispatch' THEN 'WK006'
           END,
           CASE v.verdict
               WHEN 'stale' THEN json_build_object('thread_id', v.thread, 'token', v.token,
                   'current', v.claim_token)::text
               WHEN 'conflict' THEN json_build_object('thread_id', v.thread,
                   'operation_id', v.op)::text
               WHEN 'version' THEN json_build_object('thread_id', v.thread,
                   'expected', v.expected, 'actual', v.version, 'what', 'version')::text
               WHEN 'parent' THEN json_build_object('thread_id', v.thread,
                   'expected', v.parent, 'actual', v.latest_checkpoint,
                   'what', 'parent checkpoint')::text
               WHEN 'used' THEN json_build_object('thread_id', v.thread, 'problem',
                   format('checkpoint id %L was used before', v.cp_id))::text
               WHEN 'other thread' THEN json_build_object('thread_id', v.thread, 'problem',
                   format('it settles dispatch %L, which belongs to thread %L',
                          v.settle, v.d_thread))::text
               WHEN 'tenant' THEN json_build_object('thread_id', v.thread)::text
               WHEN 'no dispatch' THEN json_build_object('what', 'dispatch',
                   'ident', v.settle)::text
           END
      FROM v
     ORDER BY v.i;
END
$fn$;
