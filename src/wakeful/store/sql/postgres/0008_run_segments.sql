-- wakeful PostgreSQL store, schema version 8: run segments (issue 27, path 6).
--
-- Applied after 0007, under the same rules (one transaction, advisory lock, @schema@ and
-- @channel@ placeholders). No function changes its signature: a process of the previous
-- version that is still running keeps working against this schema (the trigger fills the
-- new columns of what it commits).
--
-- Each checkpoint row records what ``runs`` needs without decoding its body: its run id,
-- status and graph (metadata.graph when a string), the version where its segment
-- (consecutive checkpoints of one run id) began when it was committed, and its ordinal
-- (1, 2, ... in commit order per thread; only differences are used). ``runs`` then walks the
-- history segment by segment through the primary key: two probes per segment.
--
-- The trigger reads the three fields from the body (``json``, not ``jsonb``: a state holding
-- "\u0000" must stay committable) and the thread's latest row through the primary key: one
-- parse of the checkpoint text and one index probe per committed checkpoint. Existing rows
-- are filled here, once, in one statement per column group.

ALTER TABLE @schema@.checkpoints
    ADD COLUMN run_id text,
    ADD COLUMN status text,
    ADD COLUMN graph text,
    ADD COLUMN seg_first bigint,
    ADD COLUMN ordinal bigint;

CREATE FUNCTION @schema@.checkpoint_segment() RETURNS trigger
LANGUAGE plpgsql AS $fn$
DECLARE
    prev_run text;
    prev_first bigint;
    prev_ordinal bigint;
BEGIN
    SELECT x.run_id, x.status,
           CASE WHEN json_typeof(x.metadata -> 'graph') = 'string'
                THEN x.metadata ->> 'graph' END
      INTO NEW.run_id, NEW.status, NEW.graph
      FROM json_to_record(NEW.body::json) AS x(run_id text, status text, metadata json);
    SELECT c.run_id, c.seg_first, c.ordinal INTO prev_run, prev_first, prev_ordinal
      FROM @schema@.checkpoints c
     WHERE c.thread_id = NEW.thread_id
     ORDER BY c.version DESC LIMIT 1;
    NEW.seg_first := CASE WHEN prev_run = NEW.run_id THEN prev_first ELSE NEW.version END;
    NEW.ordinal := COALESCE(prev_ordinal, 0) + 1;
    RETURN NEW;
END
$fn$;

CREATE TRIGGER checkpoints_segment BEFORE INSERT ON @schema@.checkpoints
    FOR EACH ROW EXECUTE FUNCTION @schema@.checkpoint_segment();

UPDATE @schema@.checkpoints c
   SET (run_id, status, graph) = (
       SELECT x.run_id, x.status,
              CASE WHEN json_typeof(x.metadata -> 'graph') = 'string'
                   THEN x.metadata ->> 'graph' END
         FROM json_to_record(c.body::json) AS x(run_id text, status text, metadata json));

UPDATE @schema@.checkpoints c
   SET seg_first = s.seg_first, ordinal = s.ordinal
  FROM (SELECT thread_id, version,
               row_number() OVER w AS ordinal,
               max(CASE WHEN starts THEN version END) OVER w AS seg_first
          FROM (SELECT thread_id, version,
                       run_id IS DISTINCT FROM lag(run_id) OVER (PARTITION BY thread_id
                                                                 ORDER BY version) AS starts
                  FROM @schema@.checkpoints) marked
        WINDOW w AS (PARTITION BY thread_id ORDER BY version)) s
 WHERE s.thread_id = c.thread_id AND s.version = c.version;
