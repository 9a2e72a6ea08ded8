-- wakeful SQLite store, schema version 11: deploys in the middle of runs (issue 40).
--
-- workers.version: the code version the registered incarnation runs (Worker(version=...)),
-- NULL for a worker of an older wakeful; a new registration replaces it.

ALTER TABLE workers ADD COLUMN version TEXT;
--
-- Pinned runs (decision 0035, "Versions"):
-- dispatches.pinned_version: the version whose workers alone lease the row (NULL: any);
-- dispatches.released_from: the version a released pin named (release_pins).
-- The claim's pending index splits in two sources, each one index range: the unpinned rows
-- (dispatches_due, as before, now only those) and the rows pinned to the claimer's version
-- (dispatches_pinned, ranged on pinned_version). Existing rows are all unpinned.

ALTER TABLE dispatches ADD COLUMN pinned_version TEXT;
ALTER TABLE dispatches ADD COLUMN released_from TEXT;
DROP INDEX dispatches_due;
CREATE INDEX dispatches_due ON dispatches (priority DESC, seq)
    WHERE status = 'pending' AND pinned_version IS NULL;
CREATE INDEX dispatches_pinned ON dispatches (pinned_version, priority DESC, seq)
    WHERE status = 'pending' AND pinned_version IS NOT NULL;
