"""Sinks: where the pipeline's results go besides Kafka.

- :mod:`.process`: :class:`~pipeline.sinks.process.ProcessSink`, the worker's
  default sink: the same contract, the writing done by a child process
  (:mod:`.child`), and :func:`~pipeline.sinks.process.open_sink`;
- :mod:`.clickhouse`: :class:`~pipeline.sinks.clickhouse.ClickHouseSink`, the
  at-least-once writer of all tables (in the sink process, or in-process);
- :mod:`.table`: :class:`~pipeline.sinks.table.TableSink`, the buffered sink of
  one table (add → flush → commit contract);
- :mod:`.rows`: row builders and column orders;
- :mod:`.retry`: exponential backoff around a flush;
- :mod:`.errors`: ``SinkWriteError``, ``SinkBackpressure``, ``SinkSetupError``.
"""
