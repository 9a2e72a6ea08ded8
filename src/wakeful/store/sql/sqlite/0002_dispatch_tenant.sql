-- wakeful SQLite schema, version 2: the tenant a dispatch was submitted for.
--
-- Dispatch.tenant is stored in its own column (NULL: the work names no tenant). Enqueueing
-- a dispatch of a tenant, claiming for a tenant and leasing such a dispatch fix the thread's
-- tenant (threads.tenant) when nothing fixed it yet, in the same transaction; a thread row
-- with version 0 and a tenant is a thread bound before its first commit. Dispatches stored
-- before this version keep tenant NULL (their payload may still name one; see
-- wakeful.fleet.client.tenant_of).
ALTER TABLE dispatches ADD COLUMN tenant TEXT;
