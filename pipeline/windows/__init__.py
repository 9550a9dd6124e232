"""Event-time window state: bounded rings of per-interval counters and
latency histograms per channel, the 24 h baseline ring, consecutive-failure
runs and the watermark. No Kafka, no ClickHouse: plain numpy."""
