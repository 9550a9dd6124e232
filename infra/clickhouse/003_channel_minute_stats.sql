-- Per channel per event-time minute statistics, computed at read time from
-- request_events FINAL. A plain VIEW (not a materialized view) so that an
-- event inserted twice (at-least-once delivery) is counted once: a
-- materialized aggregate would add the duplicate before the merge removes it.
--
-- failures = error + timeout + rate_limited (pipeline.contracts.FAILURE_STATUSES;
-- cancelled and filtered are not upstream failures). error_rate = failures / requests.
-- Latency quantiles are over status = 'ok' requests only, linear interpolation
-- (quantileExactInclusive, same as numpy.percentile's default); NULL when the
-- minute has no ok request.
-- missing_field_rate = ok requests whose structure was checked and that were not
-- parseable or missed a field / ok requests whose structure was checked
-- (parse_ok IS NOT NULL); NULL when none was checked.
CREATE VIEW IF NOT EXISTS channel_health.channel_minute_stats AS
SELECT
    channel,
    route,
    toDateTime64(toStartOfMinute(ts), 3, 'UTC')                 AS minute,
    count()                                                     AS requests,
    countIf(status = 'ok')                                      AS ok,
    countIf(status = 'error')                                   AS errors,
    countIf(status = 'timeout')                                 AS timeouts,
    countIf(status = 'rate_limited')                            AS rate_limited,
    countIf(status = 'cancelled')                               AS cancelled,
    countIf(status = 'filtered')                                AS filtered,
    countIf(status IN ('error', 'timeout', 'rate_limited'))     AS failures,
    failures / requests                                         AS error_rate,
    if(ok = 0, NULL, quantileExactInclusiveIf(0.50)(latency_ms, status = 'ok')) AS p50_latency_ms,
    if(ok = 0, NULL, quantileExactInclusiveIf(0.95)(latency_ms, status = 'ok')) AS p95_latency_ms,
    if(ok = 0, NULL, quantileExactInclusiveIf(0.99)(latency_ms, status = 'ok')) AS p99_latency_ms,
    countIf(status = 'ok' AND parse_ok IS NOT NULL)             AS ok_checked,
    countIf(status = 'ok' AND (parse_ok = 0 OR notEmpty(missing_fields))) AS ok_missing,
    if(ok_checked = 0, NULL, ok_missing / ok_checked)           AS missing_field_rate
FROM channel_health.request_events FINAL
GROUP BY channel, route, minute;
