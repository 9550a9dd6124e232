"""The stream topology: raw Kafka messages → :class:`BatchProcessor` (decode,
engine, dead letters) → verdicts on ``channel.health``, rejects on
``gateway.requests.dlq``, rows to ClickHouse; offsets acked only after the
ClickHouse write succeeded (at-least-once)."""
