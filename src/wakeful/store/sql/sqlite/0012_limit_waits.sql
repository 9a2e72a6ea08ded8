-- wakeful SQLite schema, version 12: the runs waiting for a rate-limit bucket (issue 39).
--
-- One row per key and waiting run: a take refused for a run records (or refreshes) it,
-- with since_us its first refusal and until_us when it asks again; a granted take deletes
-- it. limit_buckets() lists the rows still expected to ask (wakeful.limits.WAITER_GRACE);
-- a refused take deletes the key's rows long past (WAITER_PURGE: crashed workers).

CREATE TABLE limit_waits (
    key TEXT NOT NULL,
    run_id TEXT NOT NULL,
    thread_id TEXT NOT NULL,
    since_us INTEGER NOT NULL,
    until_us INTEGER NOT NULL,
    PRIMARY KEY (key, run_id)
) WITHOUT ROWID;
