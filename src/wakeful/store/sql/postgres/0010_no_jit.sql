-- wakeful PostgreSQL store, schema version 10: the claim, listing and counting functions
-- never JIT-compile their queries (issue 27, second round).
--
-- Applied after 0010, under the same rules (one transaction, advisory lock, @schema@ and
-- @channel@ placeholders). Only the functions' settings change, not their signatures or
-- their SQL: a process of the previous version keeps working, and gets the fix too (it calls
-- the same functions).
--
-- PostgreSQL JIT-compiles a statement whose estimated total cost exceeds jit_above_cost
-- (100,000 by default; inlining and optimisation above 500,000). claim_next's two cursors
-- have no LIMIT (the loop reads candidates until it has granted enough), so their cost is
-- that of reading every pending row: with statistics, 886,000 at 100,000 pending
-- dispatches. Every claim then compiled its cursor's expressions with LLVM before reading
-- its first candidate: 142 ms of a 150 ms claim, where 10,000 pending (cost 88,000) needed
-- none (decision 0027, "Second round"). The claim reads a handful of rows: compilation never
-- pays for itself there. The listings and the count are off for the same reason: their
-- cost is bounded by their LIMIT today, but a plan that falls back to a disabled node (the
-- functions turn sequential scans, bitmap scans and sorts off) carries a cost of 10^10 and
-- would compile at every call.

ALTER FUNCTION @schema@.claim_next(text, double precision, integer) SET jit = off;
ALTER FUNCTION @schema@.claim_next_read(text, double precision, integer) SET jit = off;
ALTER FUNCTION @schema@.list_dispatches(bigint, text, text, text, integer) SET jit = off;
ALTER FUNCTION @schema@.list_threads(text, text, integer) SET jit = off;
ALTER FUNCTION @schema@.queue_depths(integer) SET jit = off;
