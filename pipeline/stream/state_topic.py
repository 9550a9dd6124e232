"""Reading the state topic (per-channel engine snapshots) at worker start.

The topic is keyed by channel; the newest message of a key is that
channel's state. A production Kafka compacts it (``cleanup.policy=compact``);
the embedded broker does not, so the reader keeps the last value per key.

Each message carries, in the header ``input_offsets``, the input offsets the
snapshot covers: JSON ``{"<partition>": <last offset included>}`` of the
``gateway.requests`` topic (see :func:`offsets_header`). A restarted worker
skips events its restored state already holds (:mod:`pipeline.stream.processor`).
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any, Mapping

from aiokafka import AIOKafkaConsumer, TopicPartition

log = logging.getLogger("channel_health.state")

#: Header naming the input offsets a snapshot covers.
OFFSETS_HEADER = "input_offsets"


def offsets_header(offsets: Mapping[int, int]) -> bytes:
    """Header value for ``offsets`` (partition → last offset covered).

    >>> offsets_header({1: 7, 0: 12})
    b'{"0":12,"1":7}'
    """
    return json.dumps({str(p): int(o) for p, o in sorted(offsets.items())}, separators=(",", ":")).encode()


def parse_offsets_header(headers: Any) -> dict[int, int]:
    """Covered offsets from a record's headers (``[(name, bytes), ...]``); {} when absent or malformed.

    >>> parse_offsets_header([("input_offsets", b'{"0":12,"1":7}')])
    {0: 12, 1: 7}
    >>> parse_offsets_header(None), parse_offsets_header([("input_offsets", b"junk")])
    ({}, {})
    """
    for name, value in headers or ():
        if name == OFFSETS_HEADER and value:
            try:
                raw = json.loads(value)
                return {int(p): int(o) for p, o in raw.items()}
            except (ValueError, TypeError, AttributeError):
                return {}
    return {}


async def load_snapshot_records(bootstrap: str, topic: str, security: Mapping[str, Any] | None = None,
                                timeout_s: float = 60.0) -> dict[str, tuple[bytes, dict[int, int]]]:
    """Like :func:`load_snapshots`, with each snapshot's covered input offsets (from its header)."""
    return await _load(bootstrap, topic, security, timeout_s)


async def load_snapshots(bootstrap: str, topic: str, security: Mapping[str, Any] | None = None,
                         timeout_s: float = 60.0) -> dict[str, bytes]:
    """Read ``topic`` from the beginning to its current end: channel → newest snapshot bytes.

    Returns an empty dict when the topic does not exist yet. Raises
    ``TimeoutError`` if the end is not reached within ``timeout_s``.
    """
    return {k: v for k, (v, _) in (await _load(bootstrap, topic, security, timeout_s)).items()}


async def _load(bootstrap: str, topic: str, security: Mapping[str, Any] | None,
                timeout_s: float) -> dict[str, tuple[bytes, dict[int, int]]]:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False,
                                auto_offset_reset="earliest", **dict(security or {}))
    await consumer.start()
    out: dict[str, tuple[bytes, dict[int, int]]] = {}
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
                        out[r.key.decode("utf-8", "replace")] = (r.value, parse_offsets_header(r.headers))
        log.info("restored %d channel snapshots from %s", len(out), topic)
        return out
    finally:
        await consumer.stop()
