-- wakeful PostgreSQL store, schema version 12: a set-based batch starts only the plan
-- nodes it can use (decision 0022, fourth round).
--
-- Applied after 0011, under the same rules (one transaction, advisory lock, @schema@ and
-- @channel@ placeholders). commit_many keeps its signature and its answers; a process of
-- version 11 keeps calling it unchanged while and after this is applied.
--
-- 1. commit_many's set-based statement (0009) started, at every call, the executor nodes of
--    every part: among them wd (a checkpoint superseding a thread's pending writes) and rl
--    (the lease of a commit that releases without settling), two ModifyTable nodes that
--    open every index of writes and dispatches, though a dispatch's commits use neither.
--    The statement that locks the batch's thread rows now also reads whether any has
--    pending writes (write_count > 0, under the lock); with that or a release in the call
--    the statement runs as in 0009, otherwise the same statement without wd and rl (each
--    of which writes nothing then: its WHERE needs write_count > 0 or a release). Measured
--    in one session, batches of 10 a dispatch's commits, alternated: about 100 µs (6%) less
--    per call.
--
-- Everything else (the checks, their order, the fencing of every UPDATE by its token, the
-- answers) is 0009's.

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
             WHERE v.verdict = 'go' AND x.dispatch_id = v.settle AND x.token = v.token
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
