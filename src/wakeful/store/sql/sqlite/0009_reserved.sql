-- Placeholder for version 9, reserved for another branch (issue 39, concurrency keys):
-- delete this file when that branch's 0009 is merged. It changes nothing.
SELECT 1;
