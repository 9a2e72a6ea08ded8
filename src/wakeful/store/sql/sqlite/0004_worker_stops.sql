-- wakeful SQLite schema, version 4: a worker's graceful stop is recorded (issues 17 and 21).
--
-- workers.stopped_at (microseconds since the epoch, NULL while the incarnation runs or if it
-- died without stopping): set once by retire_worker for the current incarnation, cleared by
-- a new registration of the worker id.

ALTER TABLE workers ADD COLUMN stopped_at INTEGER;
