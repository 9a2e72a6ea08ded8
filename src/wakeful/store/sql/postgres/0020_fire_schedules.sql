-- wakeful PostgreSQL store, schema version 20: firing schedule ticks in batches (issue 38).
--
-- Applied after 0019, under the same rules (one transaction, advisory lock, @schema@
-- placeholder). Adds two functions and changes nothing that exists: a process of version 18
-- keeps firing one tick at a time through enqueue() and put_schedule.
--
-- fire_schedules(): a whole batch of firings in one statement (wakeful.store.firings). The
-- firer computed the ticks (cron is Python's); the function takes each schedule that still
-- has the revision the firer read and that no other firer is firing now (FOR UPDATE SKIP
-- LOCKED: two workers reading the same due page share it instead of waiting on each other),
-- enqueues the ticks not stored yet (on a thread it creates, set-based; on any other through
-- enqueue(), so admission on a thread that exists stays enqueue's alone), and stores the
-- advanced schedules. The schedule rows are taken in name order and the
-- ticks enqueued in the order given (the firer sorts them by thread), so two firers lock
-- thread rows in one order. A tick whose thread belongs to another tenant is refused
-- before enqueue() would raise: one refused tick must not undo the batch.
-- unfinished_runs(): the overlap check of many schedules in one read.

CREATE FUNCTION @schema@.fire_schedules(p_firings text, p_ticks text)
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
        INSERT INTO @schema@.dispatches
               (dispatch_id, thread_id, kind, payload, priority, available_at, max_attempts,
                dedupe_key, status, attempts, created_at, updated_at, tenant, if_busy,
                queued_behind)
        SELECT p_ids[e.j], p_threads[e.j], 'start', p_payloads[e.j], p_priorities[e.j], n,
               p_max_attempts[e.j], NULL, 'pending', 0, n, n, p_tick_tenants[e.j], 'enqueue',
               NULL
          FROM unnest(early) AS e(j)
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

CREATE FUNCTION @schema@.unfinished_runs(p_ids text[])
RETURNS SETOF text
LANGUAGE sql STABLE AS $fn$
    SELECT d.dispatch_id
      FROM @schema@.dispatches d
     WHERE d.dispatch_id = ANY (p_ids)
       AND (d.status <> 'done'
            OR EXISTS (
                SELECT 1
                  FROM @schema@.threads t
                  JOIN @schema@.checkpoints c
                    ON c.thread_id = t.thread_id AND c.checkpoint_id = t.latest_checkpoint
                 WHERE t.thread_id = d.thread_id
                   AND c.body::jsonb ->> 'run_id'
                       = coalesce(d.payload::jsonb ->> 'run_id', '')
                   AND c.body::jsonb ->> 'status' NOT IN
                       ('completed', 'failed', 'cancelled', 'indeterminate', 'interrupted')))
$fn$;
