-- Labelled incidents and clean periods per channel (issue #22): the ground
-- truth of `channel-health backtest` and `channel-health tune`.
-- kind: latency | errors | hollow | stream_stall | quota_drain | quality_drift
--       | other, or clean (a period that must produce no non-healthy verdict).
-- source: manual (`channel-health incident mark`) | drill (`channel-health drill`).
-- [from_ts, to_ts): the span of the fault (or of the clean period), UTC.
-- Re-inserting the same incident_id collapses on merge (latest created_ts
-- wins); read with FINAL for exact rows before merges.
CREATE TABLE IF NOT EXISTS channel_health.channel_incidents
(
    incident_id String,
    channel     String,
    route       String,
    kind        LowCardinality(String),
    from_ts     DateTime64(3, 'UTC'),
    to_ts       DateTime64(3, 'UTC'),
    source      LowCardinality(String),
    note        String,
    created_ts  DateTime64(3, 'UTC')
)
ENGINE = ReplacingMergeTree(created_ts)
ORDER BY (channel, from_ts, incident_id);
