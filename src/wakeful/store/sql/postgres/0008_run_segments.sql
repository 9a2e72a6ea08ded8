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
-- The trigger reads the three fields from the body as ``json``. PostgreSQL's JSON functions
-- refuse a document holding the escape "\u0000" anywhere (which a committed state may hold),
-- so the text is read with every "\u0000" replaced by "\u0001" first: still valid JSON
-- (also after an escaped backslash), and the run id and status are ids that hold neither.
-- Per committed checkpoint that is a few passes over its text and one primary-key probe for
-- the thread's latest row. Existing rows
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
    body json;
    meta json;
BEGIN
    body := replace(NEW.body, '\u0000', '\u0001')::json;
    meta := body -> 'metadata';
    NEW.run_id := body ->> 'run_id';
    NEW.status := body ->> 'status';
    NEW.graph := CASE WHEN json_typeof(meta -> 'graph') = 'string' THEN meta ->> 'graph' END;
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
   SET run_id = x.body ->> 'run_id', status = x.body ->> 'status',
       graph = CASE WHEN json_typeof(x.body -> 'metadata' -> 'graph') = 'string'
                    THEN x.body -> 'metadata' ->> 'graph' END
  FROM (SELECT thread_id, version, replace(body, '\u0000', '\u0001')::json AS body
          FROM @schema@.checkpoints) x
 WHERE x.thread_id = c.thread_id AND x.version = c.version;

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
