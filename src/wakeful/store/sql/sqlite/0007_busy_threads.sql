-- wakeful SQLite schema, version 7: busy threads (issue 36, decision 0035).
--
-- Each thread has one run slot. A dispatch holds it while it is pending, leased, awaiting
-- or quarantined (any kind: a cancel holds it too); a start or message dispatch enqueued
-- while it is held waits with status 'queued', outside every claim index, behind
-- queued_behind. When a holder stops holding (settled done, retired by a cancel, purged:
-- purge marks the row done first), the trigger below admits the thread's first queued
-- dispatch in the same transaction, if nothing else holds the slot. A 'coalesce' head
-- takes the consecutive 'coalesce' dispatches of its kind queued behind it: they are
-- settled done naming it (answered_by) and it lists them (coalesced, a JSON array).
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

-- Admission, in three steps over the thread's 'queued' range (dispatches_by_thread_status),
-- when the thread has one (the WHEN clause: a settle on a thread nothing waits for costs one
-- index probe):
-- 1. the head (first queued) gets its coalesced list, which marks it chosen;
-- 2. the dispatches on that list are settled done, naming the head;
-- 3. the head becomes pending.
-- Steps 2 and 3 find the head as the first queued row again, chosen by its list (a queued
-- row has none otherwise). A row that
-- leaves 'queued' for 'done' in step 2 does not start this trigger (it held no slot).
CREATE TRIGGER dispatches_admit AFTER UPDATE OF status ON dispatches
WHEN OLD.status IN ('pending', 'leased', 'awaiting', 'quarantined')
 AND NEW.status NOT IN ('pending', 'leased', 'awaiting', 'quarantined')
 AND EXISTS (SELECT 1 FROM dispatches AS w INDEXED BY dispatches_by_thread_status
              WHERE w.thread_id = NEW.thread_id AND w.status = 'queued')
BEGIN
    UPDATE dispatches
       SET coalesced = CASE WHEN dispatches.if_busy <> 'coalesce' THEN '[]' ELSE (
               SELECT json_group_array(f.dispatch_id) FROM (
                   SELECT q.dispatch_id FROM dispatches AS q
                    WHERE q.thread_id = dispatches.thread_id AND q.status = 'queued'
                      AND q.seq > dispatches.seq
                      AND q.seq < coalesce((
                          SELECT r.seq FROM dispatches AS r
                           WHERE r.thread_id = dispatches.thread_id AND r.status = 'queued'
                             AND r.seq > dispatches.seq
                             AND (r.if_busy <> 'coalesce' OR r.kind <> dispatches.kind)
                           ORDER BY r.seq LIMIT 1), 9223372036854775807)
                    ORDER BY q.seq) AS f) END
     WHERE seq = (SELECT x.seq FROM dispatches AS x
                   WHERE x.thread_id = NEW.thread_id AND x.status = 'queued'
                   ORDER BY x.seq LIMIT 1)
       AND NOT EXISTS (SELECT 1 FROM dispatches AS y
                        WHERE y.thread_id = NEW.thread_id
                          AND y.status IN ('pending', 'leased', 'awaiting', 'quarantined'));
    UPDATE dispatches
       SET status = 'done', answered_by = (
               SELECT h.dispatch_id FROM dispatches AS h
                WHERE h.seq = (SELECT x.seq FROM dispatches AS x
                                WHERE x.thread_id = NEW.thread_id AND x.status = 'queued'
                                ORDER BY x.seq LIMIT 1)),
           updated_at = NEW.updated_at
     WHERE dispatch_id IN (
               SELECT j.value FROM dispatches AS h, json_each(h.coalesced) AS j
                WHERE h.seq = (SELECT x.seq FROM dispatches AS x
                                WHERE x.thread_id = NEW.thread_id AND x.status = 'queued'
                                ORDER BY x.seq LIMIT 1)
                  AND h.coalesced IS NOT NULL);
    UPDATE dispatches SET status = 'pending', updated_at = NEW.updated_at
     WHERE seq = (SELECT x.seq FROM dispatches AS x
                   WHERE x.thread_id = NEW.thread_id AND x.status = 'queued'
                   ORDER BY x.seq LIMIT 1)
       AND coalesced IS NOT NULL;
END;
