"""Which batch envelopes can be stored as they arrived (:mod:`pipeline.sinks.batches`).

The decoder (:mod:`pipeline.ingest.decode`) asks :func:`storable_envelope`
of every batch envelope it decoded on its fast path; the answer is kept as
``DecodeResult.envelope``.
"""

from __future__ import annotations

from itertools import repeat
from operator import attrgetter, is_not
from typing import Sequence

import msgspec

from pipeline.contracts import RequestEvent

_RESPONSE = attrgetter("response_text")
_CLASS = attrgetter("error_class")
_CLASSES_KEY = b'"error_classes"'


def storable_envelope(raw: bytes, events: Sequence[RequestEvent], dead_letters: Sequence[object]) -> bool:
    """Whether a batch envelope's bytes say exactly what the decoder made of them, to store as they are.

    ``raw``: the message; ``events`` / ``dead_letters``: what the decoder
    accepted and rejected of it.

    ClickHouse then reads the envelope itself (``pipeline.sinks.batches``),
    so its JSON reader must see the same events msgspec did: every element
    accepted (no dead letter); no ``response_text`` (the decoder may check
    and cut it, and the pipeline checks the structure of such an answer: neither
    is in the bytes); no backslash at all (a key spelled with an escape,
    e.g. ``"\\u0065vent_id"``, is the same key to msgspec but another one to
    ClickHouse; a plain ``in`` test runs at memchr speed, cheaper than
    looking for ``\\u``); one line (the envelopes of an insert are
    one per line); ``"events"`` once (msgspec keeps the last of a repeated
    key, ClickHouse the first). C-level scans, cheapest first; a message that fails is stored as rows.

    >>> ok = [RequestEvent(event_id="e", ts_ms=0, channel="c", route="r", status="ok", latency_ms=1.0)]
    >>> storable_envelope(b'{"events": [{"event_id": "e"}]}', ok, [])
    True
    >>> storable_envelope(b'{"events": [{"\\\\u0065vent_id": "e"}]}', ok, [])
    False
    >>> storable_envelope(b'{"events": [], "events": [{"event_id": "e"}]}', ok, [])
    False
    """
    return (not dead_letters and b"\\" not in raw and b"\n" not in raw
            and not any(map(is_not, map(_RESPONSE, events), repeat(None)))
            and raw.count(b'"events"') == 1)


def with_error_classes(raw: bytes, events: Sequence[RequestEvent]) -> bytes | None:
    """A storable envelope with its events' error classes as resolved at ingest added as a last
    top-level key ``"error_classes"`` (one class or null per event, in order), for the view of
    ``infra/clickhouse/014_error_fields.sql``; the bytes as they came when no event has a class
    (the view reads an absent key as no class); None (store as rows) when the bytes hold the key
    ``"error_classes"`` already, or a class must be added and they do not end with ``}`` after
    trailing blanks.

    >>> e = RequestEvent(event_id="e", ts_ms=0, channel="c", route="r", status="error", latency_ms=1.0,
    ...                  error_class="credential")
    >>> with_error_classes(b'{"events": [{"event_id": "e"}]} ', [e])
    b'{"events": [{"event_id": "e"}],"error_classes":["credential"]}'
    >>> with_error_classes(b'{"events": [{"event_id": "e"}]}', [msgspec.structs.replace(e, error_class=None)])
    b'{"events": [{"event_id": "e"}]}'
    """
    if _CLASSES_KEY in raw:
        return None
    classes = list(map(_CLASS, events))
    if classes.count(None) == len(classes):
        return raw
    body = raw.rstrip()
    if not body.endswith(b"}"):
        return None
    return body[:-1] + b"," + _CLASSES_KEY + b":" + msgspec.json.encode(classes) + b"}"
