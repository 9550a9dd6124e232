"""Sinks: where the pipeline's results go besides Kafka.

- :mod:`.clickhouse`: :class:`~pipeline.sinks.clickhouse.ClickHouseSink`, the
  worker's at-least-once writer of all tables;
- :mod:`.table`: :class:`~pipeline.sinks.table.TableSink`, the buffered sink of
  one table (add → flush → commit contract);
- :mod:`.rows`: row builders and column orders;
- :mod:`.retry`: exponential backoff around a flush;
- :mod:`.errors`: ``SinkWriteError``, ``SinkBackpressure``, ``SinkSetupError``.
"""
