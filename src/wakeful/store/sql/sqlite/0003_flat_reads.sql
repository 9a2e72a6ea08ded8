-- wakeful SQLite schema, version 3: every read and claim path answers from an index range
-- proportional to its page (issue 27).
--
-- 1. claim_next walks two ranges instead of every open dispatch: pending work in claim
--    order (dispatches_due) and the leases whose claim lapsed (dispatches_lapsing, by
--    lease_expires). Before, the runnable index held pending and leased rows together, so
--    every claim stepped over each live lease under the write lock.
-- 2. dispatches.lease_expires (internal): when the lease stops holding its thread. The
--    claim's expiry while the claim granted with the lease is current (renewals included),
--    0 once that claim ended (release, takeover, cancel, delete). Triggers on threads keep
--    it, so every write that moves a claim moves its lease.
-- 3. dispatches.owner (internal): the tenant of the dispatch's thread (threads.tenant), kept
--    by triggers, so that a tenant's listing is a range of dispatches_by_owner.
-- 4. dispatches_by_thread_status: one thread's dispatches of one status in enqueue order
--    (the status index filtered the thread afterwards).
-- 5. threads_listed: list_threads walks only threads with a commit.

ALTER TABLE dispatches ADD COLUMN lease_expires INTEGER;
ALTER TABLE dispatches ADD COLUMN owner TEXT;

UPDATE dispatches
   SET lease_expires = coalesce((SELECT t.expires_at FROM threads AS t
                                  WHERE t.thread_id = dispatches.thread_id
                                    AND t.token = dispatches.token), 0)
 WHERE status = 'leased';

UPDATE dispatches
   SET owner = (SELECT t.tenant FROM threads AS t WHERE t.thread_id = dispatches.thread_id);

-- Work queued before version 2 on a thread that nothing bound yet: the HTTP layer treats the
-- thread as the tenant its first start, resume or message payload names.
UPDATE dispatches
   SET owner = (SELECT CASE WHEN json_type(x.payload, '$.tenant') = 'text'
                            THEN json_extract(x.payload, '$.tenant') END
                  FROM dispatches AS x
                 WHERE x.thread_id = dispatches.thread_id
                   AND x.kind IN ('start', 'resume', 'message')
                   AND json_type(x.payload) = 'object'
                   AND (json_type(x.payload, '$.tenant') IS NOT NULL OR x.kind = 'message')
                 ORDER BY x.seq LIMIT 1)
 WHERE owner IS NULL
   AND NOT EXISTS (SELECT 1 FROM threads AS t WHERE t.thread_id = dispatches.thread_id
                      AND (t.version > 0 OR t.tenant IS NOT NULL));

DROP INDEX dispatches_runnable;
CREATE INDEX dispatches_due ON dispatches (priority DESC, seq) WHERE status = 'pending';
CREATE INDEX dispatches_lapsing ON dispatches (lease_expires) WHERE status = 'leased';
CREATE INDEX dispatches_by_thread_status ON dispatches (thread_id, status, seq);
CREATE INDEX dispatches_by_owner ON dispatches (owner, seq) WHERE owner IS NOT NULL;
CREATE INDEX dispatches_by_owner_status ON dispatches (owner, status, seq)
    WHERE owner IS NOT NULL;
CREATE INDEX threads_listed ON threads (thread_id) WHERE version > 0;

-- A claim that changes (renewed, ended, replaced) carries the lease granted with it along.
CREATE TRIGGER leases_follow_claims AFTER UPDATE OF token, expires_at ON threads
WHEN OLD.token IS NOT NULL
BEGIN
    UPDATE dispatches
       SET lease_expires = CASE WHEN NEW.token IS OLD.token THEN NEW.expires_at ELSE 0 END
     WHERE thread_id = OLD.thread_id AND status = 'leased' AND token = OLD.token;
END;

-- Every insert (enqueue, cancel, the relay) takes the tenant its thread has now.
CREATE TRIGGER dispatches_owner AFTER INSERT ON dispatches
WHEN NEW.owner IS NULL
     AND EXISTS (SELECT 1 FROM threads WHERE thread_id = NEW.thread_id AND tenant IS NOT NULL)
BEGIN
    UPDATE dispatches SET owner = (SELECT tenant FROM threads WHERE thread_id = NEW.thread_id)
     WHERE seq = NEW.seq;
END;

-- A thread's tenant is fixed once (by an insert of its row or an update) and cleared by
-- delete_thread, which removes the row and with it the claim of any lease on it.
CREATE TRIGGER threads_tenant_inserted AFTER INSERT ON threads
WHEN NEW.tenant IS NOT NULL
BEGIN
    UPDATE dispatches SET owner = NEW.tenant WHERE thread_id = NEW.thread_id;
END;

CREATE TRIGGER threads_tenant_changed AFTER UPDATE OF tenant ON threads
WHEN OLD.tenant IS NOT NEW.tenant
BEGIN
    UPDATE dispatches SET owner = NEW.tenant WHERE thread_id = NEW.thread_id;
END;

CREATE TRIGGER threads_deleted AFTER DELETE ON threads
BEGIN
    UPDATE dispatches SET owner = NULL WHERE thread_id = OLD.thread_id AND owner IS NOT NULL;
    UPDATE dispatches SET lease_expires = 0 WHERE thread_id = OLD.thread_id AND status = 'leased';
END;
