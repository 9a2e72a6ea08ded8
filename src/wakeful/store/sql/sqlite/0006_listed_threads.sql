-- wakeful SQLite schema, version 6: fewer pages written per commit (issue 22, decision 0005).
--
-- threads.listed (internal): 1 once the thread has a commit (version > 0), set once and
-- never cleared (delete_thread removes the row). The two partial indexes on threads used to
-- filter on ``version > 0``; every commit changes ``version``, so SQLite deleted and
-- re-inserted both index entries (two b-tree pages written) on every commit. Filtered on
-- ``listed`` they change once per thread. This version's writer sets ``listed`` in the
-- first commit's update; the triggers keep it right for writes that do not (a process of
-- version 5 or older still open on the file, or a bulk insert). Every such process names
-- ``tenant`` in the update that takes a thread's version from 0 to 1 (since version 5
-- later commits do not name it), so the update trigger watches ``tenant``, not
-- ``version``: a later commit, which names neither ``tenant`` nor ``listed``, starts no
-- trigger at all.

ALTER TABLE threads ADD COLUMN listed INTEGER NOT NULL DEFAULT 0;

UPDATE threads SET listed = 1 WHERE version > 0;

DROP INDEX threads_by_tenant;
DROP INDEX threads_listed;
CREATE INDEX threads_by_tenant ON threads (tenant, thread_id) WHERE listed = 1;
CREATE INDEX threads_listed ON threads (thread_id) WHERE listed = 1;

CREATE TRIGGER threads_listed_on_update AFTER UPDATE OF tenant ON threads
WHEN NEW.version > 0 AND NEW.listed = 0
BEGIN
    UPDATE threads SET listed = 1 WHERE thread_id = NEW.thread_id;
END;

CREATE TRIGGER threads_listed_on_insert AFTER INSERT ON threads
WHEN NEW.version > 0 AND NEW.listed = 0
BEGIN
    UPDATE threads SET listed = 1 WHERE thread_id = NEW.thread_id;
END;
