-- wakeful SQLite store, schema version 9: deploys in the middle of runs (issue 40).
--
-- workers.version: the code version the registered incarnation runs (Worker(version=...)),
-- NULL for a worker of an older wakeful; a new registration replaces it.

ALTER TABLE workers ADD COLUMN version TEXT;
