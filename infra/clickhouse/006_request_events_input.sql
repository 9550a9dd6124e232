-- The writers' way into request_events: rows as the pipeline holds them, turned
-- into request_events rows by ClickHouse itself (pipeline.sinks.json_table).
--
-- The sink inserts JSONCompactEachRow rows [event, parse_ok, missing_fields]
-- into request_events_input: `event` is the gateway event as msgspec encodes
-- pipeline.contracts.RequestEvent (a JSON object; keys not listed here, such
-- as expected_fields, are ignored and absent keys are NULL), the other two are
-- what pipeline.sinks.rows.event_row stores. ingested_at is the time of the
-- insert (now64(3): one value per insert). The Null engine keeps nothing; the
-- materialized view writes each inserted block into request_events, in the
-- same insert (a failed view insert fails the insert).
-- ClickHouse parses and converts the values natively, so the writer spends no
-- Python per value (README "Throughput"). Analysts read request_events;
-- request_events_input always reads empty.
CREATE TABLE IF NOT EXISTS channel_health.request_events_input
(
    event Tuple(
        event_id          String,
        ts_ms             Int64,
        channel           String,
        route             String,
        status            String,
        latency_ms        Float64,
        gateway_id        Nullable(String),
        trace_id          Nullable(String),
        tier              Nullable(String),
        http_status       Nullable(UInt16),
        error_type        Nullable(String),
        ttft_ms           Nullable(Float64),
        max_stream_gap_ms Nullable(Float64),
        input_tokens      Nullable(UInt32),
        output_tokens     Nullable(UInt32),
        cost_usd          Nullable(Float64),
        quota_remaining   Nullable(Float32)
    ),
    parse_ok       Nullable(UInt8),
    missing_fields Array(String)
)
ENGINE = Null;

CREATE MATERIALIZED VIEW IF NOT EXISTS channel_health.request_events_input_mv
TO channel_health.request_events
AS SELECT
    event.event_id                                 AS event_id,
    fromUnixTimestamp64Milli(event.ts_ms, 'UTC')   AS ts,
    event.channel                                  AS channel,
    event.route                                    AS route,
    event.tier                                     AS tier,
    event.status                                   AS status,
    event.latency_ms                               AS latency_ms,
    event.ttft_ms                                  AS ttft_ms,
    event.max_stream_gap_ms                        AS max_stream_gap_ms,
    event.input_tokens                             AS input_tokens,
    event.output_tokens                            AS output_tokens,
    event.cost_usd                                 AS cost_usd,
    event.quota_remaining                          AS quota_remaining,
    event.http_status                              AS http_status,
    event.error_type                               AS error_type,
    event.gateway_id                               AS gateway_id,
    event.trace_id                                 AS trace_id,
    parse_ok                                       AS parse_ok,
    missing_fields                                 AS missing_fields,
    now64(3, 'UTC')                                AS ingested_at
FROM channel_health.request_events_input;
