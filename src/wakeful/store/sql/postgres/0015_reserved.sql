-- Placeholder for version 15, reserved for another branch (issue 39, concurrency keys):
-- delete this file when that branch's 0015 is merged. It changes nothing.
SELECT 1;
