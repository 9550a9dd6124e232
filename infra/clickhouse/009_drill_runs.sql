-- One row per `channel-health drill` run (issue #22): which fault on which
-- channel, in shadow or on a live deployment, and the expected vs actual
-- transition timeline. Times are event time (UTC). expected / actual /
-- comparison: JSON strings (see pipeline/tools/drill/timeline.py), query them
-- with JSONExtract*. passed: every expected transition happened within its
-- tolerance. The run's incident (the fault window) goes to channel_incidents.
CREATE TABLE IF NOT EXISTS channel_health.drill_runs
(
    run_id       String,
    channel      String,
    route        String,
    kind         LowCardinality(String),
    shadow       UInt8,
    topic_prefix String,
    started_ts   DateTime64(3, 'UTC'),
    fault_from_ts DateTime64(3, 'UTC'),
    fault_to_ts  DateTime64(3, 'UTC'),
    ended_ts     DateTime64(3, 'UTC'),
    expected     String,
    actual       String,
    comparison   String,
    passed       UInt8,
    note         String,
    created_ts   DateTime64(3, 'UTC')
)
ENGINE = ReplacingMergeTree(created_ts)
ORDER BY (channel, started_ts, run_id);
