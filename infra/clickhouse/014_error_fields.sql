-- Issue #32 / SPEC §3, §4.1: the error fields of an event and its error class.
--
-- request_events gains error_message (the provider's message, at most 512
-- characters as ingest cut it), retry_after_s (the provider's Retry-After,
-- seconds), account (the credential / quota pool behind the channel) and
-- error_class: the class ingest resolved for a failed event
-- (pipeline.ingest.error_class: caller, credential, quota_exhausted,
-- rate_limited, transient), '' for any other event and for rows written before
-- this column existed. Idempotent: ADD COLUMN IF NOT EXISTS.
--
-- The writers' input tables of 006 and 011 list the event's keys in a Tuple,
-- so they cannot carry the new keys; their _v2 twins below do (the sinks write
-- only these; 006's and 011's tables and views stay defined and unused, as 007's).
-- Envelopes (pipeline.sinks.batches) carry the classes beside the gateway's
-- bytes as a last top-level key error_classes, one per event in order
-- (pipeline.ingest.envelope.with_error_classes); an envelope without any
-- failed event comes as it arrived, without the key: [] padded with NULL, ''.
ALTER TABLE channel_health.request_events
    ADD COLUMN IF NOT EXISTS error_message Nullable(String),
    ADD COLUMN IF NOT EXISTS retry_after_s Nullable(Float64),
    ADD COLUMN IF NOT EXISTS account LowCardinality(Nullable(String)),
    ADD COLUMN IF NOT EXISTS error_class LowCardinality(String) DEFAULT '';

CREATE TABLE IF NOT EXISTS channel_health.request_events_input_v2
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
        quota_remaining   Nullable(Float32),
        error_message     Nullable(String),
        retry_after_s     Nullable(Float64),
        account           Nullable(String),
        error_class       Nullable(String)
    ),
    parse_ok       Nullable(UInt8),
    missing_fields Array(String)
)
ENGINE = Null;

CREATE MATERIALIZED VIEW IF NOT EXISTS channel_health.request_events_input_v2_mv
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
    now64(3, 'UTC')                                AS ingested_at,
    event.error_message                            AS error_message,
    event.retry_after_s                            AS retry_after_s,
    event.account                                  AS account,
    ifNull(event.error_class, '')                  AS error_class
FROM channel_health.request_events_input_v2;

CREATE TABLE IF NOT EXISTS channel_health.request_event_envelopes_v2
(
    events Array(Tuple(
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
        quota_remaining   Nullable(Float32),
        missing_fields    Nullable(String),
        parse_ok          Nullable(UInt8),
        error_message     Nullable(String),
        retry_after_s     Nullable(Float64),
        account           Nullable(String)
    )),
    error_classes Array(Nullable(String))
)
ENGINE = Null;

CREATE MATERIALIZED VIEW IF NOT EXISTS channel_health.request_event_envelopes_v2_mv
TO channel_health.request_events
AS SELECT
    e.event_id                                     AS event_id,
    fromUnixTimestamp64Milli(e.ts_ms, 'UTC')       AS ts,
    e.channel                                      AS channel,
    e.route                                        AS route,
    e.tier                                         AS tier,
    e.status                                       AS status,
    e.latency_ms                                   AS latency_ms,
    e.ttft_ms                                      AS ttft_ms,
    e.max_stream_gap_ms                            AS max_stream_gap_ms,
    e.input_tokens                                 AS input_tokens,
    e.output_tokens                                AS output_tokens,
    e.cost_usd                                     AS cost_usd,
    e.quota_remaining                              AS quota_remaining,
    e.http_status                                  AS http_status,
    e.error_type                                   AS error_type,
    e.gateway_id                                   AS gateway_id,
    e.trace_id                                     AS trace_id,
    if(e.missing_fields IS NOT NULL, ifNull(e.parse_ok, 1), e.parse_ok)  AS parse_ok,
    if(e.missing_fields IS NOT NULL,
       JSONExtract(assumeNotNull(e.missing_fields), 'Array(String)'), [])  AS missing_fields,
    now64(3, 'UTC')                                AS ingested_at,
    e.error_message                                AS error_message,
    e.retry_after_s                                AS retry_after_s,
    e.account                                      AS account,
    ifNull(cls, '')                                AS error_class
FROM channel_health.request_event_envelopes_v2
ARRAY JOIN events AS e, arrayResize(error_classes, length(events)) AS cls;
