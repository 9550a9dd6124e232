"""How accepted events go to ``request_events``: whole envelopes as they arrived, or rows.

The one place that makes this choice (:func:`split_stored`). An envelope
``{"events": [...]}`` goes as its own bytes when the decoder found them
faithful (:func:`pipeline.ingest.envelope.storable_envelope`) with every
event's structure flags as ingest resolved them already in them
(:func:`pipeline.ingest.structure.resolve_onto` changed none:
``DecodeResult.envelope``), and none of its events is late, refused (a
new channel over the limit) or a re-sent duplicate: one envelope
per line, ``JSONEachRow`` into ``request_event_envelopes_v2``, whose
materialized view writes one ``request_events`` row per event with the
flags read as data and the error classes beside them (``infra/clickhouse/014_error_fields.sql``, after 011).
Every other accepted event goes as a row ``(event, parse_ok,
missing_fields)`` (:func:`stored_rows`, the flags read from the event).
Encoding the rows cost the worker's main thread a sizeable share of its
time (docs/THROUGHPUT.md, "Design measurements"), which the envelopes save.

ClickHouse's JSON reader refuses a few inputs msgspec accepts (a key
repeated in an event: "JSON object contains duplicate key"); such a
payload is not dropped: :func:`rows_of` decodes its envelopes with msgspec,
as the pipeline did, and :func:`salvage_into` writes them as rows
(:class:`~pipeline.sinks.json_table.JsonTableSink` calls it).
"""

from __future__ import annotations

from operator import attrgetter
from typing import Any, Callable, Iterable, Sequence

import msgspec

from pipeline.contracts import ErrorClassName, RequestEvent
from pipeline.ingest.structure import resolve_onto
from pipeline.sinks.rows import event_payload



class _StoredEnvelope(msgspec.Struct):
    """An envelope as the worker stored it: the gateway's events and the classes ingest resolved beside
    them (:func:`pipeline.ingest.envelope.with_error_classes`; absent when no event had one)."""

    events: list[RequestEvent]
    error_classes: list[ErrorClassName | None] | None = None


_ENVELOPES = msgspec.json.Decoder(_StoredEnvelope)
_PARSE_OK = attrgetter("parse_ok")
_MISSING = attrgetter("missing_fields")

#: A ``request_events`` row as the sinks take it: ``(event, parse_ok, missing_fields)``.
StoredRow = tuple[RequestEvent, "bool | None", "list[str] | None"]


def stored_rows(events: Iterable[RequestEvent]) -> list[StoredRow]:
    """``(event, parse_ok, missing_fields)`` per event, the flags read from the event as ingest resolved
    them (:func:`~pipeline.ingest.structure.resolve_onto`); C-level zip, no rule applied.

    >>> e = RequestEvent(event_id="e", ts_ms=0, channel="c", route="r", status="ok", latency_ms=1.0,
    ...                  missing_fields=["a"], parse_ok=True)
    >>> stored_rows([e])[0][1:]
    (True, ['a'])
    """
    events = events if isinstance(events, list) else list(events)
    return list(zip(events, map(_PARSE_OK, events), map(_MISSING, events)))


def split_stored(envelopes: Sequence[tuple[int, bytes, int]], events: Sequence[RequestEvent],
                 owner: Sequence[int], accepted: Sequence[RequestEvent],
                 late: Sequence[RequestEvent], refused: Sequence[RequestEvent] = ()
                 ) -> tuple[list[StoredRow], list[tuple[bytes, int]]]:
    """Choose how a batch's ``accepted`` events are stored: ``(rows, envelopes)``.

    ``envelopes``: ``(message index, bytes, events)`` of the messages whose
    bytes may stand for their events (``Decoder.decode_many``; pass ``[]`` to
    store everything as rows); ``events`` / ``owner``: every decoded event
    and the index of its message; ``accepted``: what the engine counted;
    ``late`` / ``refused``: what it did not count (late events, events of new
    channels over the limit). An envelope with a late or refused event goes
    as rows of its accepted events (the caller leaves out of ``envelopes``
    the messages that held a re-sent duplicate). When every message is a whole envelope (the common case)
    no event is looked at; else each accepted event's message is found by
    identity. Returns the rows (:func:`stored_rows`) and the ``(bytes,
    events)`` of the envelopes to store whole, in message order.
    """
    if not envelopes:
        return stored_rows(accepted), []
    whole = {k: (raw, n) for k, raw, n in envelopes}
    own: dict[int, int] | None = None
    if late or refused:
        own = dict(zip(map(id, events), owner))
        for e in (*late, *refused):
            whole.pop(own[id(e)], None)
    if not accepted or len(whole) == len(set(owner)):
        return [], list(whole.values())
    own = own if own is not None else dict(zip(map(id, events), owner))
    return stored_rows(e for e in accepted if own[id(e)] not in whole), list(whole.values())


def envelopes_payload(envelopes: Sequence[tuple[bytes, int]]) -> tuple[bytes, int]:
    """One ``JSONEachRow`` payload of ``(envelope bytes, events)`` pairs (one envelope per line, each
    without a line break of its own) and its row count.

    >>> envelopes_payload([(b'{"events":[{}]}', 1), (b'{"events":[{},{}]}', 2)])
    (b'{"events":[{}]}\\n{"events":[{},{}]}', 3)
    """
    return b"\n".join(raw for raw, _ in envelopes), sum(n for _, n in envelopes)


def rows_of(payload: bytes) -> tuple[bytes, int]:
    """The ``request_events`` rows of an envelopes payload as :func:`~pipeline.sinks.rows.event_payload`
    encodes them, and their count: the events as msgspec decodes them (the last of a repeated key, as
    the pipeline counted them), ``(parse_ok, missing_fields)`` resolved by :func:`resolve_onto` (what the
    decoder did with them), each event's error class the one the decoder added beside the events
    (``"error_classes"``: resolved with the worker's policy patterns, which this process does not hold).

    Raises ``msgspec.DecodeError`` / ``msgspec.ValidationError`` for bytes that are not such envelopes.

    >>> rows_of(b'{"events":[{"event_id":"e","ts_ms":5,"channel":"c","route":"r","status":"ok",'
    ...         b'"latency_ms":1,"latency_ms":2,"missing_fields":[]}]}')
    (b'[[{"event_id":"e","ts_ms":5,"channel":"c","route":"r","status":"ok","latency_ms":2.0,\
"missing_fields":[],"parse_ok":true},true,[]]]', 1)
    """
    events = []
    for envelope in _ENVELOPES.decode_lines(payload):
        if envelope.error_classes is not None and len(envelope.error_classes) == len(envelope.events):
            for e, cls in zip(envelope.events, envelope.error_classes):
                e.error_class = cls  # the worker's class: wins over the built-in phrases below
        events.extend(envelope.events)
    resolve_onto(events)
    return event_payload(stored_rows(events)), len(events)


def salvage_into(rows_sink: Any) -> Callable[[bytes], None]:
    """A ``salvage`` for the envelopes' :class:`~pipeline.sinks.json_table.JsonTableSink`: write a refused
    payload's :func:`rows_of` at once through ``rows_sink.write_now`` (the ``request_events`` rows sink)."""

    def salvage(payload: bytes) -> None:
        rows_sink.write_now(rows_of(payload)[0])

    return salvage
