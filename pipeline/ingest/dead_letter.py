"""Dead letters: rejected input with its reason, bound for ``gateway.requests.dlq`` (SPEC §3).

The DLQ value format is ``schemas/dead_letter.v1.json``. Whatever the
rejected bytes, the encoded record is bounded (SPEC §8: "a dead letter never
stops the worker, whatever its bytes"): the copy of the original is cut so
that its *encoded* form -- JSON-escaped text (a ``0x01`` byte becomes the six
characters ``\\u0001``) or base64 (4 bytes per 3) -- fits a byte budget, and
the dead letter names the original's size and SHA-256 so the copy can be
matched to the full message.
"""

from __future__ import annotations

import base64
import hashlib

import msgspec
import numpy as np

__all__ = ["DeadLetter", "DEFAULT_DLQ_RAW_BYTES", "MAX_DLQ_EVENT_ID_CHARS", "MAX_DLQ_REASON_CHARS",
           "MAX_DLQ_DETAIL_CHARS", "max_record_bytes", "raw_budget"]

#: Default budget of the encoded ``raw`` field of a DLQ value (bytes of JSON
#: string content). With the fixed part (:func:`max_record_bytes`) a dead
#: letter stays far below Kafka's default 1 MB ``max.request.size`` /
#: ``message.max.bytes`` even for a rejected 20 MB input.
DEFAULT_DLQ_RAW_BYTES = 256_000
#: ``event_id`` (value field and record key), ``reason`` and ``detail`` are cut
#: to these many characters in the DLQ record (the decoder's own limits:
#: 512-character ids, :data:`pipeline.ingest.reasons.MAX_DETAIL_CHARS`).
MAX_DLQ_EVENT_ID_CHARS = 512
MAX_DLQ_REASON_CHARS = 64
MAX_DLQ_DETAIL_CHARS = 300
#: Worst-case JSON bytes of one character: a control character escapes to ``\\u00XX``.
_MAX_ESCAPED_CHAR = 6
#: The value's keys, punctuation, ``schema_version``, ``index`` (up to 20 digits),
#: ``raw_encoding``, ``raw_size`` (up to 20 digits), ``raw_truncated`` and the
#: 64-hex-digit ``raw_sha256``: 252 bytes at most (19-digit ints), rounded up.
_VALUE_FIXED_BYTES = 512
#: Kafka record, record-batch and produce-request framing around one record's
#: key and value (record batch header 61 bytes, record header <= 21 bytes,
#: request and topic headers), rounded up generously.
_RECORD_FRAMING_BYTES = 1_024

_encoder = msgspec.json.Encoder()


def max_record_bytes(max_raw_bytes: int = DEFAULT_DLQ_RAW_BYTES) -> int:
    """Upper bound (bytes) of a DLQ record -- value, key and Kafka framing --
    produced by :meth:`DeadLetter.to_kafka_value` with ``max_raw_bytes`` (>= 0).

    Sum of the ``raw`` budget, the worst-case escaped size of the cut
    ``reason``/``detail``/``event_id`` (6 bytes per character), the event id
    again as the UTF-8 key (4 bytes per character), the value's fixed part and
    the record framing. A bound by construction, not a measurement.
    """
    chars = MAX_DLQ_REASON_CHARS + MAX_DLQ_DETAIL_CHARS + MAX_DLQ_EVENT_ID_CHARS
    return (max(0, max_raw_bytes) + _MAX_ESCAPED_CHAR * chars + 4 * MAX_DLQ_EVENT_ID_CHARS
            + _VALUE_FIXED_BYTES + _RECORD_FRAMING_BYTES)


def raw_budget(max_request_bytes: int) -> int:
    """The ``raw`` budget (bytes) for a producer whose ``max_request_size`` is ``max_request_bytes``.

    The largest budget, at most :data:`DEFAULT_DLQ_RAW_BYTES`, whose
    :func:`max_record_bytes` is at most half the request limit (so a dead
    letter fits "well under" it, also next to other records of its request).
    Raises ``ValueError`` when even an empty copy would not fit (a limit
    below ~17 KB).
    """
    budget = min(DEFAULT_DLQ_RAW_BYTES, max_request_bytes // 2 - max_record_bytes(0))
    if budget < 0:
        raise ValueError(f"a producer max request size of {max_request_bytes} bytes leaves no room for a dead "
                         f"letter (needs at least {2 * max_record_bytes(0)})")
    return budget


def _cut(text: object, limit: int) -> str | None:
    """``text`` as a str of at most ``limit`` characters (``...`` marks a cut), encodable as UTF-8; None stays None."""
    if text is None:
        return None
    out = str(text)
    out = out if len(out) <= limit else out[: limit - 3] + "..."
    try:
        out.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate: not encodable, shown as "?"
        out = out.encode("utf-8", errors="replace").decode("utf-8")
    return out


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

    def kafka_key(self) -> bytes | None:
        """Record key of the DLQ message: the ``event_id`` (cut to 512 characters) as UTF-8, None without one."""
        eid = _cut(self.event_id, MAX_DLQ_EVENT_ID_CHARS)
        return eid.encode("utf-8") if eid else None

    def to_kafka_value(self, max_raw_bytes: int = DEFAULT_DLQ_RAW_BYTES) -> bytes:
        """JSON value for ``gateway.requests.dlq`` (``schemas/dead_letter.v1.json``).

        The copy of the original is cut so that its encoded field is at most
        ``max_raw_bytes`` (>= 0) bytes: as text (``raw_encoding: "utf-8"``,
        the longest prefix whose JSON-escaped form fits, never splitting a
        character) when the original is valid UTF-8 and that prefix is the
        whole input or at least as long as a base64 copy's, else as base64
        (``"base64"``) of the first ``max_raw_bytes // 4 * 3`` bytes (so a
        flood of control characters, 6x larger escaped, is sent as base64). ``raw_truncated`` tells whether the copy is shorter than
        the original, ``raw_size`` is the original length in bytes and
        ``raw_sha256`` the hex SHA-256 of the full original. ``reason``,
        ``detail`` and ``event_id`` are cut to :data:`MAX_DLQ_REASON_CHARS`,
        :data:`MAX_DLQ_DETAIL_CHARS` and :data:`MAX_DLQ_EVENT_ID_CHARS`
        characters. The record (value, key, framing) is therefore at most
        :func:`max_record_bytes` ``(max_raw_bytes)`` bytes, whatever the
        input. Never raises.
        """
        budget = max(0, max_raw_bytes)
        raw = bytes(self.raw) if self.raw is not None else b""
        value = {
            "schema_version": 1,
            "reason": _cut(self.reason, MAX_DLQ_REASON_CHARS),
            "detail": _cut(self.detail, MAX_DLQ_DETAIL_CHARS),
            "event_id": _cut(self.event_id, MAX_DLQ_EVENT_ID_CHARS),
            "index": self.index if isinstance(self.index, int) and 0 <= self.index < 2**63 else None,
            "raw_encoding": "base64",
            "raw": "",
            "raw_size": len(raw),
            "raw_truncated": False,
            "raw_sha256": hashlib.sha256(raw).hexdigest(),
        }
        b64_bytes = budget // 4 * 3
        text_bytes = _text_prefix(raw, budget)
        if text_bytes is not None and (text_bytes == len(raw) or text_bytes >= b64_bytes):
            value["raw_encoding"] = "utf-8"
            value["raw"] = raw[:text_bytes].decode("utf-8")
            value["raw_truncated"] = text_bytes < len(raw)
        else:
            cut = raw[:b64_bytes]
            value["raw"] = base64.b64encode(cut).decode("ascii")
            value["raw_truncated"] = len(cut) < len(raw)
        return _encoder.encode(value)


#: JSON-escaped size of each byte of UTF-8 text as msgspec writes it: ``"`` and
#: ``\`` and the control characters with a short escape (``\b \t \n \f \r``)
#: take 2, the other control characters 6 (``\u00XX``), every other byte 1
#: (non-ASCII is written as UTF-8; DEL is not escaped).
_ESCAPED = np.ones(256, dtype=np.int64)
_ESCAPED[:0x20] = 6
_ESCAPED[[0x08, 0x09, 0x0A, 0x0C, 0x0D, 0x22, 0x5C]] = 2


def _text_prefix(raw: bytes, budget: int) -> int | None:
    """Length of the longest prefix of ``raw`` that ends on a character boundary and whose
    JSON-escaped text is at most ``budget`` bytes; None when ``raw`` is not valid UTF-8."""
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return None
    if len(raw) * _MAX_ESCAPED_CHAR <= budget:
        return len(raw)
    head = np.frombuffer(raw, dtype=np.uint8, count=min(len(raw), budget))
    fits = int(np.searchsorted(np.cumsum(_ESCAPED[head]), budget, side="right"))
    if fits == len(raw):
        return fits
    while fits > 0 and 0x80 <= raw[fits] < 0xC0:  # a continuation byte: the cut would split a character
        fits -= 1
    return fits
