"""BackgroundPublisher (pipeline.gateways.publisher) with a stand-in producer: the timer flush, counted drops,
reconnects. Fails on the old code: the module did not exist (and BatchingProducer alone flushed an old batch
only when another event of its channel arrived, issue #36)."""

from __future__ import annotations

import pytest

from pipeline.gateways.publisher import BackgroundPublisher


class FakeProducer:
    """Records what it sends; ``fail_starts`` / ``fail_sends`` make the next starts / flushes raise."""

    log: list = []
    fail_starts = 0
    fail_sends = 0
    starts = 0

    def __init__(self, bootstrap, topic, **kwargs):
        self.kwargs = kwargs
        self.pending: list = []

    async def __aenter__(self):
        cls = type(self)
        cls.starts += 1
        if cls.fail_starts:
            cls.fail_starts -= 1
            raise ConnectionError("broker unreachable")
        return self

    async def __aexit__(self, *exc):
        return None

    async def send_many(self, events):
        self.pending.extend(events)

    async def flush(self):
        cls = type(self)
        if cls.fail_sends:
            cls.fail_sends -= 1
            self.pending.clear()
            raise TimeoutError("no acknowledgement")
        cls.log.extend(self.pending)
        self.pending.clear()


@pytest.fixture(autouse=True)
def fresh():
    FakeProducer.log, FakeProducer.fail_starts, FakeProducer.fail_sends, FakeProducer.starts = [], 0, 0, 0


def test_a_single_event_is_published_on_the_timer_without_a_second_event():
    p = BackgroundPublisher("b:9092", "t", max_delay_ms=20, producer_factory=FakeProducer)
    assert p.offer({"channel": "c", "event_id": "1"})
    assert p.flush(10)  # returns once the tick sent it: no other event was needed
    assert FakeProducer.log == [{"channel": "c", "event_id": "1"}] and p.published == 1 and p.dropped == 0
    p.close(1)


def test_a_failed_send_is_counted_and_the_publisher_reconnects():
    FakeProducer.fail_sends = 1
    p = BackgroundPublisher("b:9092", "t", max_delay_ms=5, producer_factory=FakeProducer)
    p.offer({"event_id": "lost"})
    assert p.flush(10)
    assert p.dropped_kafka == 1 and p.published == 0 and p.kafka_errors == 1
    p.offer({"event_id": "kept"})
    assert p.flush(20)
    assert FakeProducer.log == [{"event_id": "kept"}] and p.published == 1
    assert FakeProducer.starts == 2  # a new producer after the failure
    p.close(1)


def test_unreachable_broker_buffers_up_to_the_bound_then_delivers_after_reconnect():
    FakeProducer.fail_starts = 2
    p = BackgroundPublisher("b:9092", "t", max_buffer_events=3, max_delay_ms=5, producer_factory=FakeProducer)
    accepted = [p.offer({"event_id": str(i)}) for i in range(5)]
    assert accepted == [True, True, True, False, False] and p.dropped_buffer_full == 2
    assert p.flush(30)  # after two failed starts (0.5 s + 1 s backoff) the third connects
    assert [e["event_id"] for e in FakeProducer.log] == ["0", "1", "2"] and FakeProducer.starts == 3
    assert p.kafka_errors == 2 and p.dropped == 2
    p.close(1)
    assert p.offer({"event_id": "late"}) is False and p.dropped_buffer_full == 3  # closed: dropped, counted


def test_bad_bounds_are_refused():
    with pytest.raises(ValueError):
        BackgroundPublisher("b:9092", "t", max_buffer_events=0)
