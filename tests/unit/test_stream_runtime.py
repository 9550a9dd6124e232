"""Worker runtime options (pipeline.stream.runtime): faust fetch wait, byte chunks."""

import pytest

from pipeline.config import Settings
from pipeline.stream.runtime import PRODUCER_BATCH_BYTES, cap_fetch_wait, disable_read_offset_filter, faust_broker_kwargs
from pipeline.stream.worker_state import byte_chunks


def test_cap_fetch_wait_sets_aiokafkas_wait_once_however_often_called(monkeypatch):
    from faust.transport.drivers import aiokafka as driver

    class FakeConsumer:
        _fetch_max_wait_ms = 1500  # what faust hard-codes

    monkeypatch.setattr(driver.AIOKafkaConsumerThread, "_create_worker_consumer", lambda self, t: FakeConsumer())
    cap_fetch_wait(100)
    cap_fetch_wait(120)  # wraps faust's method once: the later value wins, no double wrapping
    consumer = driver.AIOKafkaConsumerThread._create_worker_consumer(object(), None)
    assert consumer._fetch_max_wait_ms == 120
    assert not hasattr(driver.AIOKafkaConsumerThread._create_worker_consumer.__wrapped__, "__wrapped__")
    with pytest.raises(ValueError, match="1..10000 ms"):
        cap_fetch_wait(0)


class Msg:
    def __init__(self, n):
        self.value = None if n is None else b"x" * n


def test_byte_chunks_bound_the_bytes_of_each_run_and_keep_order():
    msgs = [Msg(4), Msg(4), Msg(None), Msg(9), Msg(1), Msg(1)]
    runs = byte_chunks(msgs, 8)
    assert [[m for m in run] for run in runs] == [msgs[:3], msgs[3:4], msgs[4:]]
    assert byte_chunks([], 8) == []


def test_read_offset_filter_off_every_partition_reads_as_unknown():
    class Consumer:
        _read_offset: dict = {}

    c = Consumer()
    disable_read_offset_filter(c)
    c._read_offset["tp"] = 11           # faust still writes the mark (drain, seek, perform_seek) ...
    c._read_offset.update({"tp2": 3})
    assert c._read_offset["tp"] is None and c._read_offset["tp2"] is None  # ... but never drops by it
    assert c._read_offset.pop("tp") == 11


def test_the_worker_app_gets_producer_batches_that_hold_a_rounds_verdicts_per_partition():
    import faust

    settings = Settings(kafka_bootstrap="localhost:9092", clickhouse_url="chdb:///tmp/unused")
    app = faust.App("t-batch", **faust_broker_kwargs(settings))
    assert app.conf.producer_max_batch_size == PRODUCER_BATCH_BYTES == 262_144
    assert 1_000 * 734 / settings.partitions < PRODUCER_BATCH_BYTES  # 734 B: the largest bench verdict


def test_the_worker_keeps_the_root_logger_at_its_loglevel_without_a_spinner():
    """faust's terminal spinner sets the root logger to DEBUG (faust/worker.py ``_setup_spinner_handler``):
    then each aiokafka ``log.debug`` (one per verdict sent) builds a LogRecord. Our worker has none."""
    import logging

    import faust

    from pipeline.stream.runtime import BoundedStopWorker

    root = logging.getLogger()
    saved_level, saved_handlers = root.level, list(root.handlers)
    app = faust.App("spinner-test", broker="kafka://127.0.0.1:9", store="memory://", web_enabled=False)
    try:
        worker = BoundedStopWorker(app, loglevel="warning", quiet=True)
        worker._setup_logging()
        assert worker.spinner is None
        assert root.level == logging.WARNING
        assert not logging.getLogger("aiokafka.producer.producer").isEnabledFor(logging.DEBUG)
    finally:
        root.handlers[:] = saved_handlers
        root.setLevel(saved_level)
