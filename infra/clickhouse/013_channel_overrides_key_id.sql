-- Issue #30 item 4: the audit of operators' overrides names the key that
-- signed the record (`CHANNEL_HEALTH_CONTROL_KEYS`, one key id per operator),
-- verified by the worker; `by` stays a free-text display name. Empty for a
-- record accepted unsigned (no keys configured) and for rows written before
-- this column existed. Idempotent: ADD COLUMN IF NOT EXISTS.
ALTER TABLE channel_health.channel_overrides ADD COLUMN IF NOT EXISTS key_id String DEFAULT '';
