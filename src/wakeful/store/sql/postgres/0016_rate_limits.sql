-- wakeful PostgreSQL schema, version 16: rate-limit buckets shared by the fleet (issue 39).
--
-- One row per key (wakeful.limits.BucketState): the rates last configured, the levels as of
-- stamp, and the end of a provider's block (NULL: never blocked). Refilling starts at
-- greatest(stamp, blocked). Every change is one statement: take_limit() locks the key's row
-- (created full on first use) and writes it back in the same call; reconcile and block are
-- one statement each. Time is store_now(), the server's. The arithmetic is
-- wakeful.limits.take / reconcile / block (and its EPSILON): keep them in step.
--
-- Migration: a new table and function; nothing existing changes.

CREATE TABLE @schema@.limit_buckets (
    key text PRIMARY KEY,
    rpm double precision,
    tpm double precision,
    burst double precision NOT NULL,
    requests double precision NOT NULL,
    tokens double precision NOT NULL,
    stamp timestamptz NOT NULL,
    blocked timestamptz
);

-- Buckets are soft state: a take or a reconcile commits without waiting for the WAL flush
-- (set_config(..., true) lasts to the end of the caller's transaction), since losing the last
-- few of them in a server crash only lets a few calls more through, which the provider still
-- limits; the row is hot (every call of every worker on the key takes from it), and a flush
-- per call would serialise the fleet on the disk. A block (a 429) keeps the default.

-- Seconds until the take could succeed; 0 when it was granted (and taken).
CREATE FUNCTION @schema@.take_limit(
    p_key text, p_rpm double precision, p_tpm double precision, p_burst double precision,
    p_requests double precision, p_tokens double precision
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
    -- the latest rates win; a resource that becomes limited starts full unless drained
    lr := CASE WHEN b.rpm IS NOT NULL OR b.blocked IS NOT NULL THEN b.requests ELSE cap_r END;
    lt := CASE WHEN b.tpm IS NOT NULL OR b.blocked IS NOT NULL THEN b.tokens ELSE cap_t END;
    IF b.blocked IS NOT NULL AND n < b.blocked THEN
        UPDATE @schema@.limit_buckets
           SET rpm = p_rpm, tpm = p_tpm, burst = p_burst, requests = lr, tokens = lt
         WHERE key = p_key;
        RETURN extract(epoch FROM b.blocked - n);
    END IF;
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
    RETURN wait;
END
$$;

-- Pay p_tokens more (negative: give back, never above a full bucket).
CREATE FUNCTION @schema@.reconcile_limit(p_key text, p_tokens double precision)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    PERFORM set_config('synchronous_commit', 'off', true);
    UPDATE @schema@.limit_buckets
       SET tokens = least(greatest(1, tpm * burst / 60), tokens - p_tokens)
     WHERE key = p_key AND tpm IS NOT NULL;
END
$$;
