"""Reading the state topic (per-channel engine snapshots) at worker start.

The topic is keyed by channel; the newest message of a key is that
channel's state. A production Kafka compacts it (``cleanup.policy=compact``);
the embedded broker does not, so the reader keeps the last value per key.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Mapping

from aiokafka import AIOKafkaConsumer, TopicPartition

log = logging.getLogger("channel_health.state")


async def load_snapshots(bootstrap: str, topic: str, security: Mapping[str, Any] | None = None,
                         timeout_s: float = 60.0) -> dict[str, bytes]:
    """Read ``topic`` from the beginning to its current end: channel → newest snapshot bytes.

    Returns an empty dict when the topic does not exist yet. Raises
    ``TimeoutError`` if the end is not reached within ``timeout_s``.
    """
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False,
                                auto_offset_reset="earliest", **dict(security or {}))
    await consumer.start()
    out: dict[str, bytes] = {}
    try:
        parts = consumer.partitions_for_topic(topic)
        if not parts:
            await consumer.topics()  # refresh metadata once
            parts = consumer.partitions_for_topic(topic)
        if not parts:
            return out
        tps = [TopicPartition(topic, p) for p in sorted(parts)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        end = await consumer.end_offsets(tps)
        deadline = time.monotonic() + timeout_s
        async def behind() -> bool:
            for tp in tps:
                if await consumer.position(tp) < end[tp]:
                    return True
            return False

        while await behind():
            if time.monotonic() > deadline:
                raise TimeoutError(f"state topic {topic} not read to its end within {timeout_s:.0f} s")
            batches = await consumer.getmany(timeout_ms=500, max_records=10_000)
            for records in batches.values():
                for r in records:
                    if r.key is not None and r.value is not None:
                        out[r.key.decode("utf-8", "replace")] = r.value
        log.info("restored %d channel snapshots from %s", len(out), topic)
        return out
    finally:
        await consumer.stop()
