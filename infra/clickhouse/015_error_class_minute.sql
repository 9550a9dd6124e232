-- Issue #32 part 3 / SPEC §4.1: failed requests per channel, event-time minute and
-- error class (pipeline.ingest.error_class: caller, credential, quota_exhausted,
-- rate_limited, transient), with the newest account and message of the minute.
-- A plain VIEW over request_events FINAL, as channel_minute_stats (003): an event
-- delivered twice is counted once (a materialized aggregate would add the
-- duplicate before the merge removes it).
--
-- Only failed events (status error, timeout, rate_limited) carry a class; rows
-- written before 014 (error_class '') are left out. failures = the minute's
-- failed events of that class; share = failures / all requests of the channel in
-- that minute (the denominator of error_rate in channel_minute_stats).
-- last_message: the newest error_message of the class in the minute (as ingest
-- cut it, 512 characters; escape it for the medium that shows it).
CREATE VIEW IF NOT EXISTS channel_health.channel_error_class_minute AS
SELECT
    c.channel                                                   AS channel,
    c.route                                                     AS route,
    c.minute                                                    AS minute,
    c.error_class                                               AS error_class,
    c.failures                                                  AS failures,
    c.failures / t.requests                                     AS share,
    c.last_account                                              AS last_account,
    c.last_message                                              AS last_message
FROM
(
    SELECT
        channel,
        route,
        toDateTime64(toStartOfMinute(ts), 3, 'UTC')             AS minute,
        error_class,
        count()                                                 AS failures,
        argMax(account, ts)                                     AS last_account,
        argMax(error_message, ts)                               AS last_message
    FROM channel_health.request_events FINAL
    WHERE status IN ('error', 'timeout', 'rate_limited') AND error_class != ''
    GROUP BY channel, route, minute, error_class
) AS c
INNER JOIN
(
    SELECT channel, route, toDateTime64(toStartOfMinute(ts), 3, 'UTC') AS minute, count() AS requests
    FROM channel_health.request_events FINAL
    GROUP BY channel, route, minute
) AS t ON c.channel = t.channel AND c.route = t.route AND c.minute = t.minute;
