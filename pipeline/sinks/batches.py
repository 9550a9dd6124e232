"""Whole batch envelopes into ``request_events``: the gateway's messages as they arrived.

For an envelope ``{"events": [...]}`` whose every event the pipeline
accepted unchanged (:func:`pipeline.ingest.envelope.storable_envelope`, none
late: ``ProcessedBatch.envelopes``), the worker hands ClickHouse the
message's own bytes instead of encoding the events again: one envelope per
line, ``JSONEachRow`` into ``request_event_batches``, whose materialized
view writes one ``request_events`` row per event
(``infra/clickhouse/007_request_event_batches.sql``; ``parse_ok`` and
``missing_fields`` there by the rule of
:func:`~pipeline.ingest.structure.resolve_structure`). Encoding the rows
cost the worker's main thread a sizeable share of its time
(docs/THROUGHPUT.md, "Design measurements").

ClickHouse's JSON reader refuses a few inputs msgspec accepts (a key
repeated in an event: "JSON object contains duplicate key"); such a
payload is not dropped: :func:`rows_of` decodes its envelopes with msgspec,
as the pipeline did, and :func:`salvage_into` writes them as rows
(:class:`~pipeline.sinks.json_table.JsonTableSink` calls it).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import msgspec

from pipeline.contracts import TypedBatch
from pipeline.ingest.structure import resolve_structure
from pipeline.sinks.rows import event_payload


_ENVELOPES = msgspec.json.Decoder(TypedBatch)


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
    the pipeline counted them), ``(parse_ok, missing_fields)`` by :func:`resolve_structure`.

    Raises ``msgspec.DecodeError`` / ``msgspec.ValidationError`` for bytes that are not such envelopes.

    >>> rows_of(b'{"events":[{"event_id":"e","ts_ms":5,"channel":"c","route":"r","status":"ok",'
    ...         b'"latency_ms":1,"latency_ms":2,"missing_fields":[]}]}')
    (b'[[{"event_id":"e","ts_ms":5,"channel":"c","route":"r","status":"ok","latency_ms":2.0,"missing_fields":[]},true,[]]]', 1)
    """
    stored = [(e, *resolve_structure(e)) for envelope in _ENVELOPES.decode_lines(payload) for e in envelope.events]
    return event_payload(stored), len(stored)


def salvage_into(rows_sink: Any) -> Callable[[bytes], None]:
    """A ``salvage`` for the envelopes' :class:`~pipeline.sinks.json_table.JsonTableSink`: write a refused
    payload's :func:`rows_of` at once through ``rows_sink.write_now`` (the ``request_events`` rows sink)."""

    def salvage(payload: bytes) -> None:
        rows_sink.write_now(rows_of(payload)[0])

    return salvage
