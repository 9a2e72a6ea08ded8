-- wakeful PostgreSQL schema, version 24: the queue, the outbox and the stream checkpoints
-- keyed by thread id (issue 41 item 4, decision 0045 "Amendment: the three tables re-keyed").
--
-- Every table's primary key now includes thread_id (docs/sharding.md), so that the schema
-- can be distributed by it (Citus tables colocated on thread_id):
--   dispatches          (dispatch_id)  -> (thread_id, dispatch_id). The dispatch id stays
--                       unique on its own (dispatches_id, the old key's index under a new
--                       name): the contract refuses one id on two threads (DispatchConflict)
--                       and settle/get/quarantine/requeue/purge name the dispatch alone. It
--                       and dispatches_dedupe are the schema's two fleet-wide unique keys,
--                       listed in wakeful.store.postgres.sharding.FLEET_UNIQUE_KEYS with what
--                       distributing the table without them loses. seq is no longer a unique
--                       constraint (a sequence numbers it; nothing relied on the constraint):
--                       a plain index on it keeps the unfiltered page in enqueue order.
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
--       dispatch by (thread_id, dispatch_id);
--   delete_thread (version 13): outbox rows by thread_id;
--   relay_one (version 14): inbox.source_thread from outbox.thread_id; the message
--       dispatch's existence and the outbox DELETE by their keys (thread, id);
--   put_stream_checkpoint (version 1): ON CONFLICT (thread_id, run_id), the row's thread
--       no longer rewritten (it is part of the key).
-- Every other function that names a dispatch by id alone (settle, quarantine, requeue,
-- purge, the enqueues' conflict checks, the claim's grants, commit_many's settles) reads
-- dispatches_id as it read dispatches_pkey before, unchanged.

-- ------------------------------------------------------------- dispatches

CREATE UNIQUE INDEX dispatches_id ON @schema@.dispatches (dispatch_id);
CREATE UNIQUE INDEX dispatches_thread_key ON @schema@.dispatches (thread_id, dispatch_id);
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
