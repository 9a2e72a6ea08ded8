-- wakeful SQLite schema, version 7: branches of a thread's history (issue 37, time travel;
-- decision 0036).
--
-- A commit with ``branch_from`` continues from an earlier checkpoint. Nothing is removed:
-- the abandoned checkpoints and messages stay; the thread's head moves to a new branch,
-- one row here. Messages stay append-only (messages.pos is the append order);
-- ``threads.message_offset`` is what turns the stored count into the head branch's view
-- count (view = stored + offset), so a read of the snapshot stays one row. ``first_pos``:
-- checkpoints.pos of the branch's first checkpoint (a checkpoint's branch is the last
-- branch whose first_pos is at or below its pos).

CREATE TABLE branches (
    thread_id TEXT NOT NULL,
    number INTEGER NOT NULL,
    parent INTEGER NOT NULL,
    fork_point TEXT NOT NULL,
    old_head TEXT,
    checkpoint_id TEXT NOT NULL,
    messages INTEGER NOT NULL,
    message_start INTEGER NOT NULL,
    first_pos INTEGER NOT NULL,
    at INTEGER NOT NULL,
    PRIMARY KEY (thread_id, number)
) WITHOUT ROWID;

ALTER TABLE threads ADD COLUMN branch INTEGER NOT NULL DEFAULT 0;
ALTER TABLE threads ADD COLUMN message_offset INTEGER NOT NULL DEFAULT 0;
