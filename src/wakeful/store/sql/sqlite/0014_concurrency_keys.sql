-- wakeful SQLite store, schema version 14: concurrency keys (issue 39, decision 0035 "Slots").
--
-- dispatches.concurrency_key / concurrency_limit: at most the key's limit of its dispatches
-- are admitted (status pending or leased) at once; the others wait with status
-- 'waiting_key', outside the claim's indexes, holding their thread's run slot. The key's
-- limit is the latest enqueue's (concurrency_keys.lim). Holding is a function of the
-- status, as for the thread's slot: nothing counts beside the rows.
--
-- Admission is in triggers, so that every write that moves a keyed row (enqueue, the
-- thread's admission, requeue, settle, commit, cancel, quarantine) keeps the rule without
-- code in each path. Their WHEN clauses only match keyed rows: unkeyed work pays nothing
-- beyond evaluating them. The writer's transaction serialises them (one writer).
--   gate:    a keyed row that becomes pending from outside (inserted, queued -> pending,
--            quarantined -> pending) waits instead when its key is full or others of the
--            key wait already (they go first);
--   release: a keyed row that stops being pending or leased (done, awaiting, quarantined)
--            admits the key's waiting rows into the free slots, by priority then seq;
--   an insert also fills (its limit may have risen).
-- A row the key admits takes its fair tag then (below).

ALTER TABLE dispatches ADD COLUMN concurrency_key TEXT;
ALTER TABLE dispatches ADD COLUMN concurrency_limit INTEGER;

CREATE TABLE concurrency_keys (
    key TEXT PRIMARY KEY,
    lim INTEGER NOT NULL
) WITHOUT ROWID;

CREATE INDEX dispatches_key_held ON dispatches (concurrency_key)
    WHERE status IN ('pending', 'leased') AND concurrency_key IS NOT NULL;
CREATE INDEX dispatches_key_waiting ON dispatches (concurrency_key, priority DESC, seq)
    WHERE status = 'waiting_key';

-- Tenant fairness (issue 39.3, decision 0035 "Fairness"): dispatches.fair_tag, fixed when a
-- row enters pending from outside (an insert, the thread's admission, the key's admission:
-- wakeful.store.sqlite.fair), orders the claim among equal priorities. Existing rows keep 0.
-- The claim's pending indexes gain it; dispatches_fair answers a tenant's last tag.
ALTER TABLE dispatches ADD COLUMN fair_tag REAL NOT NULL DEFAULT 0;
DROP INDEX dispatches_due;
CREATE INDEX dispatches_due ON dispatches (priority DESC, fair_tag, seq)
    WHERE status = 'pending' AND pinned_version IS NULL;
DROP INDEX dispatches_pinned;
CREATE INDEX dispatches_pinned ON dispatches (pinned_version, priority DESC, fair_tag, seq)
    WHERE status = 'pending' AND pinned_version IS NOT NULL;
CREATE INDEX dispatches_fair ON dispatches (tenant, priority, fair_tag)
    WHERE status = 'pending';

CREATE TRIGGER dispatches_key_insert AFTER INSERT ON dispatches
WHEN NEW.concurrency_key IS NOT NULL
BEGIN
    INSERT INTO concurrency_keys (key, lim) VALUES (NEW.concurrency_key, NEW.concurrency_limit)
        ON CONFLICT (key) DO UPDATE SET lim = excluded.lim WHERE lim <> excluded.lim;
    UPDATE dispatches SET status = 'waiting_key'
     WHERE seq = NEW.seq AND status = 'pending'
       AND ((SELECT count(*) FROM dispatches INDEXED BY dispatches_key_held
              WHERE concurrency_key = NEW.concurrency_key AND status IN ('pending', 'leased')
                AND seq <> NEW.seq) >= NEW.concurrency_limit
            OR EXISTS (SELECT 1 FROM dispatches INDEXED BY dispatches_key_waiting
                        WHERE concurrency_key = NEW.concurrency_key
                          AND status = 'waiting_key' AND seq <> NEW.seq));
    UPDATE dispatches SET status = 'pending', updated_at = NEW.updated_at,
           fair_tag = (SELECT CASE WHEN l IS NULL THEN v ELSE max(v, l + 1) END FROM (SELECT
                 coalesce((SELECT h.fair_tag - 1 FROM dispatches AS h INDEXED BY dispatches_due
                            WHERE h.status = 'pending' AND h.pinned_version IS NULL
                              AND h.priority = dispatches.priority
                            ORDER BY h.priority DESC, h.fair_tag, h.seq LIMIT 1), 0) AS v,
                 (SELECT max(m.fair_tag) FROM dispatches AS m INDEXED BY dispatches_fair
                   WHERE m.status = 'pending' AND m.tenant IS dispatches.tenant
                     AND m.priority = dispatches.priority) AS l))
     WHERE seq IN (
        SELECT w.seq FROM dispatches AS w INDEXED BY dispatches_key_waiting
         WHERE w.concurrency_key = NEW.concurrency_key AND w.status = 'waiting_key'
         ORDER BY w.priority DESC, w.seq
         LIMIT max(0, NEW.concurrency_limit
                      - (SELECT count(*) FROM dispatches INDEXED BY dispatches_key_held
                          WHERE concurrency_key = NEW.concurrency_key
                            AND status IN ('pending', 'leased'))));
END;

CREATE TRIGGER dispatches_key_gate AFTER UPDATE OF status ON dispatches
WHEN NEW.concurrency_key IS NOT NULL AND NEW.status = 'pending'
     AND OLD.status NOT IN ('pending', 'leased', 'waiting_key')
BEGIN
    UPDATE dispatches SET status = 'waiting_key'
     WHERE seq = NEW.seq
       AND ((SELECT count(*) FROM dispatches INDEXED BY dispatches_key_held
              WHERE concurrency_key = NEW.concurrency_key AND status IN ('pending', 'leased')
                AND seq <> NEW.seq)
            >= coalesce((SELECT lim FROM concurrency_keys WHERE key = NEW.concurrency_key),
                        NEW.concurrency_limit)
            OR EXISTS (SELECT 1 FROM dispatches INDEXED BY dispatches_key_waiting
                        WHERE concurrency_key = NEW.concurrency_key
                          AND status = 'waiting_key'));
END;

CREATE TRIGGER dispatches_key_release AFTER UPDATE OF status ON dispatches
WHEN NEW.concurrency_key IS NOT NULL AND OLD.status IN ('pending', 'leased')
     AND NEW.status NOT IN ('pending', 'leased', 'waiting_key')
BEGIN
    UPDATE dispatches SET status = 'pending', updated_at = NEW.updated_at,
           fair_tag = (SELECT CASE WHEN l IS NULL THEN v ELSE max(v, l + 1) END FROM (SELECT
                 coalesce((SELECT h.fair_tag - 1 FROM dispatches AS h INDEXED BY dispatches_due
                            WHERE h.status = 'pending' AND h.pinned_version IS NULL
                              AND h.priority = dispatches.priority
                            ORDER BY h.priority DESC, h.fair_tag, h.seq LIMIT 1), 0) AS v,
                 (SELECT max(m.fair_tag) FROM dispatches AS m INDEXED BY dispatches_fair
                   WHERE m.status = 'pending' AND m.tenant IS dispatches.tenant
                     AND m.priority = dispatches.priority) AS l))
     WHERE seq IN (
        SELECT w.seq FROM dispatches AS w INDEXED BY dispatches_key_waiting
         WHERE w.concurrency_key = NEW.concurrency_key AND w.status = 'waiting_key'
         ORDER BY w.priority DESC, w.seq
         LIMIT max(0, coalesce((SELECT lim FROM concurrency_keys
                                 WHERE key = NEW.concurrency_key), NEW.concurrency_limit)
                      - (SELECT count(*) FROM dispatches INDEXED BY dispatches_key_held
                          WHERE concurrency_key = NEW.concurrency_key
                            AND status IN ('pending', 'leased'))));
END;

