-- Every published channel-health verdict (SPEC §3), one row per (channel, seq).
-- Re-inserting the same verdict (at-least-once) has the same sorting key and
-- collapses on merge; read with FINAL for exact counts before merges.
-- ts is part of the key so that a worker that restarts its seq numbering does
-- not replace older history with a different verdict of the same seq.
-- metrics: the verdict's metrics object as a JSON string (keys sorted);
-- query it with JSONExtractFloat(metrics, 'p95_ratio') etc.
CREATE TABLE IF NOT EXISTS channel_health.channel_verdicts
(
    channel        LowCardinality(String),
    route          LowCardinality(String),
    state          LowCardinality(String),
    weight         Float64,
    reasons        Array(String),
    metrics        String,
    ts             DateTime64(3, 'UTC'),
    seq            UInt64,
    schema_version UInt16,
    ingested_at    DateTime64(3, 'UTC')
)
ENGINE = ReplacingMergeTree(ingested_at)
PARTITION BY toYYYYMM(ts)
ORDER BY (channel, seq, ts);
