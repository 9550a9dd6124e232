-- One row per gateway request event (SPEC §3), written at-least-once by
-- pipeline.sinks.clickhouse. A redelivered event is byte-identical, so it has the
-- same (channel, ts, event_id) sorting key and ReplacingMergeTree collapses the
-- copies on merge; read with FINAL (or GROUP BY event_id) for exact counts
-- before merges have run.
--
-- Units: ts / ingested_at UTC with millisecond precision; *_ms milliseconds;
-- cost_usd US dollars; quota_remaining share 0..1.
-- parse_ok: 1 = the response structure was checked and parsed, 0 = checked and
-- not parseable, NULL = not checked (no expected fields). missing_fields: the
-- expected fields the response lacked (empty when none or unchecked).
--
-- Retention: 30 days after ingestion. The TTL uses ingested_at (wall clock),
-- not ts (event time), so replays of old traffic are not deleted on the first
-- background merge.
CREATE TABLE IF NOT EXISTS channel_health.request_events
(
    event_id          String,
    ts                DateTime64(3, 'UTC'),
    channel           LowCardinality(String),
    route             LowCardinality(String),
    tier              LowCardinality(Nullable(String)),
    status            LowCardinality(String),
    latency_ms        Float64,
    ttft_ms           Nullable(Float64),
    max_stream_gap_ms Nullable(Float64),
    input_tokens      Nullable(UInt32),
    output_tokens     Nullable(UInt32),
    cost_usd          Nullable(Float64),
    quota_remaining   Nullable(Float32),
    http_status       Nullable(UInt16),
    error_type        Nullable(String),
    gateway_id        Nullable(String),
    trace_id          Nullable(String),
    parse_ok          Nullable(UInt8),
    missing_fields    Array(String),
    ingested_at       DateTime64(3, 'UTC')
)
ENGINE = ReplacingMergeTree(ingested_at)
PARTITION BY toYYYYMMDD(ts)
ORDER BY (channel, ts, event_id)
TTL toDateTime(ingested_at) + INTERVAL 30 DAY DELETE;
