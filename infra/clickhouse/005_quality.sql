-- Quality-model data (filled by the quality worker and the data team's
-- `channel-health quality import-labels`).
--
-- quality_scores: one embedding-based score per sampled response and model
-- version. response_text / prompt_text are truncated by the writer
-- (pipeline.sinks.rows.quality_row). Retention 30 days after scoring.
CREATE TABLE IF NOT EXISTS channel_health.quality_scores
(
    event_id      String,
    ts            DateTime64(3, 'UTC'),
    channel       LowCardinality(String),
    route         LowCardinality(String),
    score         Float32,
    model_version LowCardinality(String),
    response_text String,
    prompt_text   String,
    scored_at     DateTime64(3, 'UTC')
)
ENGINE = ReplacingMergeTree(scored_at)
PARTITION BY toYYYYMMDD(ts)
ORDER BY (channel, ts, event_id, model_version)
TTL toDateTime(scored_at) + INTERVAL 30 DAY DELETE;

-- quality_labels: labelled (prompt, response) pairs for training the quality
-- model. label: the class or rating given to the response (the scale is the
-- quality model's, see models/ and its model card). source: where the label
-- came from (e.g. 'llm-answers-judged', 'oncall'). Re-importing a label_id replaces
-- the row with the latest imported_at.
CREATE TABLE IF NOT EXISTS channel_health.quality_labels
(
    label_id    String,
    prompt      String,
    response    String,
    label       UInt8,
    source      LowCardinality(String),
    imported_at DateTime64(3, 'UTC')
)
ENGINE = ReplacingMergeTree(imported_at)
ORDER BY label_id;
