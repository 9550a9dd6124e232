"""Publishing dead letters so that none can stop the worker (SPEC §8: "A dead letter never
stops the worker, whatever its bytes").

Each dead letter's record is bounded by construction
(:meth:`pipeline.ingest.dead_letter.DeadLetter.to_kafka_value` with the
budget :func:`pipeline.ingest.dead_letter.raw_budget` derives from the
producer's request limit). Should Kafka still refuse one (a broker with a
lower ``message.max.bytes``, a broker error), it is sent again without its
copy of the input (``raw`` empty, ``raw_truncated`` true; size and SHA-256
kept); if that fails too it is counted in ``lost`` and logged, and the batch
goes on: its offsets are acknowledged like any other's, so the input after
it keeps flowing (at-least-once for valid events is unaffected; a lost dead
letter is not retried).
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from typing import Any, Sequence

from pipeline.ingest.dead_letter import DeadLetter

__all__ = ["DeadLetterPublisher"]

log = logging.getLogger("channel_health.dead_letters")

#: Log the first failed dead letter and then every this many (counts are always kept).
LOG_EVERY = 100


class DeadLetterPublisher:
    """Sends dead letters to ``topic`` through a faust transport producer; never raises for a failed send.

    ``max_raw_bytes`` (>= 0): budget of each record's copy of the input
    (:func:`pipeline.ingest.dead_letter.raw_budget`). Counters since start:
    ``sent`` (records Kafka acknowledged, first try), ``sent_without_raw``
    (acknowledged on the retry without the copy), ``lost`` (refused both
    times) and ``lost_by_reason`` (dead-letter reason -> lost count).
    Cancellation (``asyncio.CancelledError``) propagates.
    """

    def __init__(self, topic: str, max_raw_bytes: int) -> None:
        if max_raw_bytes < 0:
            raise ValueError(f"max_raw_bytes must be >= 0, got {max_raw_bytes}")
        self.topic = topic
        self.max_raw_bytes = max_raw_bytes
        self.sent = 0
        self.sent_without_raw = 0
        self.lost = 0
        self.lost_by_reason: Counter[str] = Counter()
        self._failures = 0

    async def publish(self, producer: Any, dead_letters: Sequence[DeadLetter]) -> None:
        """Send every dead letter and wait for Kafka's answers; retry refused ones without their copy.

        ``producer``: faust's transport producer (``app.producer``;
        ``send(topic, key, value, partition, timestamp, headers)`` returning a
        future). Returns once each dead letter is acknowledged or counted lost.
        """
        if not dead_letters:
            return
        errors = await self._send(producer, [(d.kafka_key(), d.to_kafka_value(self.max_raw_bytes))
                                             for d in dead_letters])
        failed = [(d, e) for d, e in zip(dead_letters, errors) if e is not None]
        self.sent += len(dead_letters) - len(failed)
        if not failed:
            return
        retry_errors = await self._send(producer, [(d.kafka_key(), d.to_kafka_value(0)) for d, _ in failed])
        for (d, first), second in zip(failed, retry_errors):
            if second is None:
                self.sent_without_raw += 1
                self._note(d, first, "sent again without its copy of the input")
            else:
                self.lost += 1
                self.lost_by_reason[d.reason] += 1
                self._note(d, second, "lost (not sent), processing continues")

    async def _send(self, producer: Any, records: list[tuple[bytes | None, bytes]]) -> list[BaseException | None]:
        """Send ``records``; per record, None if acknowledged, else the error (send-time or delivery)."""
        pending: list[asyncio.Future | None] = []
        errors: list[BaseException | None] = []
        for key, value in records:
            try:
                pending.append(await producer.send(self.topic, key, value, None, None, None))
                errors.append(None)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # e.g. MessageSizeTooLargeError, raised before anything is sent
                pending.append(None)
                errors.append(exc)
        waiting = [(k, f) for k, f in enumerate(pending) if f is not None]
        results = await asyncio.gather(*(f for _, f in waiting), return_exceptions=True)
        for (k, _), res in zip(waiting, results):
            if isinstance(res, BaseException):
                errors[k] = res
        return errors

    def _note(self, d: DeadLetter, exc: BaseException, outcome: str) -> None:
        self._failures += 1
        if self._failures == 1 or self._failures % LOG_EVERY == 0:
            log.error("dead letter (reason %s, %d bytes of input) refused by Kafka: %s: %s; %s "
                      "(%d refused so far: %d sent without their copy, %d lost)",
                      d.reason, len(d.raw) if d.raw is not None else 0, type(exc).__name__, exc, outcome,
                      self._failures, self.sent_without_raw, self.lost)
