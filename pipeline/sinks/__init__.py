"""Sinks: where the pipeline's results go besides Kafka.

:mod:`.clickhouse` is the buffered at-least-once ClickHouse sink; :mod:`.rows`
builds its rows; :mod:`.backoff` holds the retry delays.
"""
