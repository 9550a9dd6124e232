"""Dead-letter reason codes and the mapping from msgspec errors to them (SPEC §3).

Every rejected input gets one short, stable ``reason`` code (dashboards and
alerts key on it) and a readable ``detail`` that names the field, e.g.
``"latency_ms: Expected `float` >= 0.0"``.
"""

from __future__ import annotations

import re

INVALID_JSON = "invalid_json"  #: not well-formed JSON (or empty)
NOT_UTF8 = "not_utf8"  #: bytes are not valid UTF-8
TOO_LARGE = "too_large"  #: message over ``max_message_bytes``
EMPTY_MESSAGE = "empty_message"  #: Kafka tombstone (no value)
MISSING_FIELD = "missing_field"  #: a required field is absent
WRONG_TYPE = "wrong_type"  #: a field (or the message) has the wrong JSON type
OUT_OF_RANGE = "out_of_range"  #: a number or length outside its allowed range
INVALID_ENUM = "invalid_enum"  #: a value not in the field's enumeration
TS_IN_FUTURE = "ts_in_future"  #: ``ts_ms`` further ahead of now than allowed
TS_TOO_OLD = "ts_too_old"  #: ``ts_ms`` further behind now than allowed
BAD_BATCH = "bad_batch"  #: ``{"events": ...}`` that is not a non-empty array
DUPLICATE_IN_BATCH = "duplicate_in_batch"  #: ``event_id`` seen earlier in the same batch
INVALID_EVENT = "invalid_event"  #: any other validation failure
LATE_EVENT = "late_event"  #: behind the event-time watermark (set by the stream stage, not the decoder)
INTERNAL_ERROR = "internal_error"  #: a bug in the decoder; the input is kept
TOO_MANY_CHANNELS = "too_many_channels"  #: a new channel beyond the worker's channel limit (set by the engine)

ALL_REASONS: tuple[str, ...] = (
    INVALID_JSON, NOT_UTF8, TOO_LARGE, EMPTY_MESSAGE, MISSING_FIELD, WRONG_TYPE,
    OUT_OF_RANGE, INVALID_ENUM, TS_IN_FUTURE, TS_TOO_OLD, BAD_BATCH,
    DUPLICATE_IN_BATCH, INVALID_EVENT, LATE_EVENT, INTERNAL_ERROR, TOO_MANY_CHANNELS,
)

MAX_DETAIL_CHARS = 300
_AT = re.compile(r"^(?P<msg>.*?)(?: - at `\$(?P<path>[^`]*)`)?$", re.DOTALL)
_MISSING = re.compile(r"^Object missing required field `(?P<field>[^`]*)`$")


def _path(path: str) -> str:
    """``".a[0].b"`` -> ``"a[0].b"``; ``""`` -> ``""``."""
    return path[1:] if path.startswith(".") else path


def classify_validation_error(message: str) -> tuple[str, str]:
    """Map a ``msgspec.ValidationError`` message to ``(reason, detail)``.

    ``message`` is ``str(error)``, e.g. ``"Expected `float` >= 0.0 - at
    `$.latency_ms`"`` -> ``("out_of_range", "latency_ms: Expected `float` >= 0.0")``.
    Missing fields become ``"<path>: missing required field"``; errors from
    ``RequestEvent.__post_init__`` (no path) are kept as they are. ``detail``
    is at most :data:`MAX_DETAIL_CHARS` characters. Never raises.
    """
    m = _AT.match(message)
    msg, path = (m.group("msg"), _path(m.group("path") or "")) if m else (message, "")
    missing = _MISSING.match(msg)
    if missing:
        field = missing.group("field")
        reason, detail = MISSING_FIELD, f"{path + '.' if path else ''}{field}: missing required field"
    else:
        if msg.startswith("Expected `") and ", got `" in msg:
            reason = WRONG_TYPE
        elif msg.startswith("Expected `") or msg.startswith("Number out of range"):
            reason = OUT_OF_RANGE
        elif msg.startswith("Invalid enum value"):
            reason = INVALID_ENUM
        elif "must be a finite number" in msg:
            reason = OUT_OF_RANGE
        elif "mixes field names" in msg:
            reason = WRONG_TYPE
        else:
            reason = INVALID_EVENT
        detail = f"{path}: {msg}" if path else msg
    if len(detail) > MAX_DETAIL_CHARS:
        detail = detail[: MAX_DETAIL_CHARS - 3] + "..."
    return reason, detail
