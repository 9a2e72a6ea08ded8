-- wakeful PostgreSQL store, schema version 18: deploys in the middle of runs (issue 40).
--
-- Applied after 0017, under the same rules (one transaction, advisory lock, @schema@ and
-- @channel@ placeholders). The two-argument register_worker of version 7 stays (a process of
-- the previous version keeps working against this schema; its workers list no version).
--
-- 1. workers.version: the code version the registered incarnation runs, NULL for a worker
--    that named none; a new registration replaces it.
-- 2. register_worker(worker, incarnation, version).

ALTER TABLE @schema@.workers ADD COLUMN version text;

CREATE FUNCTION @schema@.register_worker(p_worker text, p_incarnation text, p_version text)
RETURNS bigint
LANGUAGE sql AS $fn$
    INSERT INTO @schema@.workers AS w
           (worker_id, incarnation_id, generation, registered_at, last_heartbeat, stopped_at,
            version)
    VALUES (p_worker, p_incarnation, 1, @schema@.store_now(), @schema@.store_now(), NULL,
            p_version)
    ON CONFLICT (worker_id) DO UPDATE
       SET incarnation_id = excluded.incarnation_id, generation = w.generation + 1,
           registered_at = excluded.registered_at, last_heartbeat = excluded.last_heartbeat,
           stopped_at = NULL, version = excluded.version
    RETURNING generation
$fn$;

-- 3. Pinned runs (decision 0035, "Versions"): dispatches.pinned_version is the version whose
--    workers alone lease the row (NULL: any), dispatches.released_from the version a
--    released pin named. The claim's pending index splits in two sources, each one index
--    range: the unpinned rows (dispatches_pending, as before, now only those) and the rows
--    pinned to the claimer's version (dispatches_pinned, ranged on pinned_version). Existing
--    rows are all unpinned. A lease with a version pins the row it grants (not a cancel).
ALTER TABLE @schema@.dispatches ADD COLUMN pinned_version text, ADD COLUMN released_from text;
DROP INDEX @schema@.dispatches_pending;
CREATE INDEX dispatches_pending ON @schema@.dispatches (priority DESC, seq)
    WHERE status = 'pending' AND pinned_version IS NULL;
CREATE INDEX dispatches_pinned ON @schema@.dispatches (pinned_version, priority DESC, seq)
    WHERE status = 'pending' AND pinned_version IS NOT NULL;

-- 4. A resume is enqueued pinned to the version of the run it continues: the pin of the
--    dispatch holding the thread's run slot (the suspended run's), none behind a cancel.
CREATE FUNCTION @schema@.pin_resume() RETURNS trigger
LANGUAGE plpgsql AS $fn$
BEGIN
    SELECT CASE WHEN h.kind = 'cancel' THEN NULL ELSE h.pinned_version END
      INTO NEW.pinned_version
      FROM @schema@.dispatches h
     WHERE h.thread_id = NEW.thread_id
       AND h.status IN ('pending', 'leased', 'awaiting', 'quarantined')
     ORDER BY h.seq
     LIMIT 1;
    RETURN NEW;
END
$fn$;
CREATE TRIGGER dispatches_pin_resume BEFORE INSERT ON @schema@.dispatches
    FOR EACH ROW WHEN (NEW.kind = 'resume') EXECUTE FUNCTION @schema@.pin_resume();

-- 5. claim_next_read(holder, ttl, limit, version, take_starts): the unpinned source (when
--    take_starts), the source pinned to the version, and the lapsed leases (filtered by
--    version: only a crash leaves rows there), each one index range, merged as before. When
--    a refused candidate left room and a source may hold more, the rest one by one (the
--    next candidate of the three sources, skipping the threads already passed).
CREATE FUNCTION @schema@.claim_next_read(p_holder text, p_ttl double precision,
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
    -- 1. candidates and their threads, locked
    WITH due AS MATERIALIZED (
        SELECT x.dispatch_id, x.thread_id, x.priority, x.seq, x.status, x.available_at,
               x.tenant
          FROM @schema@.dispatches x
         WHERE p_starts AND x.status = 'pending' AND x.pinned_version IS NULL
           AND x.available_at <= n
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
           AND x.available_at <= n
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
               AND x.available_at <= n AND x.thread_id <> ALL (passed)
             ORDER BY x.priority DESC, x.seq
             LIMIT 1
               FOR UPDATE OF x SKIP LOCKED
        ), b AS MATERIALIZED (
            SELECT x.dispatch_id, x.thread_id, x.priority, x.seq, x.tenant
              FROM @schema@.dispatches x
             WHERE x.status = 'pending' AND x.pinned_version = p_version
               AND x.available_at <= n AND x.thread_id <> ALL (passed)
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

-- The claims of schema versions 1 to 14, kept for a process of an earlier release that is
-- still running: it names no version, so it leases only unpinned work. (Not inlined SQL:
-- their statement must not be compiled either, migration 0010.)
CREATE OR REPLACE FUNCTION @schema@.claim_next_read(p_holder text, p_ttl double precision,
                                                    p_limit integer)
RETURNS TABLE (o_dispatch @schema@.dispatches, o_version bigint, o_tenant text,
               o_message_count bigint, o_next_seq bigint, o_event_floor bigint,
               o_checkpoint text, o_writes text[])
LANGUAGE plpgsql
SET jit = off
SET plan_cache_mode = force_generic_plan
AS $fn$
BEGIN
    RETURN QUERY SELECT * FROM @schema@.claim_next_read(p_holder, p_ttl, p_limit, NULL, true);
END
$fn$;

CREATE OR REPLACE FUNCTION @schema@.claim_next(p_holder text, p_ttl double precision,
                                               p_limit integer)
RETURNS SETOF @schema@.dispatches
LANGUAGE plpgsql
SET jit = off
AS $fn$
BEGIN
    RETURN QUERY SELECT (r.o_dispatch).*
                   FROM @schema@.claim_next_read(p_holder, p_ttl, p_limit, NULL, true) r;
END
$fn$;

-- 6. release_pins(grace, limit): the pending (or lapsed-lease) rows pinned to a version none
--    of whose workers has been alive for the grace (its recorded stop, else its last
--    heartbeat, is older), unpinned with released_from set; up to limit rows. The pinned
--    versions are found by a loose walk of dispatches_pinned (one probe per version).
CREATE FUNCTION @schema@.release_pins(p_grace double precision, p_limit integer)
RETURNS SETOF @schema@.dispatches
LANGUAGE plpgsql AS $fn$
DECLARE
    n timestamptz := @schema@.store_now();
    since timestamptz := n - make_interval(secs => p_grace);
    v text;
    room integer := p_limit;
    moved integer;
BEGIN
    FOR v IN
        WITH RECURSIVE vs AS (
            (SELECT x.pinned_version AS v FROM @schema@.dispatches x
              WHERE x.status = 'pending' AND x.pinned_version IS NOT NULL
              ORDER BY x.pinned_version LIMIT 1)
            UNION ALL
            SELECT (SELECT x.pinned_version FROM @schema@.dispatches x
                     WHERE x.status = 'pending' AND x.pinned_version IS NOT NULL
                       AND x.pinned_version > vs.v
                     ORDER BY x.pinned_version LIMIT 1)
              FROM vs WHERE vs.v IS NOT NULL
        )
        SELECT p.v FROM (
            SELECT vs.v FROM vs WHERE vs.v IS NOT NULL
            UNION
            SELECT x.pinned_version FROM @schema@.dispatches x
             WHERE x.status = 'leased' AND x.lease_expires < n AND x.pinned_version IS NOT NULL
        ) p
         WHERE NOT EXISTS (SELECT FROM @schema@.workers w
                            WHERE w.version = p.v
                              AND coalesce(w.stopped_at, w.last_heartbeat) > since)
         ORDER BY p.v
    LOOP
        RETURN QUERY
        WITH m AS (
            SELECT x.dispatch_id FROM @schema@.dispatches x
             WHERE x.pinned_version = v
               AND (x.status = 'pending' OR (x.status = 'leased' AND x.lease_expires < n))
             ORDER BY x.seq
             LIMIT room
               FOR UPDATE SKIP LOCKED
        )
        UPDATE @schema@.dispatches x
           SET released_from = x.pinned_version, pinned_version = NULL, updated_at = n
          FROM m
         WHERE x.dispatch_id = m.dispatch_id
        RETURNING x.*;
        GET DIAGNOSTICS moved = ROW_COUNT;
        room := room - moved;
        EXIT WHEN room <= 0;
    END LOOP;
END
$fn$;

-- 7. quarantine also parks a released dispatch (on_version_change = 'hold'); requeue clears
--    released_from (the operator's decision to run it on the current code).
CREATE OR REPLACE FUNCTION @schema@.quarantine(p_dispatch text) RETURNS SETOF @schema@.dispatches
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
    IF d.status NOT IN ('pending', 'leased') OR live
       OR (d.attempts < d.max_attempts AND d.released_from IS NULL) THEN
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

CREATE OR REPLACE FUNCTION @schema@.requeue(p_dispatch text) RETURNS SETOF @schema@.dispatches
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
           lease_expires = NULL, available_at = n, updated_at = n, released_from = NULL
     WHERE dispatch_id = p_dispatch
    RETURNING * INTO d;
    RETURN NEXT d;
END
$fn$;
