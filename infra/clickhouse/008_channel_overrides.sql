-- Audit of operators' manual overrides (SPEC §4, §7 `channel-health override`):
-- one row per change: action `set`, `clear` (with who cleared it and why) or
-- `expire` (written by the worker when the TTL passed, wall time).
-- `override_key` is `channel:<name>` or `route:<name>`; `kind` is open |
-- healthy | weight | freeze. Every worker reads every override and writes the
-- same rows: the sorting key makes them collapse on merge (read with FINAL).
CREATE TABLE IF NOT EXISTS channel_health.channel_overrides
(
    override_key  String,
    action        LowCardinality(String),
    kind          LowCardinality(String),
    channel       String,
    route         String,
    weight        Nullable(Float64),
    by            String,
    reason        String,
    set_ts        DateTime64(3, 'UTC'),
    expires_ts    DateTime64(3, 'UTC'),
    at            DateTime64(3, 'UTC'),
    ingested_at   DateTime64(3, 'UTC')
)
ENGINE = ReplacingMergeTree(ingested_at)
ORDER BY (override_key, set_ts, action);
