"""Reading the state topic (per-channel engine snapshots) at worker start.

The topic is keyed by channel; the newest message of a key is that
channel's state. A production Kafka compacts it (``cleanup.policy=compact``);
the embedded broker does not, so the reader keeps the last value per key
(:func:`fold_record`); a tombstone (a null value) deletes the key's earlier
snapshot, as compaction does, so a bad record can be cleared by one.
Headers are bounded (:data:`MAX_HEADER_BYTES`, typed numbers in range): a
malformed one reads as absent.

Each message carries, in the header ``input_offsets``, the input offsets the
snapshot covers: JSON ``{"<partition>": <last offset included>}`` of the
``gateway.requests`` topic (see :func:`offsets_header`). A restarted worker
skips events its restored state already holds (:mod:`pipeline.engine.batch`).
The header ``input_partition`` names the input partition the channel's events
come from (SPEC §3: key = channel), so a worker restores the channels of its
assigned partitions as soon as it starts (see :func:`snapshot_headers`).
"""

from __future__ import annotations

import json
import logging
import time
from typing import Annotated, Any, Mapping

import msgspec
from aiokafka import AIOKafkaConsumer, TopicPartition

log = logging.getLogger("channel_health.state")

#: Header naming the input offsets a snapshot covers.
OFFSETS_HEADER = "input_offsets"
#: Header naming the input partition of the snapshot's channel (decimal ASCII).
PARTITION_HEADER = "input_partition"
#: Largest header value read (bytes; an offsets header of ~10,000 partitions): a longer one reads as absent.
MAX_HEADER_BYTES = 1 << 18
_MAX_PARTITION = (1 << 31) - 1
_Offsets = dict[Annotated[str, msgspec.Meta(min_length=1, max_length=10, pattern=r"^[0-9]+$")],
                Annotated[int, msgspec.Meta(ge=-1, le=(1 << 63) - 1)]]


def snapshot_headers(offsets: Mapping[int, int], partition: int | None) -> list[tuple[str, bytes]]:
    """Headers of a state-topic record: covered offsets, and the input partition when known.

    >>> snapshot_headers({0: 12}, 3)
    [('input_offsets', b'{"0":12}'), ('input_partition', b'3')]
    >>> snapshot_headers({}, None)
    [('input_offsets', b'{}')]
    """
    headers = [(OFFSETS_HEADER, offsets_header(offsets))]
    if partition is not None:
        headers.append((PARTITION_HEADER, str(int(partition)).encode()))
    return headers


def parse_partition_header(headers: Any) -> int | None:
    """The input partition from a record's headers; None when absent or not a partition number.

    >>> parse_partition_header([("input_partition", b"3")]), parse_partition_header([("input_partition", b"-1")])
    (3, None)
    >>> parse_partition_header(None), parse_partition_header([("input_partition", b"x")])
    (None, None)
    >>> parse_partition_header([("input_partition", b"9" * 50)])
    """
    for name, value in headers or ():
        if name == PARTITION_HEADER and value:
            if not isinstance(value, bytes) or len(value) > 10 or not value.isdigit():
                return None
            p = int(value)
            return p if p <= _MAX_PARTITION else None
    return None


def offsets_header(offsets: Mapping[int, int]) -> bytes:
    """Header value for ``offsets`` (partition → last offset covered).

    >>> offsets_header({1: 7, 0: 12})
    b'{"0":12,"1":7}'
    """
    return json.dumps({str(p): int(o) for p, o in sorted(offsets.items())}, separators=(",", ":")).encode()


def parse_offsets_header(headers: Any) -> dict[int, int]:
    """Covered offsets from a record's headers (``[(name, bytes), ...]``); {} when absent or malformed
    (not a JSON object of partition numbers 0..2**31 - 1 to offsets -1..2**63 - 1, or over
    :data:`MAX_HEADER_BYTES`).

    >>> parse_offsets_header([("input_offsets", b'{"0":12,"1":7}')])
    {0: 12, 1: 7}
    >>> parse_offsets_header(None), parse_offsets_header([("input_offsets", b"junk")])
    ({}, {})
    >>> parse_offsets_header([("input_offsets", b'{"0":1.5}')]), parse_offsets_header([("input_offsets", b"[" * 5000)])
    ({}, {})
    """
    for name, value in headers or ():
        if name == OFFSETS_HEADER and value:
            if not isinstance(value, bytes) or len(value) > MAX_HEADER_BYTES:
                return {}
            try:
                raw = msgspec.json.decode(value, type=_Offsets)
            except msgspec.MsgspecError:
                return {}
            out = {int(p): o for p, o in raw.items()}
            return out if all(p <= _MAX_PARTITION for p in out) else {}
    return {}


def fold_record(out: dict[str, tuple[bytes, dict[int, int], int | None]], key: bytes | None, value: bytes | None,
                headers: Any) -> None:
    """Apply one state-topic record to ``out`` (channel → ``(snapshot bytes, covered input offsets, input
    partition)``), in topic order: a value replaces the key's entry, a tombstone (``value`` None) deletes
    it; a record without a key is skipped. The bytes are not decoded here (the processor does, and
    refuses a bad one then)."""
    if key is None:
        return
    name = key.decode("utf-8", "replace")
    if value is None:
        out.pop(name, None)
    else:
        out[name] = (value, parse_offsets_header(headers), parse_partition_header(headers))


async def load_snapshot_records(bootstrap: str, topic: str, security: Mapping[str, Any] | None = None,
                                timeout_s: float = 60.0) -> dict[str, tuple[bytes, dict[int, int], int | None]]:
    """Like :func:`load_snapshots`: channel → ``(snapshot bytes, covered input offsets, input partition)``
    from each record and its headers (offsets ``{}`` and partition None when a header is absent)."""
    return await _load(bootstrap, topic, security, timeout_s)


async def load_snapshots(bootstrap: str, topic: str, security: Mapping[str, Any] | None = None,
                         timeout_s: float = 60.0) -> dict[str, bytes]:
    """Read ``topic`` from the beginning to its current end: channel → newest snapshot bytes.

    Returns an empty dict when the topic does not exist yet. Raises
    ``TimeoutError`` if the end is not reached within ``timeout_s``.
    """
    return {k: v[0] for k, v in (await _load(bootstrap, topic, security, timeout_s)).items()}


async def _load(bootstrap: str, topic: str, security: Mapping[str, Any] | None,
                timeout_s: float) -> dict[str, tuple[bytes, dict[int, int]]]:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False,
                                auto_offset_reset="earliest", **dict(security or {}))
    await consumer.start()
    out: dict[str, tuple[bytes, dict[int, int], int | None]] = {}
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
                    fold_record(out, r.key, r.value, r.headers)
        log.info("restored %d channel snapshots from %s", len(out), topic)
        return out
    finally:
        await consumer.stop()
