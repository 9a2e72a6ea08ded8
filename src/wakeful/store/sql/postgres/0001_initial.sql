-- wakeful PostgreSQL store, schema version 1.
--
-- Applied by wakeful.store.postgres.migrations inside one transaction that holds a
-- pg_advisory_xact_lock, after these placeholders are replaced:
--   @schema@   the schema, quoted with psycopg.sql.Identifier
--   @channel@  the LISTEN/NOTIFY channel of this schema, quoted with psycopg.sql.Literal
--
-- Every write of the store is one call of one function below: one round trip, one
-- transaction, every check inside it under row locks. A refusal raises an exception with a
-- wakeful SQLSTATE (class WK) and a JSON DETAIL; the transaction then rolls back, so a refused
-- write changes nothing. Python maps the codes to wakeful errors (postgres/translate.py).
--
-- Time: every function reads the store's clock once, from @schema@.store_now(), which is the
-- server's now(): the start of the transaction. A transaction that waited for a lock therefore
-- judges expiry slightly in the past, which only ever makes a claim look live for longer
-- (never takes over early) and makes a renewed expiry a little shorter.
--
-- Stored JSON is kept as text, exactly as msgspec encoded it, so values round-trip byte for
-- byte (key order, numbers); cast a column to jsonb to query it.

CREATE FUNCTION @schema@.store_now() RETURNS timestamptz
    LANGUAGE sql STABLE PARALLEL SAFE
    AS $$ SELECT now() $$;

-- ------------------------------------------------------------------------- threads

-- One row per thread ever touched. The row outlives delete_thread (present = false) so that
-- epoch, the highest token issued, stays monotonic; it is also the lock every write to the
-- thread takes first.
CREATE TABLE @schema@.threads (
    thread_id         text PRIMARY KEY,
    epoch             bigint NOT NULL DEFAULT 0,
    present           boolean NOT NULL DEFAULT false,
    version           bigint NOT NULL DEFAULT 0,
    tenant            text,
    status            text,
    claim_holder      text,
    claim_token       bigint,
    claim_expires     timestamptz,
    latest_checkpoint text,
    write_count       bigint NOT NULL DEFAULT 0,
    event_floor       bigint NOT NULL DEFAULT 1,
    next_seq          bigint NOT NULL DEFAULT 1,
    message_count     bigint NOT NULL DEFAULT 0,
    inbox_revision    bigint NOT NULL DEFAULT 0,
    updated_at        timestamptz
) WITH (fillfactor = 70);  -- room for HOT updates: claims and commits rewrite the row

CREATE INDEX threads_by_tenant ON @schema@.threads (tenant, thread_id);

CREATE TABLE @schema@.checkpoints (
    thread_id     text NOT NULL,
    version       bigint NOT NULL,  -- the thread version that committed it: history order
    checkpoint_id text NOT NULL,
    at            timestamptz NOT NULL,
    body          text NOT NULL,
    PRIMARY KEY (thread_id, version),
    UNIQUE (thread_id, checkpoint_id)
);

CREATE TABLE @schema@.writes (
    thread_id text NOT NULL,
    task_id   text NOT NULL,
    version   bigint NOT NULL,
    idx       bigint NOT NULL,
    body      text NOT NULL,
    PRIMARY KEY (thread_id, task_id)
);

CREATE TABLE @schema@.events (
    thread_id text NOT NULL,
    seq       bigint NOT NULL,
    at        timestamptz NOT NULL,
    body      text NOT NULL,  -- the EventDraft; seq and at are the columns
    PRIMARY KEY (thread_id, seq)
);

CREATE TABLE @schema@.messages (
    thread_id  text NOT NULL,
    pos        bigint NOT NULL,
    message_id text NOT NULL,
    body       text NOT NULL,
    PRIMARY KEY (thread_id, pos),
    UNIQUE (thread_id, message_id)
);

CREATE TABLE @schema@.receipts (
    thread_id     text NOT NULL,
    operation_id  text NOT NULL,
    payload_hash  text NOT NULL,
    version       bigint NOT NULL,
    checkpoint_id text,
    first_seq     bigint NOT NULL,
    event_count   bigint NOT NULL,
    at            timestamptz NOT NULL,
    PRIMARY KEY (thread_id, operation_id)
);

-- Delivered messages. A consumed entry stays (consumed = true) so that a late relay of the
-- same message_id is a no-op; delete_thread removes them with the thread.
CREATE TABLE @schema@.inbox (
    thread_id      text NOT NULL,
    message_id     text NOT NULL,
    revision       bigint NOT NULL,
    correlation_id text,
    source_thread  text,
    payload        text NOT NULL,
    at             timestamptz NOT NULL,
    consumed       boolean NOT NULL DEFAULT false,
    PRIMARY KEY (thread_id, message_id)
);

CREATE TABLE @schema@.outbox (
    stage_seq      bigserial PRIMARY KEY,
    source_thread  text NOT NULL,
    target_thread  text NOT NULL,
    message_id     text NOT NULL,
    correlation_id text,
    payload        text NOT NULL,
    at             timestamptz NOT NULL
);

CREATE INDEX outbox_by_source ON @schema@.outbox (source_thread);

CREATE TABLE @schema@.stream_checkpoints (
    run_id     text PRIMARY KEY,
    thread_id  text NOT NULL,
    body       text NOT NULL,
    updated_at timestamptz NOT NULL
);

CREATE INDEX stream_checkpoints_by_thread ON @schema@.stream_checkpoints (thread_id);

-- --------------------------------------------------------------------------- queue

CREATE TABLE @schema@.dispatches (
    dispatch_id  text PRIMARY KEY,
    seq          bigserial NOT NULL UNIQUE,  -- enqueue order
    thread_id    text NOT NULL,
    kind         text NOT NULL CHECK (kind IN ('start', 'resume', 'cancel', 'message')),
    payload      text NOT NULL,
    priority     integer NOT NULL,
    available_at timestamptz NOT NULL,
    max_attempts bigint NOT NULL,
    dedupe_key   text UNIQUE,
    status       text NOT NULL
                 CHECK (status IN ('pending', 'leased', 'awaiting', 'done', 'quarantined')),
    attempts     bigint NOT NULL DEFAULT 0,
    token        bigint,
    holder       text,
    lease_until  timestamptz,
    -- Internal: when this lease stops holding its thread. The claim's expiry while the
    -- lease's claim is current, -infinity once that claim is released or the thread deleted,
    -- so that leases whose claim lapsed are found through an index instead of a scan of
    -- every live lease.
    lease_expires timestamptz,
    last_error   text,
    created_at   timestamptz NOT NULL,
    updated_at   timestamptz NOT NULL
);

CREATE INDEX dispatches_pending ON @schema@.dispatches (priority DESC, seq)
    WHERE status = 'pending';
CREATE INDEX dispatches_lapsing ON @schema@.dispatches (lease_expires)
    WHERE status = 'leased';
CREATE INDEX dispatches_open_by_thread ON @schema@.dispatches (thread_id)
    WHERE status IN ('pending', 'leased', 'awaiting');
CREATE INDEX dispatches_by_thread ON @schema@.dispatches (thread_id, seq);
CREATE INDEX dispatches_by_status ON @schema@.dispatches (status, seq);
CREATE INDEX dispatches_settled ON @schema@.dispatches (updated_at) WHERE status = 'done';

CREATE TABLE @schema@.workers (
    worker_id      text PRIMARY KEY,
    incarnation_id text NOT NULL,
    generation     bigint NOT NULL,
    registered_at  timestamptz NOT NULL,
    last_heartbeat timestamptz NOT NULL
);

-- ------------------------------------------------------------------- claims

CREATE FUNCTION @schema@.claim(p_thread text, p_holder text, p_ttl double precision,
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
    IF t.claim_token IS NOT NULL AND n <= t.claim_expires THEN
        RAISE EXCEPTION USING ERRCODE = 'WK010', MESSAGE = 'thread busy',
            DETAIL = json_build_object('thread_id', p_thread, 'holder', t.claim_holder,
                'checkpoint_id', t.latest_checkpoint, 'expires_at', t.claim_expires)::text;
    END IF;
    o_token := t.epoch + 1;
    o_expires := n + make_interval(secs => p_ttl);
    UPDATE @schema@.threads
       SET present = true, epoch = o_token, claim_holder = p_holder, claim_token = o_token,
           claim_expires = o_expires
     WHERE thread_id = p_thread;
END
$fn$;

CREATE FUNCTION @schema@.renew(p_thread text, p_token bigint, p_ttl double precision,
                               OUT o_holder text, OUT o_expires timestamptz)
LANGUAGE plpgsql AS $fn$
DECLARE
    t @schema@.threads%ROWTYPE;
    n timestamptz := @schema@.store_now();
BEGIN
    SELECT * INTO t FROM @schema@.threads WHERE thread_id = p_thread FOR UPDATE;
    IF NOT FOUND OR t.claim_token IS DISTINCT FROM p_token THEN
        RAISE EXCEPTION USING ERRCODE = 'WK001', MESSAGE = 'stale claim',
            DETAIL = json_build_object('thread_id', p_thread, 'token', p_token,
                'current', t.claim_token)::text;
    END IF;
    o_holder := t.claim_holder;
    o_expires := n + make_interval(secs => p_ttl);
    UPDATE @schema@.threads SET claim_expires = o_expires
     WHERE thread_id = p_thread AND claim_token = p_token;
    -- The lease of the dispatch granted with this claim follows the claim.
    UPDATE @schema@.dispatches SET lease_until = o_expires, lease_expires = o_expires
     WHERE thread_id = p_thread AND status = 'leased' AND token = p_token;
END
$fn$;

CREATE FUNCTION @schema@.release(p_thread text, p_token bigint) RETURNS void
LANGUAGE plpgsql AS $fn$
BEGIN
    UPDATE @schema@.threads SET claim_holder = NULL, claim_token = NULL, claim_expires = NULL
     WHERE thread_id = p_thread AND claim_token = p_token;
    IF FOUND THEN
        -- a lease granted with this claim no longer holds the thread
        UPDATE @schema@.dispatches SET lease_expires = '-infinity'
         WHERE thread_id = p_thread AND status = 'leased' AND token = p_token;
    END IF;
END
$fn$;

-- ------------------------------------------------------------------- commit

CREATE FUNCTION @schema@.commit(
    p_thread text, p_token bigint, p_operation text, p_hash text, p_expected bigint,
    p_cp_id text, p_cp_parent text, p_cp_tenant text, p_cp_status text, p_cp_body text,
    p_write_tasks text[], p_write_checkpoints text[], p_write_bodies text[],
    p_events text[],
    p_message_ids text[], p_message_bodies text[],
    p_outbox_ids text[], p_outbox_targets text[], p_outbox_correlations text[],
    p_outbox_payloads text[],
    p_consume text[],
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
BEGIN
    -- 1. fencing, always first
    SELECT * INTO t FROM @schema@.threads WHERE thread_id = p_thread FOR UPDATE;
    IF NOT FOUND OR t.claim_token IS DISTINCT FROM p_token THEN
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
    -- 5. apply everything
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
    IF n_events > 0 THEN
        -- delivered at commit, only if the transaction commits
        PERFORM pg_notify(@channel@, p_thread);
    END IF;
    o_replayed := false;
    o_version := t.version + 1;
    o_checkpoint := resulting;
    o_first_seq := t.next_seq;
    o_event_count := n_events;
END
$fn$;

-- ---------------------------------------------------------------- maintenance

CREATE FUNCTION @schema@.compact_events(p_thread text, p_before bigint) RETURNS bigint
LANGUAGE plpgsql AS $fn$
DECLARE
    t @schema@.threads%ROWTYPE;
    new_floor bigint;
BEGIN
    SELECT * INTO t FROM @schema@.threads WHERE thread_id = p_thread FOR UPDATE;
    IF NOT FOUND OR NOT t.present THEN
        RETURN 1;
    END IF;
    new_floor := greatest(t.event_floor, least(p_before, t.next_seq));
    IF new_floor <> t.event_floor THEN
        DELETE FROM @schema@.events WHERE thread_id = p_thread AND seq < new_floor;
        UPDATE @schema@.threads SET event_floor = new_floor WHERE thread_id = p_thread;
    END IF;
    RETURN new_floor;
END
$fn$;

CREATE FUNCTION @schema@.delete_thread(p_thread text) RETURNS boolean
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
    PERFORM pg_notify(@channel@, p_thread);
    RETURN true;
END
$fn$;

-- Retention over one batch of threads (in thread id order after p_after). Locks the batch's
-- thread rows, so commits to them wait for at most one batch.
CREATE FUNCTION @schema@.prune_threads(
    p_after text, p_batch integer,
    p_checkpoint_age double precision, p_keep_checkpoints bigint,
    p_event_age double precision, p_keep_events bigint,
    p_receipt_age double precision,
    OUT o_last text, OUT o_threads integer, OUT o_checkpoints bigint, OUT o_events bigint,
    OUT o_receipts bigint)
LANGUAGE plpgsql AS $fn$
DECLARE
    n timestamptz := @schema@.store_now();
    ids text[];
    cp_cut timestamptz := n - make_interval(secs => p_checkpoint_age);
    ev_cut timestamptz := n - make_interval(secs => p_event_age);
    rc_cut timestamptz := n - make_interval(secs => p_receipt_age);
BEGIN
    ids := ARRAY(SELECT thread_id FROM @schema@.threads
                  WHERE present AND (p_after IS NULL OR thread_id > p_after)
                  ORDER BY thread_id LIMIT p_batch);
    o_threads := cardinality(ids);
    o_last := ids[o_threads];
    o_checkpoints := 0;
    o_events := 0;
    o_receipts := 0;
    IF o_threads = 0 THEN
        RETURN;
    END IF;
    PERFORM 1 FROM @schema@.threads WHERE thread_id = ANY (ids) ORDER BY thread_id FOR UPDATE;
    IF p_checkpoint_age IS NOT NULL OR p_keep_checkpoints IS NOT NULL THEN
        -- Drop the oldest checkpoints: beyond the count kept, or a prefix older than the
        -- cutoff; never the latest (rn < total).
        WITH h AS (
            SELECT thread_id, version,
                   row_number() OVER w AS rn,
                   count(*) OVER (PARTITION BY thread_id) AS total,
                   bool_and(cp_cut IS NOT NULL AND at < cp_cut) OVER w AS aged
              FROM @schema@.checkpoints
             WHERE thread_id = ANY (ids)
            WINDOW w AS (PARTITION BY thread_id ORDER BY version
                         ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW)
        ), gone AS (
            DELETE FROM @schema@.checkpoints c USING h
             WHERE c.thread_id = h.thread_id AND c.version = h.version AND h.rn < h.total
               AND ((p_keep_checkpoints IS NOT NULL
                     AND h.rn <= h.total - greatest(p_keep_checkpoints, 1))
                    OR h.aged)
            RETURNING 1
        )
        SELECT count(*) INTO o_checkpoints FROM gone;
    END IF;
    IF p_event_age IS NOT NULL OR p_keep_events IS NOT NULL THEN
        WITH f AS (
            SELECT t.thread_id, t.event_floor AS old_floor,
                   greatest(
                       t.event_floor,
                       CASE WHEN p_keep_events IS NULL THEN t.event_floor
                            ELSE t.next_seq - greatest(p_keep_events, 0) END,
                       CASE WHEN ev_cut IS NULL THEN t.event_floor
                            ELSE coalesce((SELECT min(e.seq) FROM @schema@.events e
                                            WHERE e.thread_id = t.thread_id
                                              AND e.at >= ev_cut), t.next_seq) END
                   ) AS new_floor
              FROM @schema@.threads t
             WHERE t.thread_id = ANY (ids)
        ), moved AS (
            UPDATE @schema@.threads t SET event_floor = f.new_floor
              FROM f
             WHERE t.thread_id = f.thread_id AND f.new_floor > f.old_floor
            RETURNING f.new_floor - f.old_floor AS dropped
        ), gone AS (
            DELETE FROM @schema@.events e USING f
             WHERE e.thread_id = f.thread_id AND e.seq < f.new_floor
               AND f.new_floor > f.old_floor
        )
        SELECT coalesce(sum(dropped), 0) INTO o_events FROM moved;
    END IF;
    IF p_receipt_age IS NOT NULL THEN
        WITH gone AS (
            DELETE FROM @schema@.receipts WHERE thread_id = ANY (ids) AND at < rc_cut
            RETURNING 1
        )
        SELECT count(*) INTO o_receipts FROM gone;
    END IF;
END
$fn$;

CREATE FUNCTION @schema@.prune_dispatches(p_age double precision, p_batch integer)
RETURNS bigint
LANGUAGE plpgsql AS $fn$
DECLARE
    cut timestamptz := @schema@.store_now() - make_interval(secs => p_age);
    dropped bigint;
BEGIN
    WITH gone AS (
        DELETE FROM @schema@.dispatches
         WHERE dispatch_id IN (SELECT dispatch_id FROM @schema@.dispatches
                                WHERE status = 'done' AND updated_at < cut
                                ORDER BY updated_at LIMIT p_batch
                                FOR UPDATE SKIP LOCKED)
        RETURNING 1
    )
    SELECT count(*) INTO dropped FROM gone;
    RETURN dropped;
END
$fn$;

-- ------------------------------------------------------------------------ queue

CREATE FUNCTION @schema@.enqueue(
    p_dispatch text, p_thread text, p_kind text, p_payload text, p_priority integer,
    p_available_at timestamptz, p_max_attempts bigint, p_dedupe text)
RETURNS SETOF @schema@.dispatches
LANGUAGE plpgsql AS $fn$
DECLARE
    n timestamptz := @schema@.store_now();
    d @schema@.dispatches%ROWTYPE;
    inserted boolean;
BEGIN
    -- claim_next locks thread rows with SKIP LOCKED and never creates them: every dispatch
    -- has its thread row from the start.
    INSERT INTO @schema@.threads (thread_id) VALUES (p_thread) ON CONFLICT (thread_id) DO NOTHING;
    -- A concurrent enqueue of the same id or dedupe key waits here for the other
    -- transaction; then the existing row is returned for the caller to compare.
    INSERT INTO @schema@.dispatches
           (dispatch_id, thread_id, kind, payload, priority, available_at, max_attempts,
            dedupe_key, status, attempts, created_at, updated_at)
    VALUES (p_dispatch, p_thread, p_kind, p_payload, p_priority, coalesce(p_available_at, n),
            p_max_attempts, p_dedupe, 'pending', 0, n, n)
    ON CONFLICT DO NOTHING
    RETURNING * INTO d;
    inserted := FOUND;
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

-- Lease up to p_limit available dispatches, at most one per thread, and grant each thread's
-- claim in the same transaction. Two cursors, merged in priority then enqueue order, read
-- the candidates: pending work that is due, and leases whose claim lapsed (expired or
-- released). Each reads with FOR UPDATE SKIP LOCKED one row at a time, so only the rows
-- visited are locked and concurrent claimers pass over each other's. Each candidate's
-- thread row is then locked with SKIP LOCKED as well and its claim re-checked on the latest
-- row version, so two claimers can never both grant a claim on one thread, even through two
-- different dispatches of it.
CREATE FUNCTION @schema@.claim_next(p_holder text, p_ttl double precision, p_limit integer)
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
               claim_token = t.epoch + 1, claim_expires = expires
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

CREATE FUNCTION @schema@.settle(p_dispatch text, p_token bigint, p_status text,
                                p_delay double precision, p_error text)
RETURNS SETOF @schema@.dispatches
LANGUAGE plpgsql AS $fn$
DECLARE
    n timestamptz := @schema@.store_now();
    tid text;
    t @schema@.threads%ROWTYPE;
    d @schema@.dispatches%ROWTYPE;
BEGIN
    SELECT thread_id INTO tid FROM @schema@.dispatches WHERE dispatch_id = p_dispatch;
    IF FOUND THEN
        -- lock order everywhere: the thread row, then its dispatches
        SELECT * INTO t FROM @schema@.threads WHERE thread_id = tid FOR UPDATE;
        SELECT * INTO d FROM @schema@.dispatches WHERE dispatch_id = p_dispatch FOR UPDATE;
    END IF;
    IF d.dispatch_id IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'WK006', MESSAGE = 'not found',
            DETAIL = json_build_object('what', 'dispatch', 'ident', p_dispatch)::text;
    END IF;
    IF d.status <> 'leased' OR d.token IS DISTINCT FROM p_token
       OR t.epoch IS DISTINCT FROM p_token THEN
        RAISE EXCEPTION USING ERRCODE = 'WK001', MESSAGE = 'stale claim',
            DETAIL = json_build_object('thread_id', tid, 'token', p_token,
                'current', t.claim_token)::text;
    END IF;
    UPDATE @schema@.threads SET claim_holder = NULL, claim_token = NULL, claim_expires = NULL
     WHERE thread_id = tid AND claim_token = p_token;
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
    RETURN NEXT d;
END
$fn$;

CREATE FUNCTION @schema@.cancel(p_thread text, p_reason text, p_dispatch text,
                                p_payload text, p_priority integer, p_max_attempts bigint)
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
    UPDATE @schema@.dispatches
       SET status = 'done', lease_until = NULL, lease_expires = NULL,
           last_error = 'cancelled: ' || p_reason, updated_at = n
     WHERE thread_id = p_thread AND status IN ('pending', 'leased', 'awaiting');
    -- Advancing the epoch fences the running owner: its commit, renew and settle carry a
    -- token that is no longer the thread's.
    UPDATE @schema@.threads
       SET epoch = t.epoch + 1, claim_holder = NULL, claim_token = NULL, claim_expires = NULL
     WHERE thread_id = p_thread;
    INSERT INTO @schema@.dispatches
           (dispatch_id, thread_id, kind, payload, priority, available_at, max_attempts,
            dedupe_key, status, attempts, created_at, updated_at)
    VALUES (p_dispatch, p_thread, 'cancel', p_payload, p_priority, n, p_max_attempts,
            NULL, 'pending', 0, n, n)
    RETURNING * INTO d;
    RETURN NEXT d;
END
$fn$;

CREATE FUNCTION @schema@.quarantine(p_dispatch text) RETURNS SETOF @schema@.dispatches
LANGUAGE plpgsql AS $fn$
DECLARE
    n timestamptz := @schema@.store_now();
    tid text;
    t @schema@.threads%ROWTYPE;
    d @schema@.dispatches%ROWTYPE;
    live boolean;
BEGIN
    SELECT thread_id INTO tid FROM @schema@.dispatches WHERE dispatch_id = p_dispatch;
    IF FOUND THEN
        SELECT * INTO t FROM @schema@.threads WHERE thread_id = tid FOR UPDATE;
        SELECT * INTO d FROM @schema@.dispatches WHERE dispatch_id = p_dispatch FOR UPDATE;
    END IF;
    IF d.dispatch_id IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'WK006', MESSAGE = 'not found',
            DETAIL = json_build_object('what', 'dispatch', 'ident', p_dispatch)::text;
    END IF;
    IF d.status = 'quarantined' THEN
        RETURN NEXT d;
        RETURN;
    END IF;
    live := d.status = 'leased' AND t.claim_token IS NOT NULL AND t.claim_token = d.token
            AND n <= t.claim_expires;
    IF d.status NOT IN ('pending', 'leased') OR live OR d.attempts < d.max_attempts THEN
        RAISE EXCEPTION USING ERRCODE = 'WK007', MESSAGE = 'invalid state',
            DETAIL = json_build_object('what', 'dispatch', 'ident', p_dispatch,
                'state', format('%s after %s of %s attempts%s', d.status, d.attempts,
                                d.max_attempts,
                                CASE WHEN live THEN ' with a live lease' ELSE '' END),
                'problem', 'only exhausted work that no worker holds can be quarantined')::text;
    END IF;
    UPDATE @schema@.dispatches
       SET status = 'quarantined', lease_until = NULL, lease_expires = NULL, updated_at = n
     WHERE dispatch_id = p_dispatch
    RETURNING * INTO d;
    RETURN NEXT d;
END
$fn$;

CREATE FUNCTION @schema@.requeue(p_dispatch text) RETURNS SETOF @schema@.dispatches
LANGUAGE plpgsql AS $fn$
DECLARE
    n timestamptz := @schema@.store_now();
    d @schema@.dispatches%ROWTYPE;
BEGIN
    SELECT * INTO d FROM @schema@.dispatches WHERE dispatch_id = p_dispatch FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'WK006', MESSAGE = 'not found',
            DETAIL = json_build_object('what', 'dispatch', 'ident', p_dispatch)::text;
    END IF;
    IF d.status <> 'quarantined' THEN
        RAISE EXCEPTION USING ERRCODE = 'WK007', MESSAGE = 'invalid state',
            DETAIL = json_build_object('what', 'dispatch', 'ident', p_dispatch,
                'state', d.status, 'problem', 'only quarantined work is requeued')::text;
    END IF;
    UPDATE @schema@.dispatches
       SET status = 'pending', attempts = 0, token = NULL, holder = NULL, lease_until = NULL,
           lease_expires = NULL, available_at = n, updated_at = n
     WHERE dispatch_id = p_dispatch
    RETURNING * INTO d;
    RETURN NEXT d;
END
$fn$;

CREATE FUNCTION @schema@.purge(p_dispatch text) RETURNS void
LANGUAGE plpgsql AS $fn$
DECLARE
    d @schema@.dispatches%ROWTYPE;
BEGIN
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
    DELETE FROM @schema@.dispatches WHERE dispatch_id = p_dispatch;
END
$fn$;

-- ---------------------------------------------------------------------- workers

CREATE FUNCTION @schema@.register_worker(p_worker text, p_incarnation text)
RETURNS bigint
LANGUAGE sql AS $fn$
    INSERT INTO @schema@.workers AS w
           (worker_id, incarnation_id, generation, registered_at, last_heartbeat)
    VALUES (p_worker, p_incarnation, 1, @schema@.store_now(), @schema@.store_now())
    ON CONFLICT (worker_id) DO UPDATE
       SET incarnation_id = excluded.incarnation_id, generation = w.generation + 1,
           registered_at = excluded.registered_at, last_heartbeat = excluded.last_heartbeat
    RETURNING generation
$fn$;

CREATE FUNCTION @schema@.heartbeat(p_worker text, p_incarnation text, p_generation bigint)
RETURNS void
LANGUAGE plpgsql AS $fn$
DECLARE
    w @schema@.workers%ROWTYPE;
BEGIN
    SELECT * INTO w FROM @schema@.workers WHERE worker_id = p_worker FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'WK006', MESSAGE = 'not found',
            DETAIL = json_build_object('what', 'worker', 'ident', p_worker)::text;
    END IF;
    IF w.generation <> p_generation OR w.incarnation_id <> p_incarnation THEN
        RAISE EXCEPTION USING ERRCODE = 'WK008', MESSAGE = 'worker superseded',
            DETAIL = json_build_object('worker_id', p_worker, 'generation', p_generation,
                'current', w.generation)::text;
    END IF;
    UPDATE @schema@.workers SET last_heartbeat = @schema@.store_now()
     WHERE worker_id = p_worker;
END
$fn$;

-- ------------------------------------------------------------------ messaging

-- Deliver the oldest staged outbox entry that no other relay holds, in one transaction:
-- append it to the target's inbox unless that message_id was delivered there before
-- (consumed or not), enqueue the target's message dispatch (deduplicated by its id), and
-- delete the staged entry. Returns false when nothing was staged.
CREATE FUNCTION @schema@.relay_one() RETURNS boolean
LANGUAGE plpgsql AS $fn$
DECLARE
    n timestamptz := @schema@.store_now();
    o @schema@.outbox%ROWTYPE;
    t @schema@.threads%ROWTYPE;
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
    INSERT INTO @schema@.dispatches
           (dispatch_id, thread_id, kind, payload, priority, available_at, max_attempts,
            dedupe_key, status, attempts, created_at, updated_at)
    VALUES (did, o.target_thread, 'message', json_build_object('message_id', o.message_id)::text,
            0, n, 5, did, 'pending', 0, n, n)
    ON CONFLICT DO NOTHING;
    DELETE FROM @schema@.outbox WHERE stage_seq = o.stage_seq;
    RETURN true;
END
$fn$;

-- Store a stream checkpoint if p_token is the thread's current claim. FOR SHARE makes a
-- concurrent takeover wait (or be waited for), so a put never lands after its fence moved.
CREATE FUNCTION @schema@.put_stream_checkpoint(p_run text, p_thread text, p_token bigint,
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
    ON CONFLICT (run_id) DO UPDATE
       SET thread_id = excluded.thread_id, body = excluded.body,
           updated_at = excluded.updated_at;
    RETURN true;
END
$fn$;
