-- wakeful PostgreSQL schema, version 21: a take folds the process's pending reconciles and
-- records the run that waits (issue 39).
--
-- take_limit gains p_settle (tokens to pay first, as reconcile_limit would: the usage of
-- the process's earlier calls minus their estimates), so a model call costs one statement
-- instead of a take and a reconcile; and p_run/p_thread, the run the take is for. A refused
-- take records the run in limit_waits (since its first refusal, until it asks again: at most
-- 5 s, wakeful.limits.MAX_LIMIT_WAIT) and deletes the key's rows past 60 s
-- (WAITER_PURGE: crashed workers); a granted one deletes the run's row. The arithmetic is
-- wakeful.limits.settle_and_take and store.buckets.waited: keep them in step.
--
-- Migration: a new table, a new overload of take_limit; the version-16 signature now calls
-- it (nothing to settle, no waiter), so one copy of the arithmetic remains.

CREATE TABLE @schema@.limit_waits (
    key text NOT NULL,
    run_id text NOT NULL,
    thread_id text NOT NULL,
    since timestamptz NOT NULL,
    until timestamptz NOT NULL,
    PRIMARY KEY (key, run_id)
);

-- Seconds until the take could succeed; 0 when it was granted (and taken). Asynchronous
-- commit, as version 16's take (buckets and waiters are soft state).
CREATE FUNCTION @schema@.take_limit(
    p_key text, p_rpm double precision, p_tpm double precision, p_burst double precision,
    p_requests double precision, p_tokens double precision, p_settle double precision,
    p_run text, p_thread text
) RETURNS double precision LANGUAGE plpgsql AS $$
DECLARE
    n timestamptz := @schema@.store_now();
    cap_r double precision := CASE WHEN p_rpm IS NULL THEN 0
                                   ELSE greatest(1, p_rpm * p_burst / 60) END;
    cap_t double precision := CASE WHEN p_tpm IS NULL THEN 0
                                   ELSE greatest(1, p_tpm * p_burst / 60) END;
    b @schema@.limit_buckets;
    lr double precision;
    lt double precision;
    elapsed double precision;
    need double precision;
    wait double precision := 0;
BEGIN
    PERFORM set_config('synchronous_commit', 'off', true);
    INSERT INTO @schema@.limit_buckets (key, rpm, tpm, burst, requests, tokens, stamp)
    VALUES (p_key, p_rpm, p_tpm, p_burst, cap_r, cap_t, n)
    ON CONFLICT (key) DO NOTHING;
    SELECT * INTO STRICT b FROM @schema@.limit_buckets WHERE key = p_key FOR UPDATE;
    -- the settle first, under the stored rates (reconcile_limit's arithmetic)
    IF p_settle <> 0 AND b.tpm IS NOT NULL THEN
        b.tokens := least(greatest(1, b.tpm * b.burst / 60), b.tokens - p_settle);
    END IF;
    -- the latest rates win; a resource that becomes limited starts full unless drained
    lr := CASE WHEN b.rpm IS NOT NULL OR b.blocked IS NOT NULL THEN b.requests ELSE cap_r END;
    lt := CASE WHEN b.tpm IS NOT NULL OR b.blocked IS NOT NULL THEN b.tokens ELSE cap_t END;
    IF b.blocked IS NOT NULL AND n < b.blocked THEN
        wait := extract(epoch FROM b.blocked - n);
        UPDATE @schema@.limit_buckets
           SET rpm = p_rpm, tpm = p_tpm, burst = p_burst, requests = lr, tokens = lt
         WHERE key = p_key;
    ELSE
        elapsed := greatest(0, extract(epoch FROM n - greatest(b.stamp, b.blocked)));
        lr := CASE WHEN p_rpm IS NULL THEN 0 ELSE least(cap_r, lr + elapsed * p_rpm / 60) END;
        lt := CASE WHEN p_tpm IS NULL THEN 0 ELSE least(cap_t, lt + elapsed * p_tpm / 60) END;
        IF p_rpm IS NOT NULL THEN
            need := least(p_requests, cap_r);
            IF lr < need - 1e-6 THEN wait := greatest(wait, (need - lr) * 60 / p_rpm); END IF;
        END IF;
        IF p_tpm IS NOT NULL THEN
            need := least(p_tokens, cap_t);
            IF lt < need - 1e-6 THEN wait := greatest(wait, (need - lt) * 60 / p_tpm); END IF;
        END IF;
        IF wait = 0 THEN
            IF p_rpm IS NOT NULL THEN lr := lr - p_requests; END IF;
            IF p_tpm IS NOT NULL THEN lt := lt - p_tokens; END IF;
        END IF;
        UPDATE @schema@.limit_buckets
           SET rpm = p_rpm, tpm = p_tpm, burst = p_burst, requests = lr, tokens = lt, stamp = n
         WHERE key = p_key;
    END IF;
    IF p_run IS NOT NULL THEN
        IF wait > 0 THEN
            INSERT INTO @schema@.limit_waits AS w (key, run_id, thread_id, since, until)
            VALUES (p_key, p_run, p_thread, n, n + make_interval(secs => least(wait, 5)))
            ON CONFLICT (key, run_id) DO UPDATE
               SET thread_id = excluded.thread_id, until = excluded.until;
            DELETE FROM @schema@.limit_waits
             WHERE key = p_key AND until < n - interval '60 seconds';
        ELSE
            DELETE FROM @schema@.limit_waits WHERE key = p_key AND run_id = p_run;
        END IF;
    END IF;
    RETURN wait;
END
$$;

CREATE OR REPLACE FUNCTION @schema@.take_limit(
    p_key text, p_rpm double precision, p_tpm double precision, p_burst double precision,
    p_requests double precision, p_tokens double precision
) RETURNS double precision LANGUAGE sql AS $$
    SELECT @schema@.take_limit(p_key, p_rpm, p_tpm, p_burst, p_requests, p_tokens, 0, NULL, NULL)
$$;
