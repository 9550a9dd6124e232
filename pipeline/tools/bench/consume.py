"""Shared pieces of the consuming stages: a raw aiokafka reader of a whole topic, and timing."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

from aiokafka import AIOKafkaConsumer, TopicPartition

#: Fetch sizes for bulk reading (the defaults, 1 MB per partition, cap a fetch at two 500-event messages).
#: A short fetch wait keeps a live (paced) topic's latency low; a backlog is returned at once anyway.
FETCH_KWARGS: dict[str, Any] = {"fetch_max_bytes": 64 * 1024 * 1024, "max_partition_fetch_bytes": 16 * 1024 * 1024,
                                "fetch_max_wait_ms": 50}


@dataclass
class Clock:
    """Wall and CPU time from the first message to the last one handled.

    ``cpu_clock``: CPU seconds so far (default this process's; a stage with a
    sink process adds that process's, so ``events_per_cpu_s`` counts both).
    """

    first_wall: float | None = None
    last_wall: float = 0.0
    first_cpu: float = 0.0
    last_cpu: float = 0.0
    messages: int = 0
    events: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    first_unix: float = 0.0
    last_unix: float = 0.0
    cpu_clock: Callable[[], float] = time.process_time

    def start(self) -> None:
        if self.first_wall is None:
            self.first_wall = time.perf_counter()
            self.first_cpu = self.cpu_clock()
            self.first_unix = time.time()

    def stop(self) -> None:
        self.last_wall = time.perf_counter()
        self.last_cpu = self.cpu_clock()
        self.last_unix = time.time()

    @property
    def seconds(self) -> float:
        return max(self.last_wall - (self.first_wall or self.last_wall), 1e-9)

    def result(self) -> dict[str, Any]:
        cpu = max(self.last_cpu - self.first_cpu, 1e-9)
        return {"messages": self.messages, "events": self.events, "seconds": round(self.seconds, 3),
                "events_per_s": round(self.events / self.seconds, 1),
                "messages_per_s": round(self.messages / self.seconds, 1),
                "cpu_s": round(cpu, 3), "events_per_cpu_s": round(self.events / cpu, 1),
                "first_unix": self.first_unix, "last_unix": self.last_unix, **self.extra}


async def open_reader(bootstrap: str, topic: str, partitions: list[int] | None = None) -> AIOKafkaConsumer:
    """A group-less consumer assigned to ``partitions`` (default: all) of ``topic``, at the beginning."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, group_id=None,
                                auto_offset_reset="earliest", **FETCH_KWARGS)
    await consumer.start()
    parts = consumer.partitions_for_topic(topic)
    if not parts:
        await consumer.topics()
        parts = consumer.partitions_for_topic(topic)
    if not parts:
        await consumer.stop()
        raise RuntimeError(f"topic {topic} does not exist")
    tps = [TopicPartition(topic, p) for p in sorted(parts) if partitions is None or p in partitions]
    consumer.assign(tps)
    await consumer.seek_to_beginning(*tps)
    return consumer
