-- wakeful SQLite schema, version 8: busy threads (issue 36, decision 0035).
--
-- Each thread has one run slot. A dispatch holds it while it is pending, leased, awaiting
-- or quarantined (any kind: a cancel holds it too); a start or message dispatch enqueued
-- while it is held waits with status 'queued', outside every claim index, behind
-- queued_behind. When a holder stops holding (settled done, alone or by a commit; purged)
-- the writer admits the thread's first queued dispatch in the same transaction, if nothing
-- else holds the slot (wakeful.store.sqlite.admission: every such write is in that module's
-- caller, so no trigger is needed, and a settle on a thread nothing waits for costs one
-- index probe). A 'coalesce' head takes the consecutive 'coalesce' dispatches of its kind
-- queued behind it: they are settled done naming it (answered_by) and it lists them
-- (coalesced, a JSON array).
--
-- Migration: a pending start or message that has another run slot holder of its thread
-- ahead of it (an earlier pending row, or a leased, awaiting or quarantined one) becomes
-- queued. A process of schema version 6 would lease nothing queued but would also admit
-- nothing: apply this version with the fleet stopped (docs/operations.md).

ALTER TABLE dispatches ADD COLUMN if_busy TEXT NOT NULL DEFAULT 'enqueue';
ALTER TABLE dispatches ADD COLUMN queued_behind TEXT;
ALTER TABLE dispatches ADD COLUMN coalesced TEXT;
ALTER TABLE dispatches ADD COLUMN answered_by TEXT;

UPDATE dispatches AS d
   SET status = 'queued',
       queued_behind = (SELECT h.dispatch_id FROM dispatches AS h
                         WHERE h.thread_id = d.thread_id AND h.seq < d.seq
                           AND h.status IN ('queued', 'pending', 'leased', 'awaiting',
                                            'quarantined')
                         ORDER BY h.seq DESC LIMIT 1)
 WHERE d.status = 'pending' AND d.kind IN ('start', 'message')
   AND EXISTS (SELECT 1 FROM dispatches AS h
                WHERE h.thread_id = d.thread_id AND h.seq <> d.seq
                  AND (h.status IN ('leased', 'awaiting', 'quarantined')
                       OR (h.status = 'pending' AND h.seq < d.seq)));
