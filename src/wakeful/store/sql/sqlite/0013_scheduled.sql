-- wakeful SQLite store, schema version 13: the 'scheduled' status (issue 38, decision 0035).
--
-- A dispatch whose available_at is later than when it was stored or settled (a delayed run,
-- a retry's backoff, a durable sleep, a debounced submission) waits 'scheduled', outside
-- every claim index, in an index of its own by due time. The claim's due step moves the
-- due ones on (through admission: 'pending' or 'queued') before it reads its candidates,
-- so the claim walks no delayed row. A scheduled dispatch that was leased before (a retry,
-- a sleep) keeps its thread's run slot; one never leased (a delayed run) holds none.
-- debounce_key: the (thread, key) a debounced submission replaces while it is scheduled.
--
-- Existing pending rows with a later available_at become scheduled (one whose time has
-- come is moved on by the next claim); a thread whose slot only a delayed run held admits
-- its first queued run. Apply with every process of the previous release
-- stopped: its claim would not move scheduled work on (docs/operations.md).

ALTER TABLE dispatches ADD COLUMN debounce_key TEXT;

UPDATE dispatches SET status = 'scheduled'
 WHERE status = 'pending' AND available_at > updated_at;

-- A delayed run that held its thread's slot while pending holds it no longer: the first
-- run queued behind it is admitted now, as a settle would (without merging coalesced ones).
UPDATE dispatches SET status = 'pending'
 WHERE seq IN (SELECT min(q.seq) FROM dispatches q
                WHERE q.status = 'queued'
                  AND NOT EXISTS (SELECT 1 FROM dispatches h
                                   WHERE h.thread_id = q.thread_id
                                     AND (h.status IN ('pending', 'leased', 'awaiting',
                                                       'quarantined')
                                          OR (h.status = 'scheduled' AND h.attempts > 0)))
                GROUP BY q.thread_id);

CREATE INDEX dispatches_scheduled ON dispatches (available_at, seq) WHERE status = 'scheduled';
CREATE UNIQUE INDEX dispatches_debounced ON dispatches (thread_id, debounce_key)
    WHERE status = 'scheduled' AND debounce_key IS NOT NULL;
