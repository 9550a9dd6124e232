"""Worker runtime options (pipeline.stream.runtime): faust fetch wait, byte chunks, sends awaited later."""

import asyncio

import pytest

from pipeline.stream.runtime import await_acks, cap_fetch_wait, disable_read_offset_filter, send_all
from pipeline.stream.worker_state import PRUNE_SENDS_AT, WorkerState, byte_chunks


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


class FakeProducer:
    """Records sends; each returns a future the test resolves (Kafka's ack) or fails."""

    def __init__(self):
        self.sent, self.futures = [], []

    async def send(self, topic, key, value, partition, timestamp, headers):
        self.sent.append((topic, key, value))
        fut = asyncio.get_running_loop().create_future()
        self.futures.append(fut)
        return fut


def test_sends_are_handed_over_at_once_and_their_acks_awaited_later():
    async def run():
        producer, crashed = FakeProducer(), []

        async def crash(exc):
            crashed.append(exc)

        futs = await send_all(producer, "channel.health", [(b"a", b"v1", None), (b"b", b"v2", None)])
        assert producer.sent == [("channel.health", b"a", b"v1"), ("channel.health", b"b", b"v2")]
        assert [f.done() for f in futs] == [False, False]  # nothing waited for the broker
        waiting = asyncio.ensure_future(await_acks(futs, crash))
        await asyncio.sleep(0)
        assert not waiting.done()  # the flush waits until Kafka acked every one
        futs[0].set_result("meta")
        futs[1].set_result("meta")
        await waiting
        failed = await send_all(producer, "channel.health", [(b"c", b"v3", None)])
        failed[0].set_exception(ConnectionError("broker gone"))
        with pytest.raises(ConnectionError, match="broker gone"):
            await await_acks(failed, crash)
        assert [str(e) for e in crashed] == ["broker gone"]  # the worker stops: offsets not committed
    asyncio.run(run())


def test_acknowledged_sends_are_pruned_only_past_the_bound_and_taken_in_order():
    async def run():
        loop = asyncio.get_running_loop()
        state = WorkerState(processor=None)
        acked = [loop.create_future() for _ in range(PRUNE_SENDS_AT)]
        for f in acked:
            f.set_result(None)
        open_ = loop.create_future()
        state.add_sends(acked)
        assert len(state.sends) == PRUNE_SENDS_AT  # at the bound: kept as they are
        state.add_sends([open_])
        assert state.sends == [open_]  # past it: the acknowledged ones are dropped, the open one kept
        later = [loop.create_future(), loop.create_future()]
        state.add_sends(later)
        assert state.take_sends(1) == [open_] and state.sends == later
    asyncio.run(run())
