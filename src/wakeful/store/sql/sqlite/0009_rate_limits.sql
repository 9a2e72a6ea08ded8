-- wakeful SQLite schema, version 9: rate-limit buckets shared by every process (issue 39).
--
-- One row per key (wakeful.limits.BucketState): the rates last configured, the levels as of
-- stamp_us, and the end of a provider's block (0: never blocked). Every take, reconcile and
-- block is one write transaction that reads the row and writes it back (the arithmetic is
-- wakeful.limits'), so processes serialise on SQLite's write lock.

CREATE TABLE limit_buckets (
    key TEXT PRIMARY KEY,
    rpm REAL,
    tpm REAL,
    burst REAL NOT NULL,
    requests REAL NOT NULL,
    tokens REAL NOT NULL,
    stamp_us INTEGER NOT NULL,
    blocked_us INTEGER NOT NULL DEFAULT 0
) WITHOUT ROWID;
