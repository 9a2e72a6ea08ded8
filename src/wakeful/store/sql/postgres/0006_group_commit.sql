-- wakeful PostgreSQL store, schema version 6: less server work per dispatch (issue 22).
--
-- Applied after 0005, under the same rules (one transaction, advisory lock, @schema@ and
-- @channel@ placeholders). Every function keeps its signature, so a process of the previous
-- version that is still running keeps working against this schema.
--
-- 1. threads.listed (stored, generated: present AND version > 0) is what the listing
--    indexes filter on. Their predicate used version itself, which every commit changes,
--    so no update of a thread row could be HOT: every claim and commit wrote an entry in
--    each of the table's four indexes. Now only the row is rewritten, on its own page
--    (fillfactor 70), unless a thread gets its first commit, is deleted or gets a tenant.
-- 2. dispatches: dispatches_open_by_thread is dropped (dispatches_by_thread_status serves
--    every lookup of a thread's open work), and the dedupe key is unique through a partial
--    index over the rows that have one. A status change rewrites every index entry of the
--    row whose predicate holds; these two had one for every row.
-- 3. commit() checks the dispatch it settles before it writes anything and then writes the
--    thread row once (with the claim ended) and the dispatch once, instead of the thread row
--    twice through settle_locked(); the same checks, in the same order, with the same
--    errors. claim_next() and commit() only put tenant in an UPDATE's SET list when they
--    change it (the trigger of 0005 watches that column).
-- 4. commit_many(): several commits, each with its own fencing check and outcome, in one
--    transaction: the store's group commit (postgres/group.py). Each runs commit() in a
--    block of its own (a subtransaction), so a refused one rolls back alone and is reported
--    in its row (SQLSTATE and DETAIL, as commit() raised them) while the others commit.
--    Any other error fails the whole call (the transaction rolls back; the store retries a
--    transient one).

-- ------------------------------------------------------------------- threads

DROP INDEX @schema@.threads_listed;
DROP INDEX @schema@.threads_listed_by_tenant;
ALTER TABLE @schema@.threads
    ADD COLUMN listed boolean GENERATED ALWAYS AS (present AND version > 0) STORED;
CREATE INDEX threads_listed ON @schema@.threads (thread_id) WHERE listed;
CREATE INDEX threads_listed_by_tenant ON @schema@.threads (tenant, thread_id) WHERE listed;

-- As in version 5, filtering on listed (the indexes' predicate).
CREATE OR REPLACE FUNCTION @schema@.list_threads(p_tenant text, p_after text, p_limit integer)
RETURNS SETOF @schema@.threads
LANGUAGE plpgsql STABLE
SET enable_seqscan = off
SET enable_bitmapscan = off
SET enable_sort = off
AS $fn$
BEGIN
    RETURN QUERY EXECUTE
        'SELECT * FROM @schema@.threads WHERE listed'
        || CASE WHEN p_tenant IS NULL THEN '' ELSE ' AND tenant = ANY (ARRAY[$1])' END
        || CASE WHEN p_after IS NULL THEN '' ELSE ' AND thread_id > $2' END
        || CASE WHEN p_tenant IS NULL THEN ' ORDER BY thread_id'
                ELSE ' ORDER BY tenant, thread_id' END
        || ' LIMIT $3'
        USING p_tenant, p_after, p_limit;
END
$fn$;

-- ----------------------------------------------------------------- dispatches

DROP INDEX @schema@.dispatches_open_by_thread;
ALTER TABLE @schema@.dispatches DROP CONSTRAINT dispatches_dedupe_key_key;
CREATE UNIQUE INDEX dispatches_dedupe ON @schema@.dispatches (dedupe_key)
    WHERE dedupe_key IS NOT NULL;

-- -------------------------------------------------------------------- commit

-- As in version 4, with the settle checked before the writes and written in place (see 3).
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
        INSERT INTO @schema@.checkpoints (thread_id, version, checkpoint_id, at, body)
        SELECT p_thread, t.version + 1, p_cp_id, n, p_cp_body WHERE p_cp_body IS NOT NULL
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

-- ------------------------------------------------------------- commit_many

-- Item i of every array is commit i's parameter of commit(). The list parameters of commit()
-- come flattened, all commits' items one after the other, with each commit's item count in
-- the *_counts arrays (writes: tasks, checkpoints and bodies; messages: ids and bodies;
-- outbox: ids, targets, correlations and payloads). One row per commit, in order: o_code is
-- NULL and the o_ columns are commit()'s outputs, or o_code and o_detail are the SQLSTATE and
-- DETAIL of its refusal (nothing of that commit was written).
CREATE FUNCTION @schema@.commit_many(
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

-- ---------------------------------------------------------------- claim_next

-- As in version 5, with tenant in the SET list only when the lease fixes it.
CREATE OR REPLACE FUNCTION @schema@.claim_next(p_holder text, p_ttl double precision, p_limit integer)
RETURNS SETOF @schema@.dispatches
LANGUAGE plpgsql
SET enable_seqscan = off
SET enable_bitmapscan = off
AS $fn$
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
    -- "Does the thread have a live claim" is a scalar subquery, not NOT EXISTS: PostgreSQL
    -- turns NOT EXISTS into an anti join, which with statistics became a sequential scan of
    -- every thread per claim; a scalar subquery stays a per-candidate key lookup.
    OPEN due FOR
        SELECT * FROM @schema@.dispatches x
         WHERE x.status = 'pending' AND x.available_at <= n
           AND NOT coalesce((SELECT y.claim_token IS NOT NULL AND y.claim_expires >= n
                               FROM @schema@.threads y WHERE y.thread_id = x.thread_id), false)
         ORDER BY x.priority DESC, x.seq
           FOR UPDATE OF x SKIP LOCKED;
    OPEN lapsed FOR
        SELECT * FROM @schema@.dispatches x
         WHERE x.status = 'leased' AND x.lease_expires < n
           AND NOT coalesce((SELECT y.claim_token IS NOT NULL AND y.claim_expires >= n
                               FROM @schema@.threads y WHERE y.thread_id = x.thread_id), false)
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
        -- tenant only in the SET list when the lease fixes it (see commit())
        IF t.version = 0 AND t.tenant IS NULL AND d.tenant IS NOT NULL THEN
            UPDATE @schema@.threads SET tenant = d.tenant WHERE thread_id = d.thread_id;
        END IF;
        -- the claim and the lease in one statement
        WITH granted AS (
            UPDATE @schema@.threads
               SET present = true, epoch = t.epoch + 1, claim_holder = p_holder,
                   claim_token = t.epoch + 1, claim_expires = expires
             WHERE thread_id = d.thread_id
        )
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
