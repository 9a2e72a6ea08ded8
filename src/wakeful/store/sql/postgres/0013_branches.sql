-- wakeful PostgreSQL store, schema version 13: branches of a thread's history (issue 37,
-- time travel; decision 0036).
--
-- Applied after 0012, under the same rules (one transaction, advisory lock, @schema@ and
-- @channel@ placeholders). No function changes its signature; a process of version 12
-- keeps working (it never branches, and reads the stored message count, which equals the
-- view count until a branch).
--
-- A commit with branch_from continues from an earlier checkpoint. Nothing is removed: the
-- abandoned checkpoints and messages stay; the head moves to a new branch, one row of
-- branches, written with the commit in one transaction (the store calls commit() with the
-- thread row locked, then records the branch: see store/postgres/branches.py). Messages
-- stay append-only (messages.pos is the append order, threads.message_count the stored
-- count that commit() appends at); threads.message_offset turns the stored count into the
-- head branch's view count (view = stored + offset), which every snapshot read reports:
-- read() and list_threads() from the row, claim_next_read() (below) in its lease snapshots.
-- first_version: the version of the branch's first checkpoint (a checkpoint's branch is the
-- last branch whose first_version is at or below its version).

CREATE TABLE @schema@.branches (
    thread_id     text NOT NULL,
    number        integer NOT NULL,
    parent        integer NOT NULL,
    fork_point    text NOT NULL,
    old_head      text,
    checkpoint_id text NOT NULL,
    messages      bigint NOT NULL,
    message_start bigint NOT NULL,
    first_version bigint NOT NULL,
    at            timestamptz NOT NULL,
    PRIMARY KEY (thread_id, number)
);

ALTER TABLE @schema@.threads
    ADD COLUMN branch integer NOT NULL DEFAULT 0,
    ADD COLUMN message_offset bigint NOT NULL DEFAULT 0;

-- As in version 2, and the thread's branches go with everything else.
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
    DELETE FROM @schema@.branches WHERE thread_id = p_thread;
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
           message_count = 0, inbox_revision = 0, updated_at = NULL, branch = 0,
           message_offset = 0
     WHERE thread_id = p_thread;
    RETURN true;
END
$fn$;

-- As in version 11, with each lease snapshot's message count the head branch's view count.
CREATE OR REPLACE FUNCTION @schema@.claim_next_read(p_holder text, p_ttl double precision,
                                                    p_limit integer)
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
    n_lapsed bigint;
    g_dispatch text[];
    g_thread text[];
    g_epoch bigint[];
    g_tenant text[];
    granted integer;
    d @schema@.dispatches;
BEGIN
    -- 1. candidates and their threads, locked
    WITH due AS MATERIALIZED (
        SELECT x.dispatch_id, x.thread_id, x.priority, x.seq, x.status, x.available_at,
               x.tenant
          FROM @schema@.dispatches x
         WHERE x.status = 'pending' AND x.available_at <= n
           AND NOT coalesce((SELECT y.claim_token IS NOT NULL AND y.claim_expires >= n
                               FROM @schema@.threads y WHERE y.thread_id = x.thread_id), false)
         ORDER BY x.priority DESC, x.seq
         LIMIT p_limit
           FOR UPDATE OF x SKIP LOCKED
    ), lapsed AS MATERIALIZED (
        SELECT x.dispatch_id, x.thread_id, x.priority, x.seq, x.status, x.available_at,
               x.tenant
          FROM @schema@.dispatches x
         WHERE x.status = 'leased' AND x.lease_expires < n
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
                  FROM (SELECT * FROM due UNION ALL SELECT * FROM lapsed) u
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
    SELECT (SELECT count(*) FROM due), (SELECT count(*) FROM lapsed),
           array_agg(f.dispatch_id ORDER BY f.priority DESC, f.seq),
           array_agg(f.thread_id ORDER BY f.priority DESC, f.seq),
           array_agg(h.epoch ORDER BY f.priority DESC, f.seq),
           -- the tenant this lease fixes on its thread, NULL when it fixes none
           array_agg(CASE WHEN h.version = 0 AND h.tenant IS NULL THEN f.tenant END
                     ORDER BY f.priority DESC, f.seq)
      INTO n_due, n_lapsed, g_dispatch, g_thread, g_epoch, g_tenant
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
        -- 3. the claims and the leases in one statement, with each leased thread's snapshot
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
                   updated_at = n
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

    -- a refused candidate left room, and a source may hold more: the rest one by one
    IF granted < p_limit AND (n_due = p_limit OR n_lapsed = p_limit) THEN
        FOR d IN SELECT * FROM @schema@.claim_next(p_holder, p_ttl, p_limit - granted) LOOP
            o_dispatch := d;
            SELECT t.version, t.tenant, t.message_count + t.message_offset, t.next_seq, t.event_floor, c.body,
                   ARRAY(SELECT w.body FROM @schema@.writes w WHERE w.thread_id = t.thread_id
                          ORDER BY w.version, w.idx)
              INTO o_version, o_tenant, o_message_count, o_next_seq, o_event_floor,
                   o_checkpoint, o_writes
              FROM @schema@.threads t
              LEFT JOIN @schema@.checkpoints c
                ON c.thread_id = t.thread_id AND c.checkpoint_id = t.latest_checkpoint
             WHERE t.thread_id = d.thread_id;
            RETURN NEXT;
        END LOOP;
    END IF;
END
$fn$;

-- A page of a thread's history newest first, below a version: one backward range of the
-- checkpoints' primary key (thread_id, version) whatever the length of the history or the
-- statistics (a small or unanalyzed table would otherwise get a bitmap scan of the whole
-- thread's checkpoints and a sort: decision 0027's rule for listings).
CREATE FUNCTION @schema@.checkpoint_page(p_thread text, p_below bigint, p_limit integer)
RETURNS TABLE (o_body text, o_at timestamptz, o_version bigint)
LANGUAGE plpgsql STABLE
SET enable_seqscan = off
SET enable_bitmapscan = off
SET enable_sort = off
AS $fn$
BEGIN
    RETURN QUERY
    SELECT c.body, c.at, c.version FROM @schema@.checkpoints c
     WHERE c.thread_id = p_thread AND c.version < p_below
     ORDER BY c.version DESC
     LIMIT p_limit;
END
$fn$;
