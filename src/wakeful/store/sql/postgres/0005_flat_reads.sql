-- wakeful PostgreSQL store, schema version 5: every read and claim path answers from an
-- index range proportional to its page (issue 27).
--
-- Applied after 0004, under the same rules (one transaction, advisory lock, @schema@ and
-- @channel@ placeholders).
--
-- 1. claim_next() checks a candidate's thread with a scalar subquery (a lookup by the
--    thread's key per candidate, which the planner cannot turn into a join) and runs with
--    sequential and bitmap scans disabled: whatever the statistics say (none, stale or
--    fresh), its candidates come from walking dispatches_pending in claim order and from
--    dispatches_lapsing (an index scan, which also marks dead entries so later scans skip
--    them), never from a scan of every thread or every pending row.
-- 2. dispatches.owner: the tenant of the dispatch's thread (threads.tenant), kept by two
--    triggers, so that a tenant's listing is a range of dispatches_by_owner instead of an
--    owner lookup per dispatch.
-- 3. dispatches_by_thread_status: one thread's dispatches of one status, in enqueue order.
-- 4. threads_listed / threads_listed_by_tenant: list_threads() walks only threads with a
--    commit, not the version-0 rows that enqueue creates.
-- 5. list_dispatches(), list_threads() and queue_depths() run in functions with sequential
--    and bitmap scans disabled, as claim_next(): without statistics PostgreSQL estimated a
--    status or a tenant to match a few rows and chose to bitmap-scan and sort all of them
--    (every pending dispatch for the first page); each filter combination now has an index
--    that yields its rows in page order, and the settings leave the planner no other plan.

-- ------------------------------------------------------------------- indexes

CREATE INDEX threads_listed ON @schema@.threads (thread_id) WHERE present AND version > 0;
CREATE INDEX threads_listed_by_tenant ON @schema@.threads (tenant, thread_id)
    WHERE present AND version > 0;
CREATE INDEX dispatches_by_thread_status ON @schema@.dispatches (thread_id, status, seq);

-- ------------------------------------------------------------ dispatch owner

-- Internal, never part of a Dispatch record: the tenant of the thread, as threads.tenant
-- holds it (NULL while nothing fixed it, again after delete_thread).
ALTER TABLE @schema@.dispatches ADD COLUMN owner text;

UPDATE @schema@.dispatches d SET owner = t.tenant
  FROM @schema@.threads t
 WHERE t.thread_id = d.thread_id AND t.tenant IS NOT NULL;

-- Work queued before version 4 on a thread that nothing bound yet: the HTTP layer treats the
-- thread as the tenant its first start, resume or message payload names.
UPDATE @schema@.dispatches d SET owner = l.tenant
  FROM (SELECT DISTINCT ON (x.thread_id) x.thread_id,
               CASE WHEN jsonb_typeof(x.payload::jsonb -> 'tenant') = 'string'
                    THEN x.payload::jsonb ->> 'tenant' END AS tenant
          FROM @schema@.dispatches x
          JOIN @schema@.threads t ON t.thread_id = x.thread_id
         WHERE t.version = 0 AND t.tenant IS NULL
           AND x.kind IN ('start', 'resume', 'message')
           AND jsonb_typeof(x.payload::jsonb) = 'object'
           AND (x.payload::jsonb ? 'tenant' OR x.kind = 'message')
         ORDER BY x.thread_id, x.seq) l
 WHERE d.thread_id = l.thread_id AND l.tenant IS NOT NULL;

CREATE INDEX dispatches_by_owner ON @schema@.dispatches (owner, seq) WHERE owner IS NOT NULL;
CREATE INDEX dispatches_by_owner_status ON @schema@.dispatches (owner, status, seq)
    WHERE owner IS NOT NULL;

-- Every insert (enqueue, cancel, the relay) reads the thread row it has just created or
-- locked.
CREATE FUNCTION @schema@.dispatch_owner() RETURNS trigger
LANGUAGE plpgsql AS $fn$
BEGIN
    NEW.owner := (SELECT t.tenant FROM @schema@.threads t WHERE t.thread_id = NEW.thread_id);
    RETURN NEW;
END
$fn$;

CREATE TRIGGER dispatches_owner BEFORE INSERT ON @schema@.dispatches
    FOR EACH ROW EXECUTE FUNCTION @schema@.dispatch_owner();

-- A thread's tenant changes when something fixes it (once) and when delete_thread clears
-- it; both hold the thread row's lock, the lock every write of its dispatches takes first.
CREATE FUNCTION @schema@.dispatch_owner_follows_thread() RETURNS trigger
LANGUAGE plpgsql AS $fn$
BEGIN
    UPDATE @schema@.dispatches SET owner = NEW.tenant
     WHERE thread_id = NEW.thread_id AND owner IS DISTINCT FROM NEW.tenant;
    RETURN NULL;
END
$fn$;

CREATE TRIGGER threads_tenant AFTER UPDATE OF tenant ON @schema@.threads
    FOR EACH ROW WHEN (OLD.tenant IS DISTINCT FROM NEW.tenant)
    EXECUTE FUNCTION @schema@.dispatch_owner_follows_thread();

-- ---------------------------------------------------------------- claim_next

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
        UPDATE @schema@.threads
           SET present = true, epoch = t.epoch + 1, claim_holder = p_holder,
               claim_token = t.epoch + 1, claim_expires = expires,
               tenant = CASE WHEN t.version = 0 AND t.tenant IS NULL THEN d.tenant
                             ELSE t.tenant END
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

-- ------------------------------------------------------------------- listings

-- A page of dispatches in enqueue order after p_floor (a seq), each filter optional. With
-- p_owner, only the dispatches a tenant may see: on its threads, and not submitted for
-- another tenant. EXECUTE plans each call for its filters (a cached generic plan would have
-- to serve every combination).
--
-- The filters that pick the index are written "= ANY (ARRAY[...])" and ordered by: with a
-- plain equality the planner treats the column as constant, so the seq index walked with a
-- filter satisfies ORDER BY seq too, and with statistics it chose that walk (across every
-- other tenant's or status's rows). ANY keeps the column in the ordering, which only the
-- composite index provides; sorts, sequential and bitmap scans are disabled, so that index
-- range is the plan.
CREATE FUNCTION @schema@.list_dispatches(p_floor bigint, p_status text, p_thread text,
                                         p_owner text, p_limit integer)
RETURNS SETOF @schema@.dispatches
LANGUAGE plpgsql STABLE
SET enable_seqscan = off
SET enable_bitmapscan = off
SET enable_sort = off
AS $fn$
DECLARE
    lead text;
    filters text := '';
    ordering text := 'seq';
BEGIN
    -- the index: by thread (one thread's page), else by owner, else by status, else seq
    lead := CASE WHEN p_thread IS NOT NULL THEN 'thread_id = ANY (ARRAY[$3])'
                 WHEN p_owner IS NOT NULL THEN 'owner = ANY (ARRAY[$4])' END;
    IF lead IS NOT NULL THEN
        filters := ' AND ' || lead;
        ordering := CASE WHEN p_thread IS NOT NULL THEN 'thread_id' ELSE 'owner' END;
        IF p_status IS NOT NULL THEN
            -- a plain equality here: the composite index then yields (lead, seq) order from
            -- the exact range, where ANY on a second column would become a filter
            filters := filters || ' AND status = $2';
        END IF;
        ordering := ordering || ', seq';
    ELSIF p_status IS NOT NULL THEN
        filters := ' AND status = ANY (ARRAY[$2])';
        ordering := 'status, seq';
    END IF;
    IF p_owner IS NOT NULL THEN
        filters := filters || ' AND owner = $4 AND (tenant IS NULL OR tenant = $4)';
    END IF;
    RETURN QUERY EXECUTE
        'SELECT * FROM @schema@.dispatches WHERE seq > $1' || filters
        || ' ORDER BY ' || ordering || ' LIMIT $5'
        USING p_floor, p_status, p_thread, p_owner, p_limit;
END
$fn$;

-- Threads with at least one commit, by id after p_after, only p_tenant's when given (the
-- tenant written as in list_dispatches, for the same reason).
CREATE FUNCTION @schema@.list_threads(p_tenant text, p_after text, p_limit integer)
RETURNS SETOF @schema@.threads
LANGUAGE plpgsql STABLE
SET enable_seqscan = off
SET enable_bitmapscan = off
SET enable_sort = off
AS $fn$
BEGIN
    RETURN QUERY EXECUTE
        'SELECT * FROM @schema@.threads WHERE present AND version > 0'
        || CASE WHEN p_tenant IS NULL THEN '' ELSE ' AND tenant = ANY (ARRAY[$1])' END
        || CASE WHEN p_after IS NULL THEN '' ELSE ' AND thread_id > $2' END
        || CASE WHEN p_tenant IS NULL THEN ' ORDER BY thread_id'
                ELSE ' ORDER BY tenant, thread_id' END
        || ' LIMIT $3'
        USING p_tenant, p_after, p_limit;
END
$fn$;

-- The number of open dispatches of each status (done is history, not depth), each counted
-- up to p_limit: an index-only range of dispatches_by_status per status, so a scrape costs
-- at most four ranges of p_limit
-- entries however deep the queue is (a counter table would put one hot row in every queue
-- write of the fleet; the planner's estimates are stale or absent without ANALYZE).
CREATE FUNCTION @schema@.queue_depths(p_limit integer)
RETURNS TABLE (o_status text, o_count bigint)
LANGUAGE plpgsql STABLE
SET enable_seqscan = off
SET enable_bitmapscan = off
SET enable_sort = off
AS $fn$
BEGIN
    -- ordered by (status, seq), with the status as ANY, as in list_dispatches: otherwise the
    -- planner may count through another index holding status in a later column (a scan of
    -- all of it)
    RETURN QUERY
        SELECT s.status, (SELECT count(*) FROM (SELECT 1 FROM @schema@.dispatches d
                                                   WHERE d.status = ANY (ARRAY[s.status])
                                                   ORDER BY d.status, d.seq
                                                   LIMIT p_limit) c)
          FROM unnest(ARRAY['pending', 'leased', 'awaiting', 'quarantined'])
               AS s(status);
END
$fn$;
