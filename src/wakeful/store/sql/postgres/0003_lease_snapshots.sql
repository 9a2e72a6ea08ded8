-- wakeful PostgreSQL store, schema version 3: a lease carries its thread's snapshot.
--
-- Applied after 0002, under the same rules (one transaction, advisory lock, @schema@ and
-- @channel@ placeholders).
--
-- claim_next_read() runs claim_next() and then reads each leased thread (its row, latest
-- checkpoint and pending writes) in the same transaction, after the grants: a claimant no
-- longer needs a read of its own, one round trip less per dispatch. The read is a statement
-- of its own inside the function, so (READ COMMITTED) it sees every commit made before the
-- grant; after the grant no other holder can commit to the thread.

CREATE FUNCTION @schema@.claim_next_read(p_holder text, p_ttl double precision,
                                         p_limit integer)
RETURNS TABLE (o_dispatch @schema@.dispatches, o_version bigint, o_tenant text,
               o_message_count bigint, o_next_seq bigint, o_event_floor bigint,
               o_checkpoint text, o_writes text[])
LANGUAGE plpgsql AS $fn$
DECLARE
    d @schema@.dispatches;
BEGIN
    -- claim_next() runs to the end first (all grants), then each thread is read by its key
    FOR d IN SELECT * FROM @schema@.claim_next(p_holder, p_ttl, p_limit) LOOP
        o_dispatch := d;
        SELECT t.version, t.tenant, t.message_count, t.next_seq, t.event_floor, c.body,
               ARRAY(SELECT w.body FROM @schema@.writes w WHERE w.thread_id = t.thread_id
                      ORDER BY w.version, w.idx)
          INTO o_version, o_tenant, o_message_count, o_next_seq, o_event_floor,
               o_checkpoint, o_writes
          FROM @schema@.threads t
          LEFT JOIN @schema@.checkpoints c
            ON c.thread_id = t.thread_id AND c.checkpoint_id = t.latest_checkpoint
         WHERE t.thread_id = d.thread_id;
        RETURN NEXT;
    END LOOP;
END
$fn$;
