-- Whole batch envelopes into request_events, structure flags stored as data
-- (pipeline.sinks.batches; replaces 007's request_event_batches for writes).
--
-- The gateway's {"events": [...]} messages as they arrived, one per line
-- (JSONEachRow), for envelopes whose bytes already state every event's
-- structure flags as ingest resolved them (pipeline.ingest.structure.resolve_onto
-- changed none of them); pipeline.sinks.batches.split_stored makes that choice,
-- every other event goes as a row (006) with its flags as columns. So no
-- structure rule is derived here: parse_ok and missing_fields are the event's
-- own fields, read with the contract's field default (SPEC §3, schemas/:
-- parse_ok absent with missing_fields present means "parsed"; missing_fields
-- absent is stored as []). missing_fields is read as the JSON text of the array
-- (input_format_json_read_arrays_as_strings), so an absent key (NULL) stays
-- apart from an empty list. The other keys of an event (expected_fields,
-- prompt_text, ...) are ignored. request_event_envelopes always reads empty.
--
-- 007's request_event_batches and its view stay defined (files are applied
-- idempotently at every start) but nothing inserts into them any more.
CREATE TABLE IF NOT EXISTS channel_health.request_event_envelopes
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
        parse_ok          Nullable(UInt8)
    ))
)
ENGINE = Null;

CREATE MATERIALIZED VIEW IF NOT EXISTS channel_health.request_event_envelopes_mv
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
    now64(3, 'UTC')                                AS ingested_at
FROM channel_health.request_event_envelopes
ARRAY JOIN events AS e;
