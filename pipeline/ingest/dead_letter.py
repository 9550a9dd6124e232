"""Dead letters: rejected input with its reason, bound for ``gateway.requests.dlq`` (SPEC §3).

The DLQ value format is ``schemas/dead_letter.v1.json``.
"""

from __future__ import annotations

import base64

import msgspec

__all__ = ["DeadLetter", "DEFAULT_DLQ_RAW_BYTES"]

#: Largest prefix of the original bytes copied into a DLQ message. Base64
#: grows it by 4/3, so the DLQ value stays well under Kafka's default 1 MB
#: ``message.max.bytes`` even for a rejected 5 MB input.
DEFAULT_DLQ_RAW_BYTES = 256_000

_encoder = msgspec.json.Encoder()


class DeadLetter(msgspec.Struct, frozen=True):
    """One rejected input: a whole message, or one element of a batch.

    ``reason``: short code from :mod:`pipeline.ingest.reasons`.
    ``detail``: readable sentence naming the field, at most 300 characters.
    ``raw``: the original bytes (for a batch element: that element's bytes).
    ``event_id``: the element's ``event_id`` if it could be read (1..512 chars).
    ``index``: position of the element in its batch; None for a whole message.
    """

    reason: str
    detail: str
    raw: bytes
    event_id: str | None = None
    index: int | None = None

    def to_kafka_value(self, max_raw_bytes: int = DEFAULT_DLQ_RAW_BYTES) -> bytes:
        """JSON value for ``gateway.requests.dlq`` (``schemas/dead_letter.v1.json``).

        ``raw`` goes in as text (``raw_encoding: "utf-8"``) when the original
        bytes are valid UTF-8, else base64 (``"base64"``); only the first
        ``max_raw_bytes`` (>= 0) bytes are copied, with ``raw_truncated`` true
        and ``raw_size`` the original length. Never raises.
        """
        raw = bytes(self.raw)
        cut = raw[: max(0, max_raw_bytes)]
        try:
            raw.decode("utf-8")
            text, encoding = cut.decode("utf-8", errors="ignore"), "utf-8"
        except UnicodeDecodeError:
            text, encoding = base64.b64encode(cut).decode("ascii"), "base64"
        return _encoder.encode(
            {
                "schema_version": 1,
                "reason": self.reason,
                "detail": self.detail,
                "event_id": self.event_id,
                "index": self.index,
                "raw_encoding": encoding,
                "raw": text,
                "raw_size": len(raw),
                "raw_truncated": len(cut) < len(raw),
            }
        )
