-- wakeful PostgreSQL schema, version 27: schedule ticks prepared ahead and fired set-based
-- (issue 38 item 4, decision 0055).
--
-- Applied after 0026, under the same rules (one transaction, advisory lock, @schema@
-- placeholder). Adds six nullable columns, two indexes and one function, and gives the ticks
-- fire_schedules() inserts their fair tags (end of file); changes nothing else. A process of
-- an earlier version keeps firing through fire_schedules(), which bumps the revision and so
-- makes any prepared tick of the schedule void.
--
-- Cron and time zones are Python's (cronsim, decision 0038), so the server cannot compute a
-- cron schedule's next tick. A firer computes it AHEAD (wakeful.fleet.firing_ahead), before
-- the tick is due, and stores with the schedule what firing that tick does, valid only at
-- the schedule's current revision:
--   prepared_revision  the revision it was computed at (any other write of the schedule
--                      bumps the revision: the preparation is then void);
--   prepared_tick      the tick (= next_fire_at at that revision), NULL when the schedule
--                      needs the firer in Python (an overlap="enqueue" schedule waiting);
--   prepared_until     the server fires it alone only before this instant: the next tick
--                      (a firer later than that catches up several ticks: Python's), or 60 s
--                      after the tick with catch_up="skip" (the tick counts as missed);
--   prepared_next      next_fire_at once fired (the tick after prepared_tick);
--   prepared           the tick's dispatch as JSON (id, thread, payload, tenant, priority,
--                      max_attempts; thread NULL when its template refused the tick), the
--                      overlap check (previous: the last tick's dispatch unless
--                      overlap="allow"; overlap) and, with overlap="enqueue", the body of
--                      the schedule waiting for the previous run (waiting);
--   prepared_body      the schedule's body once the tick fired (last_tick, fired, ...).
--
-- fire_prepared(p_limit): at most p_limit due schedules with a valid preparation, taken
-- FOR UPDATE SKIP LOCKED (firers running it at once split the due schedules instead of
-- queueing behind each other), fired by a few set-based statements, whatever their number:
--   overlap check: one unfinished_runs() read of their previous ticks; a busy schedule with
--      overlap="skip" advances without a tick, one with overlap="enqueue" waits as the firer
--      in Python makes it wait (waiting_since the tick, looked at again a second later by
--      that firer), reported 'waiting';
--   the ticks not stored yet, as enqueue() stores a start (if_busy 'enqueue', no key, due
--      now): their thread rows inserted if missing, then locked in thread order (the order
--      enqueue's callers and fire_schedules() lock them in); a thread not bound to a tenant
--      is bound to the first tick's tenant; a tick of another tenant's thread is refused
--      (passed over, the schedule advanced, as fire_schedules() does); the first tick on a
--      thread is 'pending' unless the thread's run slot is held or runs are queued
--      (slot_ahead(), asked only of threads that existed), then 'queued' behind the last;
--      further ticks on one thread queue behind the one before (slot_ahead() once per
--      thread that existed, none per tick); pending ones take fair tags
--      as one enqueue() after another would (fair_tag() once per priority and tenant, then
--      one more per row); one INSERT ... ON CONFLICT DO NOTHING, so a tick fired before
--      stays one dispatch;
--   the schedules advanced in one UPDATE (revision + 1, next_fire_at = prepared_next).
-- So a due schedule with a valid preparation is always fired here: the firer in Python
-- reads only the others (fire_prepared() never leaves one for it to plan in vain).
-- Returns a row per schedule taken (o_name, o_state 'fired' | 'skipped' | 'waiting') and a
-- row per dispatch created (o_dispatch). Commits without waiting for its WAL flush, as
-- fire_schedules() does (a batch lost with a server crash is as if never fired).

ALTER TABLE @schema@.schedules
    ADD COLUMN prepared_revision bigint,
    ADD COLUMN prepared_tick timestamptz,
    ADD COLUMN prepared_until timestamptz,
    ADD COLUMN prepared_next timestamptz,
    ADD COLUMN prepared text,
    ADD COLUMN prepared_body text;

-- what the firers still have to prepare: O(unprepared) to read, however many are prepared
CREATE INDEX schedules_unprepared ON @schema@.schedules (next_fire_at)
    WHERE NOT paused AND prepared_revision IS DISTINCT FROM revision;
-- what fire_prepared() takes, in due order: a batch reads its rows and stops (no sort of
-- every due schedule per batch)
CREATE INDEX schedules_prepared ON @schema@.schedules (next_fire_at)
    WHERE NOT paused AND prepared_revision = revision AND prepared_tick = next_fire_at;

CREATE FUNCTION @schema@.fire_prepared(p_limit integer)
RETURNS TABLE (o_name text, o_state text, o_dispatch @schema@.dispatches)
LANGUAGE plpgsql AS $fn$
DECLARE
    n timestamptz := @schema@.store_now();
    a_name text[];
    a_prev text[];
    a_overlap text[];
    a_id text[];
    a_thread text[];
    a_payload text[];
    a_tenant text[];
    a_priority integer[];
    a_attempts bigint[];
    a_wait text[];
    a_state text[];
    t_id text[];
    t_thread text[];
    t_payload text[];
    t_tenant text[];
    t_priority integer[];
    t_attempts bigint[];
    t_status text[];
    t_behind text[];
    t_tag double precision[];
    busy text[];
    made text[];
    refused text[];
    s_thread text[];
    s_busy text[];
    s_behind text[];
    d @schema@.dispatches%ROWTYPE;
BEGIN
    PERFORM set_config('synchronous_commit', 'off', true);
    WITH taken AS (
        SELECT s.name, s.prepared
          FROM @schema@.schedules s
         WHERE NOT s.paused AND s.next_fire_at <= n
           AND s.prepared_revision = s.revision AND s.prepared_tick = s.next_fire_at
           AND n < coalesce(s.prepared_until, 'infinity')
         ORDER BY s.next_fire_at
         LIMIT p_limit
           FOR UPDATE SKIP LOCKED
    ), t AS MATERIALIZED (  -- parsed once, and only the rows taken
        SELECT taken.name, taken.prepared::jsonb AS p FROM taken
    )
    SELECT coalesce(array_agg(t.name ORDER BY t.name), '{}'),
           array_agg(t.p ->> 'previous' ORDER BY t.name),
           array_agg(t.p ->> 'overlap' ORDER BY t.name),
           array_agg(t.p ->> 'id' ORDER BY t.name),
           array_agg(t.p ->> 'thread' ORDER BY t.name),
           array_agg(t.p ->> 'payload' ORDER BY t.name),
           array_agg(t.p ->> 'tenant' ORDER BY t.name),
           array_agg((t.p ->> 'priority')::integer ORDER BY t.name),
           array_agg((t.p ->> 'max_attempts')::bigint ORDER BY t.name),
           array_agg(t.p ->> 'waiting' ORDER BY t.name)
      INTO a_name, a_prev, a_overlap, a_id, a_thread, a_payload, a_tenant, a_priority,
           a_attempts, a_wait
      FROM t;
    IF cardinality(a_name) = 0 THEN
        RETURN;
    END IF;
    -- the overlap check of the whole batch in one read
    busy := ARRAY(SELECT u FROM @schema@.unfinished_runs(
                      ARRAY(SELECT x FROM unnest(a_prev) AS x WHERE x IS NOT NULL)) AS u);
    a_state := ARRAY(
        SELECT CASE WHEN b.u IS NULL THEN 'fired'
                    WHEN t.overlap = 'enqueue' THEN 'waiting'
                    ELSE 'skipped' END
          FROM unnest(a_prev, a_overlap, a_wait) WITH ORDINALITY AS t(prev, overlap, wait, i)
          LEFT JOIN (SELECT DISTINCT x AS u FROM unnest(busy) AS x) b ON b.u = t.prev
         ORDER BY t.i);
    -- the ticks to store: fired, a thread named, not stored before; by thread, then name
    SELECT coalesce(array_agg(t.id ORDER BY t.thread, t.name), '{}'),
           array_agg(t.thread ORDER BY t.thread, t.name),
           array_agg(t.payload ORDER BY t.thread, t.name),
           array_agg(t.tenant ORDER BY t.thread, t.name),
           array_agg(t.priority ORDER BY t.thread, t.name),
           array_agg(t.attempts ORDER BY t.thread, t.name)
      INTO t_id, t_thread, t_payload, t_tenant, t_priority, t_attempts
      FROM unnest(a_name, a_id, a_thread, a_payload, a_tenant, a_priority, a_attempts,
                  a_state) AS t(name, id, thread, payload, tenant, priority, attempts, state)
     WHERE t.state = 'fired' AND t.thread IS NOT NULL
       AND NOT EXISTS (SELECT 1 FROM @schema@.dispatches x WHERE x.dispatch_id = t.id);
    -- every dispatch has its thread row from the start (claim_next never creates one)
    WITH ins AS (
        INSERT INTO @schema@.threads (thread_id)
        SELECT DISTINCT x FROM unnest(t_thread) AS x ORDER BY 1
        ON CONFLICT (thread_id) DO NOTHING
        RETURNING thread_id)
    SELECT coalesce(array_agg(thread_id), '{}') INTO made FROM ins;
    -- concurrent runs and first tenant writes of a thread queue on its row, as in enqueue()
    PERFORM 1
       FROM @schema@.threads h
       JOIN (SELECT DISTINCT x FROM unnest(t_thread) AS x) v ON v.x = h.thread_id
      ORDER BY h.thread_id
        FOR UPDATE OF h;
    -- a thread no one wrote yet is bound to its first tick's tenant
    UPDATE @schema@.threads h
       SET tenant = f.tenant, present = true
      FROM (SELECT DISTINCT ON (x.thread) x.thread, x.tenant
              FROM unnest(t_thread, t_tenant) WITH ORDINALITY AS x(thread, tenant, k)
             WHERE x.tenant IS NOT NULL
             ORDER BY x.thread, x.k) f
     WHERE h.thread_id = f.thread AND h.version = 0 AND h.tenant IS NULL;
    -- the run slot of each thread that existed before (a new thread's is free): one
    -- slot_ahead() per such thread, none per tick
    SELECT coalesce(array_agg(v.x), '{}'), array_agg(z.o_busy), array_agg(z.o_behind)
      INTO s_thread, s_busy, s_behind
      FROM (SELECT x FROM unnest(t_thread) AS x
            EXCEPT SELECT x FROM unnest(made) AS x) v
     CROSS JOIN LATERAL @schema@.slot_ahead(v.x) AS z;
    -- Admission as enqueue() decides it, read before anything is inserted: a tick of another
    -- tenant's thread is refused; the first tick on a thread is admitted by the thread's run
    -- slot (a new thread's is free), the next ones queue behind the one before; a pending
    -- tick takes the fair tag one enqueue() after another would give it.
    WITH w AS (
        SELECT x.k, x.id, x.thread, x.tenant, x.priority,
               x.tenant IS NOT NULL AND (h.version > 0 OR h.tenant IS NOT NULL)
                   AND h.tenant IS DISTINCT FROM x.tenant AS refused
          FROM unnest(t_id, t_thread, t_tenant, t_priority)
               WITH ORDINALITY AS x(id, thread, tenant, priority, k)
          JOIN @schema@.threads h ON h.thread_id = x.thread
    ), r AS (
        SELECT w.*, row_number() OVER (PARTITION BY w.thread ORDER BY w.k) AS r,
               lag(w.id) OVER (PARTITION BY w.thread ORDER BY w.k) AS before
          FROM w WHERE NOT w.refused
    ), a AS (
        SELECT r.*,
               CASE WHEN r.r > 1 OR s.o_busy IS NOT NULL THEN 'queued' ELSE 'pending' END
                   AS status,
               CASE WHEN r.r > 1 THEN r.before ELSE s.o_behind END AS behind
          FROM r
          LEFT JOIN unnest(s_thread, s_busy, s_behind) AS s(thread, o_busy, o_behind)
            ON r.r = 1 AND s.thread = r.thread
    ), g AS MATERIALIZED (  -- fair_tag() once per priority and tenant
        SELECT p.priority, p.tenant, @schema@.fair_tag(p.priority, p.tenant) AS base
          FROM (SELECT DISTINCT a.priority, a.tenant FROM a WHERE a.status = 'pending') p
    ), o AS (
        SELECT a.k, a.status, a.behind,
               CASE WHEN a.status = 'pending'
                    THEN g.base + row_number() OVER (PARTITION BY a.status, a.priority,
                                                     a.tenant ORDER BY a.k) - 1
                    ELSE 0 END AS tag
          FROM a
          LEFT JOIN g ON a.status = 'pending' AND g.priority = a.priority
                     AND g.tenant IS NOT DISTINCT FROM a.tenant
    )
    SELECT coalesce(array_agg(w.id) FILTER (WHERE w.refused), '{}'),
           array_agg(o.status ORDER BY w.k), array_agg(o.behind ORDER BY w.k),
           array_agg(o.tag ORDER BY w.k)
      INTO refused, t_status, t_behind, t_tag
      FROM w LEFT JOIN o ON o.k = w.k;
    FOR d IN
        INSERT INTO @schema@.dispatches
               (dispatch_id, thread_id, kind, payload, priority, available_at, max_attempts,
                dedupe_key, status, attempts, created_at, updated_at, tenant, if_busy,
                queued_behind, fair_tag)
        SELECT x.id, x.thread, 'start', x.payload, x.priority, n, x.attempts, NULL, x.status,
               0, n, n, x.tenant, 'enqueue', x.behind, x.tag
          FROM unnest(t_id, t_thread, t_payload, t_tenant, t_priority, t_attempts, t_status,
                      t_behind, t_tag)
               WITH ORDINALITY AS x(id, thread, payload, tenant, priority, attempts, status,
                                    behind, tag, k)
         WHERE x.status IS NOT NULL
         ORDER BY x.k
        ON CONFLICT DO NOTHING
        RETURNING *
    LOOP
        o_name := NULL;
        o_state := NULL;
        o_dispatch := d;
        RETURN NEXT;
    END LOOP;
    -- a waiting schedule (overlap="enqueue", previous run unfinished) waits as the firer in
    -- Python makes it wait: waiting_since the tick, looked at again in a second
    -- (firing_batch.ENQUEUE_RECHECK), then fired by that firer once the run ended
    RETURN QUERY
    WITH v AS (
        SELECT t.name, t.state, t.wait
          FROM unnest(a_name, a_state, a_wait) AS t(name, state, wait)
    ), up AS (
        UPDATE @schema@.schedules s
           SET next_fire_at = CASE WHEN v.state = 'waiting' THEN n + interval '1 second'
                                   ELSE s.prepared_next END,
               revision = s.revision + 1, updated_at = n,
               body = CASE v.state WHEN 'fired' THEN s.prepared_body
                                   WHEN 'waiting' THEN coalesce(v.wait, s.body)
                                   ELSE s.body END
          FROM v
         WHERE s.name = v.name
        RETURNING s.name)
    SELECT v.name, v.state, NULL::@schema@.dispatches
      FROM v JOIN up ON up.name = v.name;
    -- a refused tick is passed over, said once (its schedule advanced): as fire_schedules()
    RETURN QUERY
    SELECT x, 'refused', NULL::@schema@.dispatches FROM unnest(refused) AS x;
END
$fn$;

-- fire_schedules() (version 20), changed in one way only: the ticks it inserts set-based (the
-- first on a thread it creates) take fair tags (they were left 0 when version 23 added them,
-- ahead of every tenant's pending work at their priority), as the ticks it enqueues do.
CREATE OR REPLACE FUNCTION @schema@.fire_schedules(p_firings text, p_ticks text)
RETURNS TABLE (o_lost text, o_refused text, o_dispatch @schema@.dispatches)
LANGUAGE plpgsql AS $fn$
DECLARE
    -- the batch as JSON (a JSON array of firings, one of ticks, each an object with its
    -- position "i"): one text parameter each, which the client encodes far faster than
    -- thirteen arrays; unpacked into arrays once
    p_names text[];
    p_revisions bigint[];
    p_tenants text[];
    p_paused boolean[];
    p_next timestamptz[];
    p_bodies text[];
    p_owner integer[];
    p_ids text[];
    p_threads text[];
    p_payloads text[];
    p_tick_tenants text[];
    p_priorities integer[];
    p_max_attempts bigint[];
    taken boolean[];
    i integer;
    k integer;
    d @schema@.dispatches%ROWTYPE;
    t_version bigint;
    t_tenant text;
    n timestamptz := @schema@.store_now();
    made text[];
    early integer[];
    got text[];
BEGIN
    SELECT coalesce(array_agg(x.name ORDER BY x.i), '{}'), array_agg(x.revision ORDER BY x.i),
           array_agg(x.tenant ORDER BY x.i), array_agg(x.paused ORDER BY x.i),
           array_agg(x.next_fire_at ORDER BY x.i), array_agg(x.body ORDER BY x.i)
      INTO p_names, p_revisions, p_tenants, p_paused, p_next, p_bodies
      FROM jsonb_to_recordset(p_firings::jsonb) AS x(i integer, name text, revision bigint,
           tenant text, paused boolean, next_fire_at timestamptz, body text);
    SELECT coalesce(array_agg(x.owner ORDER BY x.i), '{}'), array_agg(x.id ORDER BY x.i),
           array_agg(x.thread ORDER BY x.i), array_agg(x.payload ORDER BY x.i),
           array_agg(x.tenant ORDER BY x.i), array_agg(x.priority ORDER BY x.i),
           array_agg(x.max_attempts ORDER BY x.i)
      INTO p_owner, p_ids, p_threads, p_payloads, p_tick_tenants, p_priorities, p_max_attempts
      FROM jsonb_to_recordset(p_ticks::jsonb) AS x(i integer, owner integer, id text,
           thread text, payload text, tenant text, priority integer, max_attempts bigint);
    taken := array_fill(false, ARRAY[coalesce(array_length(p_names, 1), 0)]);
    -- Lost with a crash of the server, a batch is as if never fired: the schedules are due
    -- again with it (same transaction) and fire the same ids. A later commit that depends
    -- on it (a worker's run of a tick) flushes the WAL through it. So no fsync of its own.
    PERFORM set_config('synchronous_commit', 'off', true);
    -- one statement takes them all, in name order (SORT below the row locks)
    got := ARRAY(
        SELECT s.name
          FROM @schema@.schedules s
          JOIN unnest(p_names, p_revisions) AS v(name, revision)
            ON s.name = v.name AND s.revision = v.revision
         ORDER BY s.name
           FOR UPDATE OF s SKIP LOCKED);
    FOR i IN 1 .. coalesce(array_length(p_names, 1), 0) LOOP
        IF p_names[i] = ANY (got) THEN
            taken[i] := true;
        ELSE
            o_lost := p_names[i];
            o_refused := NULL;
            o_dispatch := NULL;
            RETURN NEXT;
        END IF;
    END LOOP;
    -- The first tick on each thread that does not exist yet: the thread is created here
    -- (its row inserted by this transaction, so no other can write it before this one
    -- ends), so nothing runs on it and the tick's start is admitted at once, as enqueue()
    -- decides for a new thread: both inserts set-based. Templates such as "digest-{date}"
    -- name a new thread per tick: most ticks of a burst take this path.
    WITH firsts AS (
        SELECT DISTINCT ON (p_threads[x.k]) x.k
          FROM generate_subscripts(p_ids, 1) AS x(k)
         WHERE taken[p_owner[x.k]]
         ORDER BY p_threads[x.k], x.k
    ), inserted AS (
        INSERT INTO @schema@.threads (thread_id, tenant, present)
        SELECT p_threads[f.k], p_tick_tenants[f.k], p_tick_tenants[f.k] IS NOT NULL
          FROM firsts f
        ON CONFLICT (thread_id) DO NOTHING
        RETURNING thread_id
    )
    SELECT coalesce(array_agg(thread_id), '{}') INTO made FROM inserted;
    early := ARRAY(
        SELECT DISTINCT ON (p_threads[x.k]) x.k
          FROM generate_subscripts(p_ids, 1) AS x(k)
         WHERE taken[p_owner[x.k]] AND p_threads[x.k] = ANY (made)
         ORDER BY p_threads[x.k], x.k);
    FOR d IN
        WITH e AS (
            SELECT x.j, x.o, p_priorities[x.j] AS priority, p_tick_tenants[x.j] AS tenant
              FROM unnest(early) WITH ORDINALITY AS x(j, o)
        ), g AS MATERIALIZED (  -- 0027: fair tags, as one enqueue() after another sets them
            SELECT p.priority, p.tenant, @schema@.fair_tag(p.priority, p.tenant) AS base
              FROM (SELECT DISTINCT e.priority, e.tenant FROM e) p
        )
        INSERT INTO @schema@.dispatches
               (dispatch_id, thread_id, kind, payload, priority, available_at, max_attempts,
                dedupe_key, status, attempts, created_at, updated_at, tenant, if_busy,
                queued_behind, fair_tag)
        SELECT p_ids[e.j], p_threads[e.j], 'start', p_payloads[e.j], p_priorities[e.j], n,
               p_max_attempts[e.j], NULL, 'pending', 0, n, n, p_tick_tenants[e.j], 'enqueue',
               NULL,
               g.base + row_number() OVER (PARTITION BY e.priority, e.tenant ORDER BY e.o) - 1
          FROM e JOIN g ON g.priority = e.priority AND g.tenant IS NOT DISTINCT FROM e.tenant
         ORDER BY e.o
        ON CONFLICT DO NOTHING
        RETURNING *
    LOOP
        o_lost := NULL;
        o_refused := NULL;
        o_dispatch := d;
        RETURN NEXT;
    END LOOP;
    -- The other ticks one by one through enqueue(): a thread that exists may be busy.
    FOR k IN 1 .. coalesce(array_length(p_ids, 1), 0) LOOP
        CONTINUE WHEN NOT taken[p_owner[k]] OR k = ANY (early);
        -- fired before (by a firer that died before storing the schedule): nothing more
        CONTINUE WHEN EXISTS (SELECT 1 FROM @schema@.dispatches WHERE dispatch_id = p_ids[k]);
        IF p_tick_tenants[k] IS NOT NULL THEN
            SELECT version, tenant INTO t_version, t_tenant
              FROM @schema@.threads WHERE thread_id = p_threads[k];
            IF FOUND AND (t_version > 0 OR t_tenant IS NOT NULL)
               AND t_tenant IS DISTINCT FROM p_tick_tenants[k] THEN
                o_lost := NULL;
                o_refused := p_ids[k];
                o_dispatch := NULL;
                RETURN NEXT;
                CONTINUE;
            END IF;
        END IF;
        SELECT * INTO d FROM @schema@.enqueue(
            p_ids[k], p_threads[k], 'start', p_payloads[k], p_priorities[k], NULL,
            p_max_attempts[k], NULL, p_tick_tenants[k], 'enqueue', NULL, 0, 0);
        IF FOUND THEN
            o_lost := NULL;
            o_refused := NULL;
            o_dispatch := d;
            RETURN NEXT;
        END IF;
    END LOOP;
    UPDATE @schema@.schedules s
       SET tenant = v.tenant, paused = v.paused, next_fire_at = v.next_fire_at,
           revision = s.revision + 1, updated_at = @schema@.store_now(), body = v.body
      FROM unnest(p_names, p_tenants, p_paused, p_next, p_bodies, taken)
           AS v(name, tenant, paused, next_fire_at, body, taken)
     WHERE s.name = v.name AND v.taken;
END
$fn$;
