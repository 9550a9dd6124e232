"""In-order acceptance of input messages within one consumer generation.

Why: after a rebalance faust resumes fetching *before* it seeks the assigned
partitions back to their committed offsets (``Recovery._resume_streams``:
``resume_partitions`` then ``await perform_seek()``). Records fetched at the
old position in that window carry the *new* generation id. Accepting them
and then dropping the re-read records below them as duplicates loses the
records between the committed offset and the first pre-fetched one: they are
neither processed nor stored, and faust's commit waits for the gap forever.

The rule: per partition, the first accepted message of a generation must be
at the partition's start offset (the group's committed offset, else the log
start). Until it arrives the partition is *unsynced*: later offsets are
dropped (they are read again after the seek) and the caller is told to seek
back. Once synced, each message must be past the last accepted one (an
offset at or below it is a duplicate); forward gaps are tolerated (a
production Kafka leaves offsets without records, e.g. transaction markers).
If a partition's start offset has no record at all (a marker, or retention
removed it), it syncs at the next offset after ``MAX_SEEKS`` seek attempts.

Kafka-free and synchronous; :mod:`pipeline.stream.app` drives it and reads
the start offsets with :func:`start_offsets`.

>>> gate = OffsetGate({0: 100})
>>> gate.check(0, 250), gate.check(0, 251)     # pre-fetched before the seek: dropped, seek back
('gap', 'gap')
>>> gate.check(0, 100), gate.check(0, 101), gate.check(0, 101)
('accept', 'accept', 'duplicate')
>>> gate.last_accepted(0)
101
"""

from __future__ import annotations

import time
from typing import Any, Callable, Iterable, Literal, Mapping

from aiokafka import AIOKafkaConsumer, TopicPartition

Decision = Literal["accept", "duplicate", "gap"]

#: Seeks back to an unsynced partition's start before its next record is taken as the start.
MAX_SEEKS = 3
#: Shortest wall-clock interval between two seeks of one partition (s).
SEEK_INTERVAL_S = 1.0


class OffsetGate:
    """Decide, per message, whether it continues its partition's input in order.

    ``start``: partition → offset of the first message to process in this
    generation (committed offset, else log start); a partition missing from
    it syncs on its first message. ``clock_s``: monotonic seconds (for
    :meth:`want_seek` throttling).
    """

    def __init__(self, start: Mapping[int, int], clock_s: Callable[[], float] = time.monotonic) -> None:
        self.start = {int(p): int(o) for p, o in start.items()}
        self.clock_s = clock_s
        self._last: dict[int, int] = {}
        self._seeks: dict[int, int] = {}
        self._sought_at: dict[int, float] = {}
        self.gaps = 0
        self.duplicates = 0
        #: Partitions that synced past a start offset that had no record (offset skipped → taken).
        self.skipped_starts: list[tuple[int, int, int]] = []

    def check(self, partition: int, offset: int) -> Decision:
        """``accept`` (process it), ``duplicate`` (already processed) or ``gap`` (drop; seek back)."""
        last = self._last.get(partition)
        if last is not None:
            if offset <= last:
                self.duplicates += 1
                return "duplicate"
            self._last[partition] = offset
            return "accept"
        start = self.start.get(partition)
        if start is None or offset == start:
            self._last[partition] = offset
            return "accept"
        if offset < start:
            self.duplicates += 1
            return "duplicate"
        if self._seeks.get(partition, 0) >= MAX_SEEKS:
            self.skipped_starts.append((partition, start, offset))
            self._last[partition] = offset
            return "accept"
        self.gaps += 1
        return "gap"

    def want_seek(self, partition: int) -> int | None:
        """Offset to seek ``partition`` back to after a ``gap``, or None (synced, or sought < 1 s ago).

        Counts the seek; after ``MAX_SEEKS`` of them the next offset is accepted as the start.
        """
        if partition in self._last or partition not in self.start:
            return None
        now = self.clock_s()
        if now - self._sought_at.get(partition, -1e18) < SEEK_INTERVAL_S:
            return None
        self._sought_at[partition] = now
        self._seeks[partition] = self._seeks.get(partition, 0) + 1
        return self.start[partition]

    @property
    def last_offsets(self) -> dict[int, int]:
        """Partition → offset of the last message accepted in this generation (the gate's own map: do not modify)."""
        return self._last

    def last_accepted(self, partition: int) -> int | None:
        """Offset of the last message accepted on ``partition`` in this generation (None: none yet)."""
        return self._last.get(partition)


async def start_offsets(bootstrap: str, group: str, topic: str, partitions: Iterable[int],
                        security: Mapping[str, Any] | None = None) -> dict[int, int]:
    """Where ``group`` resumes each of ``partitions`` of ``topic``: committed offset, else the log start.

    One short-lived aiokafka client (it does not join the group). Raises the
    client's ``KafkaError`` subclasses when the broker is unreachable.
    """
    tps = [TopicPartition(topic, int(p)) for p in partitions]
    if not tps:
        return {}
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False,
                                **dict(security or {}))
    await consumer.start()
    try:
        out: dict[int, int] = {}
        begin = await consumer.beginning_offsets(tps)
        for tp in tps:
            committed = await consumer.committed(tp)
            out[tp.partition] = max(committed, begin[tp]) if committed is not None and committed >= 0 else begin[tp]
        return out
    finally:
        await consumer.stop()
