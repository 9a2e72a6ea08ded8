-- wakeful SQLite schema, version 5: run segments (issue 27, path 6).
--
-- Each checkpoint row records what ``runs`` needs without decoding its body: its run id,
-- status and graph (metadata.graph when a string), the position where its segment
-- (consecutive checkpoints of one run id) began when it was committed, and its ordinal
-- (1, 2, ... in commit order per thread; only differences are used). ``runs`` then walks
-- the history segment by segment through the primary key: two probes per segment.
-- Existing rows are filled from their bodies here.

ALTER TABLE checkpoints ADD COLUMN run_id TEXT;
ALTER TABLE checkpoints ADD COLUMN status TEXT;
ALTER TABLE checkpoints ADD COLUMN graph TEXT;
ALTER TABLE checkpoints ADD COLUMN seg_first INTEGER;
ALTER TABLE checkpoints ADD COLUMN ordinal INTEGER;

UPDATE checkpoints SET
    run_id = json_extract(body, '$.run_id'),
    status = json_extract(body, '$.status'),
    graph = CASE WHEN json_type(body, '$.metadata.graph') = 'text'
                 THEN json_extract(body, '$.metadata.graph') END;

UPDATE checkpoints SET seg_first = s.seg_first, ordinal = s.ordinal
FROM (
    SELECT thread_id, pos,
           row_number() OVER w AS ordinal,
           max(CASE WHEN starts THEN pos END) OVER w AS seg_first
      FROM (SELECT thread_id, pos,
                   run_id IS NOT lag(run_id) OVER (PARTITION BY thread_id ORDER BY pos) AS starts
              FROM checkpoints)
    WINDOW w AS (PARTITION BY thread_id ORDER BY pos)
) AS s
WHERE checkpoints.thread_id = s.thread_id AND checkpoints.pos = s.pos;
