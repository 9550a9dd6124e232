-- request_events of an older version: add the EPHEMERAL epoch-ms columns the worker's
-- JSON-lines insert names, and the DEFAULTs that turn them into ts and ingested_at
-- (as 002 creates them now). Metadata only; no stored data changes. Idempotent.
ALTER TABLE channel_health.request_events ADD COLUMN IF NOT EXISTS ts_ms Int64 EPHEMERAL;
ALTER TABLE channel_health.request_events ADD COLUMN IF NOT EXISTS ingested_ms Int64 EPHEMERAL;
ALTER TABLE channel_health.request_events
    MODIFY COLUMN ts DateTime64(3, 'UTC') DEFAULT fromUnixTimestamp64Milli(ts_ms, 'UTC');
ALTER TABLE channel_health.request_events
    MODIFY COLUMN ingested_at DateTime64(3, 'UTC') DEFAULT fromUnixTimestamp64Milli(ingested_ms, 'UTC');
