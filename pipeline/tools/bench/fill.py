"""Pre-filling the benchmark topics on the embedded broker.

Batched messages are built the way a gateway fleet should batch for
throughput at 1,000 channels: one buffer per *partition* (the partition a
channel's key hashes to, as Kafka's default partitioner does), published at
``batch_size`` events. A channel therefore still lives in one partition and
its events stay in order, but a batch fills from all the partition's
channels at once (a per-channel buffer at 1,000 channels fills 1,000 times
slower, so with a 100 ms flush deadline it would carry a handful of events).
Single-event messages are keyed by channel and partitioned by the producer.

The state topic of each pipeline stage is seeded with the same 1,000
channel snapshots (24 h baselines, see :mod:`pipeline.tools.bench.warm`), as a
worker restarting with that state would find it.
"""

from __future__ import annotations

import asyncio
from typing import Iterable, Iterator, Sequence

import msgspec
from aiokafka import AIOKafkaProducer
from aiokafka.partitioner import murmur2

_enc = msgspec.json.Encoder()


def partition_of(channel: str, partitions: int) -> int:
    """Partition of a channel key (Kafka's default partitioner: murmur2, positive, modulo).

    >>> partition_of("lepton/llama-70b@free", 4) in range(4)
    True
    """
    return (murmur2(channel.encode()) & 0x7FFFFFFF) % partitions


class PartitionBatcher:
    """Build batch envelopes per partition; :meth:`add` returns the messages that became full.

    Messages are ``(partition, value)`` with ``batch_size`` >= 1 events each;
    ``events_per_partition`` counts the events put in each partition and
    ``last_max_ts`` holds, per returned message in order, its newest ``ts_ms``.

    >>> b = PartitionBatcher(2, batch_size=2)
    >>> full = b.add([{"channel": "a", "ts_ms": 1}, {"channel": "a", "ts_ms": 2}, {"channel": "b", "ts_ms": 3}])
    >>> len(full), len(b.flush()), sum(b.events_per_partition)
    (1, 1, 3)
    """

    def __init__(self, partitions: int, batch_size: int = 500):
        if partitions < 1 or batch_size < 1:
            raise ValueError("partitions and batch_size must be >= 1")
        self.partitions = partitions
        self.batch_size = batch_size
        self._buffers: list[list[dict]] = [[] for _ in range(partitions)]
        self._part: dict[str, int] = {}
        self.events_per_partition = [0] * partitions
        self.last_max_ts: list[int] = []

    def add(self, events: Iterable[dict]) -> list[tuple[int, bytes]]:
        out = []
        self.last_max_ts = []
        for e in events:
            name = e["channel"]
            p = self._part.get(name)
            if p is None:
                p = self._part[name] = partition_of(name, self.partitions)
            buf = self._buffers[p]
            buf.append(e)
            self.events_per_partition[p] += 1
            if len(buf) >= self.batch_size:
                out.append(self._envelope(p, buf))
                self._buffers[p] = []
        return out

    def flush(self) -> list[tuple[int, bytes]]:
        """The partly filled envelopes."""
        self.last_max_ts = []
        out = [self._envelope(p, buf) for p, buf in enumerate(self._buffers) if buf]
        self._buffers = [[] for _ in range(self.partitions)]
        return out

    def _envelope(self, p: int, buf: list[dict]) -> tuple[int, bytes]:
        self.last_max_ts.append(max(e.get("ts_ms", 0) for e in buf))
        return p, _enc.encode({"events": buf})


def single_messages(events: Iterable[dict], partitions: int) -> Iterator[tuple[int, bytes, bytes]]:
    """``(partition, key, value)``: one event per message, keyed by channel."""
    for e in events:
        key = e["channel"].encode()
        yield (murmur2(key) & 0x7FFFFFFF) % partitions, key, _enc.encode(e)


class Publisher:
    """An aiokafka producer tuned for bulk loading (large batches, leader acks)."""

    def __init__(self, bootstrap: str):
        self._producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=10, acks=1,
                                          max_batch_size=1_048_576, max_request_size=16_000_000)
        self._pending: list[asyncio.Future] = []
        self.messages = 0
        self.bytes = 0

    async def __aenter__(self) -> "Publisher":
        await self._producer.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        try:
            await self.drain()
        finally:
            await self._producer.stop()

    async def send(self, topic: str, value: bytes, key: bytes | None = None, partition: int | None = None,
                   headers: Sequence[tuple[str, bytes]] | None = None) -> None:
        self._pending.append(await self._producer.send(topic, value, key=key, partition=partition,
                                                       headers=list(headers) if headers else None))
        self.messages += 1
        self.bytes += len(value)
        if len(self._pending) >= 2_000:
            await self.drain()

    async def drain(self) -> None:
        pending, self._pending = self._pending, []
        if pending:
            await asyncio.gather(*pending)


async def seed_state(bootstrap: str, topic: str, snapshots: Sequence[tuple[str, bytes]], partitions: int) -> int:
    """Publish channel snapshots (``(channel, bytes)``) to a state topic, as a worker writes them: each
    record names its channel's input partition (:func:`partition_of` over ``partitions``); returns the count."""
    from pipeline.stream.state_topic import snapshot_headers

    async with Publisher(bootstrap) as pub:
        for name, blob in snapshots:
            await pub.send(topic, blob, key=name.encode(), headers=snapshot_headers({}, partition_of(name, partitions)))
    return len(snapshots)
