-- The quota curve and its forecast per channel per event-time minute (SPEC §4.7,
-- issue #18): a plain VIEW over request_events FINAL (the reported
-- quota_remaining, share 0..1) and channel_verdicts FINAL (the quota signal's
-- numbers), so duplicates are counted once, as in channel_minute_stats.
--
-- One row per minute with traffic; the quota columns are NULL for a channel that
-- reports no quota (it is never judged on it).
-- quota_min / quota_last: lowest and newest quota_remaining of the minute;
-- quota_samples: requests that reported one.
-- quota_drain_per_h (share per hour, > 0 = draining) and quota_exhaustion_s
-- (forecast seconds to empty, NULL when no significant drain): from the newest
-- evaluation-round verdict of the minute (the Theil-Sen fit of
-- pipeline/signals/quota.py); quota_exhausted_at = that verdict's ts +
-- quota_exhaustion_s; quota_in_30m = quota_last - drain x 0.5 h, floored at 0
-- (the forecast line: it reaches 0 where the signal's 30 min horizon fires).
CREATE VIEW IF NOT EXISTS channel_health.channel_quota_forecast AS
SELECT
    q.channel                                                   AS channel,
    q.minute                                                    AS minute,
    q.quota_min                                                 AS quota_min,
    q.quota_last                                                AS quota_last,
    q.quota_samples                                             AS quota_samples,
    v.drain_per_h                                               AS quota_drain_per_h,
    v.exhaustion_s                                              AS quota_exhaustion_s,
    if(isNull(v.exhaustion_s), NULL,
       v.verdict_ts + toIntervalMillisecond(toInt64(round(v.exhaustion_s * 1000)))) AS quota_exhausted_at,
    if(isNull(q.quota_last) OR isNull(v.drain_per_h), NULL,
       greatest(q.quota_last - 0.5 * v.drain_per_h, 0))         AS quota_in_30m
FROM
(
    SELECT
        channel,
        toDateTime64(toStartOfMinute(ts), 3, 'UTC')             AS minute,
        toNullable(toFloat64(min(quota_remaining)))             AS quota_min,
        toNullable(toFloat64(argMax(quota_remaining, ts)))      AS quota_last,
        count(quota_remaining)                                  AS quota_samples
    FROM channel_health.request_events FINAL
    GROUP BY channel, minute
) AS q
LEFT JOIN
(
    SELECT
        channel,
        toDateTime64(toStartOfMinute(ts), 3, 'UTC')             AS minute,
        max(ts)                                                 AS verdict_ts,
        argMax(JSONExtract(metrics, 'quota_drain_per_h', 'Nullable(Float64)'), ts)  AS drain_per_h,
        argMax(JSONExtract(metrics, 'quota_exhaustion_s', 'Nullable(Float64)'), ts) AS exhaustion_s
    FROM channel_health.channel_verdicts FINAL
    WHERE JSONHas(metrics, 'quota_points')
    GROUP BY channel, minute
) AS v
ON q.channel = v.channel AND q.minute = v.minute;
