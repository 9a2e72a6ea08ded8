-- wakeful PostgreSQL schema, version 24: the queue, the outbox and the stream checkpoints
-- keyed by thread id (issue 41 item 4, decision 0045 "Amendment: the three tables re-keyed").
--
-- Every table's primary key now includes thread_id (docs/sharding.md), so that the schema
-- can be distributed by it (Citus tables colocated on thread_id):
--   dispatches          (dispatch_id)  -> (dispatch_id, thread_id). The id first: a key
--                       led by thread_id would be a second index over each thread's range
--                       beside dispatches_by_thread_status, and one the planner takes for a
--                       thread's claim (a walk of all its settled dispatches too: measured
--                       in tests/test_postgres_plans.py); led by the id it is one probe for
--                       a dispatch named with its thread and, on a distributed table, the
--                       index of a lookup by id alone. The dispatch id stays unique on its
--                       own (dispatches_id): the contract refuses one id on two threads
--                       (DispatchConflict) and settle/get/quarantine/requeue/purge name the
--                       dispatch alone. It and dispatches_dedupe are the schema's two
--                       fleet-wide unique keys, listed in wakeful.store.postgres.sharding.
--                       FLEET_UNIQUE_KEYS with what distributing the table without them
--                       loses. seq is no longer a unique constraint (a sequence numbers it;
--                       nothing relied on the constraint): a plain index on it keeps the
--                       unfiltered page in enqueue order.
--   outbox              (stage_seq)    -> (thread_id, stage_seq); the column source_thread
--                       is renamed thread_id (the thread whose commit staged the entry, the
--                       shard it is written on); the relay's drain order keeps an index on
--                       stage_seq; outbox_by_source goes (the key's prefix serves it).
--   stream_checkpoints  (run_id)       -> (thread_id, run_id); a run belongs to one thread
--                       (run ids are made unique per run), so no unique key on run_id
--                       alone: get/delete/discard by run read stream_checkpoints_by_run;
--                       stream_checkpoints_by_thread goes (the key's prefix serves it).
-- The new keys are built before the old ones are dropped, so the table is never without
-- an index on what the functions look up.
--
-- Function bodies of earlier versions changed here, and only in these ways:
--   commit (version 9): the outbox INSERT names thread_id; the settle UPDATE names the
--       dispatch by (dispatch_id, thread_id);
--   delete_thread (version 13): outbox rows by thread_id;
--   relay_one (version 14): inbox.source_thread from outbox.thread_id; the message
--       dispatch's existence and the outbox DELETE by their keys (thread, id);
--   put_stream_checkpoint (version 1): ON CONFLICT (thread_id, run_id), the row's thread
--       no longer rewritten (it is part of the key).
--   commit_many (version 12): the settle and release UPDATEs name the dispatch by
--       (dispatch_id, thread_id) (the lock and the check of a settled dispatch still probe
--       by id alone: one probe that also finds a dispatch of another thread, to refuse it);
--   claim_next_read (5 arguments, version 23): the grants' UPDATEs name the dispatch by
--       (dispatch_id, thread_id).
-- Every other function that names a dispatch by id alone (settle, quarantine, requeue,
-- purge, the enqueues' conflict checks, promote_due, the triggers) reads dispatches_id as it
-- read dispatches_pkey before, unchanged.

-- ------------------------------------------------------------- dispatches

CREATE UNIQUE INDEX dispatches_id ON @schema@.dispatches (dispatch_id);
CREATE UNIQUE INDEX dispatches_thread_key ON @schema@.dispatches (dispatch_id, thread_id);
ALTER TABLE @schema@.dispatches DROP CONSTRAINT dispatches_pkey;
ALTER TABLE @schema@.dispatches
    ADD CONSTRAINT dispatches_pkey PRIMARY KEY USING INDEX dispatches_thread_key;
CREATE INDEX dispatches_by_seq ON @schema@.dispatches (seq);
ALTER TABLE @schema@.dispatches DROP CONSTRAINT dispatches_seq_key;

-- ------------------------------------------------------------- outbox

ALTER TABLE @schema@.outbox RENAME COLUMN source_thread TO thread_id;
CREATE UNIQUE INDEX outbox_thread_key ON @schema@.outbox (thread_id, stage_seq);
CREATE INDEX outbox_by_stage ON @schema@.outbox (stage_seq);
ALTER TABLE @schema@.outbox DROP CONSTRAINT outbox_pkey;
ALTER TABLE @schema@.outbox ADD CONSTRAINT outbox_pkey PRIMARY KEY USING INDEX outbox_thread_key;
DROP INDEX @schema@.outbox_by_source;

-- ------------------------------------------------------------- stream_checkpoints

CREATE UNIQUE INDEX stream_checkpoints_thread_key
    ON @schema@.stream_checkpoints (thread_id, run_id);
CREATE INDEX stream_checkpoints_by_run ON @schema@.stream_checkpoints (run_id);
ALTER TABLE @schema@.stream_checkpoints DROP CONSTRAINT stream_checkpoints_pkey;
ALTER TABLE @schema@.stream_checkpoints
    ADD CONSTRAINT stream_checkpoints_pkey PRIMARY KEY USING INDEX stream_checkpoints_thread_key;
DROP INDEX @schema@.stream_checkpoints_by_thread;

-- ------------------------------------------------------------- commit

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
               (thread_id, target_thread, message_id, correlation_id, payload, at)
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
         WHERE thread_id = p_thread AND dispatch_id = p_settle_dispatch AND token = p_token
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

-- ------------------------------------------------------------- delete_thread

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
       AND NOT EXISTS (SELECT 1 FROM @schema@.outbox WHERE thread_id = p_thread) THEN
        RETURN false;
    END IF;
    DELETE FROM @schema@.checkpoints WHERE thread_id = p_thread;
    DELETE FROM @schema@.writes WHERE thread_id = p_thread;
    DELETE FROM @schema@.events WHERE thread_id = p_thread;
    DELETE FROM @schema@.messages WHERE thread_id = p_thread;
    DELETE FROM @schema@.branches WHERE thread_id = p_thread;
    DELETE FROM @schema@.receipts WHERE thread_id = p_thread;
    DELETE FROM @schema@.inbox WHERE thread_id = p_thread;
    DELETE FROM @schema@.outbox WHERE thread_id = p_thread;
    DELETE FROM @schema@.stream_checkpoints WHERE thread_id = p_thread;
    UPDATE @schema@.dispatches SET lease_expires = '-infinity'
     WHERE thread_id = p_thread AND status = 'leased';
    -- Keep the row for its epoch: the next token stays above every token issued before.
    UPDATE @schema@.threads
       SET epoch = t.epoch + 1, present = false, version = 0, tenant = NULL, status = NULL,
           claim_holder = NULL, claim_token = NULL, claim_expires = NULL,
           latest_checkpoint = NULL, write_count = 0, event_floor = 1, next_seq = 1,
           message_count = 0, inbox_revision = 0, updated_at = NULL, branch = 0,
           message_offset = 0
     WHERE thread_id = p_thread;
    RETURN true;
END
$fn$;

-- ------------------------------------------------------------- relay_one

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
                o.thread_id, o.payload, n);
        UPDATE @schema@.threads SET inbox_revision = t.inbox_revision + 1, present = true
         WHERE thread_id = o.target_thread;
    END IF;
    -- the same id as wakeful.store.projected.message_dispatch_id computes
    did := 'msg-' || left(encode(sha256(convert_to(o.target_thread, 'UTF8') || '\x00'::bytea
                                         || convert_to(o.message_id, 'UTF8')), 'hex'), 40);
    IF NOT EXISTS (SELECT 1 FROM @schema@.dispatches
                    WHERE thread_id = o.target_thread AND dispatch_id = did) THEN
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
    DELETE FROM @schema@.outbox WHERE thread_id = o.thread_id AND stage_seq = o.stage_seq;
    RETURN true;
END
$fn$;

-- ------------------------------------------------------------- put_stream_checkpoint

CREATE OR REPLACE FUNCTION @schema@.put_stream_checkpoint(p_run text, p_thread text, p_token bigint,
                                               p_body text, p_updated_at timestamptz)
RETURNS boolean
LANGUAGE plpgsql AS $fn$
BEGIN
    PERFORM 1 FROM @schema@.threads
      WHERE thread_id = p_thread AND claim_token = p_token FOR SHARE;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    INSERT INTO @schema@.stream_checkpoints (run_id, thread_id, body, updated_at)
    VALUES (p_run, p_thread, p_body, coalesce(p_updated_at, @schema@.store_now()))
    ON CONFLICT (thread_id, run_id) DO UPDATE
       SET body = excluded.body, updated_at = excluded.updated_at;
    RETURN true;
END
$fn$;

-- ------------------------------------------------------------- commit_many

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
    whole boolean;  -- a release, or a thread with pending writes: the statement with rl, wd
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
    SELECT coalesce(bool_or(s.has_writes), false) OR coalesce(true = ANY (p_releases), false)
      INTO whole
      FROM (SELECT x.write_count > 0 AS has_writes FROM @schema@.threads x
             WHERE x.thread_id = ANY (p_threads)
             ORDER BY x.thread_id COLLATE "C" FOR UPDATE) s;
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
    IF whole THEN
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
             WHERE v.verdict = 'go' AND x.thread_id = v.thread AND x.dispatch_id = v.settle
               AND x.token = v.token
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
               AND x.thread_id = v.thread AND x.dispatch_id = l.dispatch_id
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
    ELSE
        -- the same statement without wd and rl, which write nothing here (see 3)
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
             WHERE v.verdict = 'go' AND x.thread_id = v.thread AND x.dispatch_id = v.settle
               AND x.token = v.token
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
    END IF;
END
$fn$;

-- ------------------------------------------------------------- claim_next_read

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
             WHERE x.thread_id = g.thread_id AND x.dispatch_id = g.dispatch_id
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
         WHERE x.thread_id = cand.thread_id AND x.dispatch_id = cand.dispatch_id
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
