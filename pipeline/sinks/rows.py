"""Row builders: one tuple per ClickHouse row, in the column order of the DDL.

Timestamps are UTC epoch milliseconds (``int``), which clickhouse-connect
writes into ``DateTime64(3, 'UTC')`` exactly, with no local-time reading.
Column tuples (``*_COLUMNS``) name the columns in tuple order; the tables are
defined in ``infra/clickhouse/``.
"""

from __future__ import annotations

import time
from typing import Sequence

import msgspec

from pipeline.contracts import RequestEvent, Verdict, encode
from pipeline.storage import DATABASE

EVENTS_TABLE = f"{DATABASE}.request_events"
VERDICTS_TABLE = f"{DATABASE}.channel_verdicts"
QUALITY_SCORES_TABLE = f"{DATABASE}.quality_scores"
QUALITY_LABELS_TABLE = f"{DATABASE}.quality_labels"

EVENT_COLUMNS: tuple[str, ...] = (
    "event_id", "ts", "channel", "route", "tier", "status", "latency_ms", "ttft_ms",
    "max_stream_gap_ms", "input_tokens", "output_tokens", "cost_usd", "quota_remaining",
    "http_status", "error_type", "gateway_id", "trace_id", "parse_ok", "missing_fields",
    "ingested_at",
)  # fmt: skip
VERDICT_COLUMNS: tuple[str, ...] = (
    "channel", "route", "state", "weight", "reasons", "metrics", "ts", "seq", "schema_version",
    "ingested_at",
)  # fmt: skip
QUALITY_SCORE_COLUMNS: tuple[str, ...] = (
    "event_id", "ts", "channel", "route", "score", "model_version", "response_text", "prompt_text",
    "scored_at",
)  # fmt: skip
QUALITY_LABEL_COLUMNS: tuple[str, ...] = ("label_id", "prompt", "response", "label", "source", "imported_at")

#: Default cap on stored response/prompt text, in characters.
MAX_TEXT_CHARS = 2000


def now_ms() -> int:
    """Wall-clock UTC epoch milliseconds (for ``ingested_at``/``scored_at``)."""
    return time.time_ns() // 1_000_000


def event_row(
    event: RequestEvent,
    parse_ok: bool | None,
    missing_fields: Sequence[str],
    ingested_ms: int,
) -> tuple:
    """Build a ``request_events`` row (order :data:`EVENT_COLUMNS`).

    ``parse_ok``: True/False when the response structure was checked (by the
    gateway's ``missing_fields`` or the pipeline's own parse), None when not
    checked (no expected fields). ``missing_fields``: expected fields the
    response lacked. ``ingested_ms``: UTC epoch ms when the pipeline stored it.

    Raises ``ValueError`` when ``missing_fields`` is non-empty for an
    unchecked event (``parse_ok is None``): the minute stats would not count it.
    """
    if parse_ok is None and missing_fields:
        raise ValueError(
            f"event {event.event_id!r}: missing_fields {list(missing_fields)!r} given with parse_ok=None "
            "(pass parse_ok=True/False for a checked response)"
        )
    return (
        event.event_id,
        event.ts_ms,
        event.channel,
        event.route,
        event.tier,
        event.status,
        float(event.latency_ms),
        _opt_float(event.ttft_ms),
        _opt_float(event.max_stream_gap_ms),
        event.input_tokens,
        event.output_tokens,
        _opt_float(event.cost_usd),
        _opt_float(event.quota_remaining),
        event.http_status,
        event.error_type,
        event.gateway_id,
        event.trace_id,
        None if parse_ok is None else int(bool(parse_ok)),
        list(missing_fields),
        ingested_ms,
    )


#: Columns a ``request_events`` JSON-lines insert names (:func:`event_lines`): the event's own keys, then
#: ``parse_ok``/``missing_fields`` as resolved and ``ingested_ms``. ``ts_ms`` and ``ingested_ms`` are
#: EPHEMERAL columns whose values fill ``ts`` and ``ingested_at`` (``infra/clickhouse/002_request_events.sql``).
EVENT_LINE_COLUMNS: tuple[str, ...] = (
    "event_id", "ts_ms", "channel", "route", "tier", "status", "latency_ms", "ttft_ms",
    "max_stream_gap_ms", "input_tokens", "output_tokens", "cost_usd", "quota_remaining",
    "http_status", "error_type", "gateway_id", "trace_id", "parse_ok", "missing_fields", "ingested_ms",
)  # fmt: skip
#: Format settings of the JSON-lines insert: keys without a column (texts, ``expected_fields``) are
#: skipped, floats are parsed exactly (ClickHouse's fast float parser may be 1 ulp off), and
#: ``true``/``false`` fill ``parse_ok`` (UInt8). ClickHouse docs: Formats → JSONEachRow, settings.
EVENT_LINE_SETTINGS = {
    "input_format_skip_unknown_fields": 1,
    "precise_float_parsing": 1,
    "input_format_json_read_bools_as_numbers": 1,
}
_LINE_ENCODER = msgspec.json.Encoder()


def event_lines(
    stored: Sequence[tuple[RequestEvent, bool | None, Sequence[str] | None]],
    ingested_ms: int,
) -> bytes:
    """``request_events`` rows of a whole batch as newline-delimited JSON (ClickHouse ``JSONEachRow``).

    ``stored``: ``(event, parse_ok, missing_fields)`` triples as in
    :func:`event_row` (``missing_fields`` None = none); ``ingested_ms``: UTC
    epoch ms of every row. Insert with the columns :data:`EVENT_LINE_COLUMNS`
    and :data:`EVENT_LINE_SETTINGS`; the table then holds the same values as
    :func:`event_row` gives. The events are encoded by msgspec in C (~0.5 µs
    per event against ~3 µs to build Arrow columns in Python, README
    "Throughput"); ClickHouse parses the lines on its own threads. An event
    whose stored ``parse_ok``/``missing_fields`` differ from its own fields,
    or that carries texts (not stored in this table), is encoded from a
    copy holding the stored values and no texts.

    Raises ``ValueError`` like :func:`event_row` (nothing encoded).
    """
    events = [e if ok is None and not miss and e.parse_ok is None and e.missing_fields is None
              and e.response_text is None and e.prompt_text is None else _stored_copy(e, ok, miss)
              for e, ok, miss in stored]
    # JSON strings hold no raw newline, so "}\n" only ends a line: append the ingest time to every row.
    return _LINE_ENCODER.encode_lines(events).replace(b"}\n", b',"ingested_ms":%d}\n' % ingested_ms)


def _stored_copy(event: RequestEvent, parse_ok: bool | None, missing_fields: Sequence[str] | None) -> RequestEvent:
    """``event`` with the stored structure check in its own fields and without texts (see :func:`event_lines`)."""
    if parse_ok is None and missing_fields:
        event_row(event, parse_ok, missing_fields, 0)  # raises the explanatory ValueError
    return msgspec.structs.replace(
        event, parse_ok=None if parse_ok is None else bool(parse_ok),
        missing_fields=list(missing_fields) if missing_fields else None,
        response_text=None, prompt_text=None, expected_fields=None)


def verdict_row(v: Verdict, ingested_ms: int | None = None) -> tuple:
    """Build a ``channel_verdicts`` row (order :data:`VERDICT_COLUMNS`).

    ``metrics`` is stored as compact JSON with sorted keys, so the same verdict
    always yields the same row. ``ingested_ms`` defaults to now (UTC epoch ms).
    """
    return (
        v.channel,
        v.route,
        v.state,
        float(v.weight),
        list(v.reasons),
        encode_metrics(v.metrics),
        v.ts_ms,
        v.seq,
        v.schema_version,
        now_ms() if ingested_ms is None else ingested_ms,
    )


def encode_metrics(metrics: dict) -> str:
    """Encode a verdict's ``metrics`` dict as compact JSON with sorted keys.

    >>> encode_metrics({"b": 1, "a": 0.5})
    '{"a":0.5,"b":1}'
    """
    return encode(_sorted(metrics)).decode()


def quality_row(
    event_id: str,
    ts_ms: int,
    channel: str,
    route: str,
    score: float,
    model_version: str,
    response_text: str | None,
    prompt_text: str | None,
    scored_ms: int | None = None,
    max_text_chars: int = MAX_TEXT_CHARS,
) -> tuple:
    """Build a ``quality_scores`` row (order :data:`QUALITY_SCORE_COLUMNS`).

    ``ts_ms``: event time (UTC epoch ms) of the scored request; ``score``: the
    quality model's score; texts are cut to ``max_text_chars`` characters
    (None is stored as ''). ``scored_ms`` defaults to now.
    """
    return (
        event_id,
        ts_ms,
        channel,
        route,
        float(score),
        model_version,
        (response_text or "")[:max_text_chars],
        (prompt_text or "")[:max_text_chars],
        now_ms() if scored_ms is None else scored_ms,
    )


def label_row(
    label_id: str,
    prompt: str,
    response: str,
    label: int,
    source: str,
    imported_ms: int | None = None,
) -> tuple:
    """Build a ``quality_labels`` row (order :data:`QUALITY_LABEL_COLUMNS`).

    Raises ``ValueError`` when ``label`` is outside UInt8 (0..255).
    """
    if not 0 <= int(label) <= 255:
        raise ValueError(f"label {label!r} of {label_id!r} is outside 0..255 (UInt8)")
    return (label_id, prompt, response, int(label), source, now_ms() if imported_ms is None else imported_ms)


def _opt_float(value: float | None) -> float | None:
    return None if value is None else float(value)


def _sorted(value: object) -> object:
    if isinstance(value, dict):
        return {k: _sorted(value[k]) for k in sorted(value)}
    return value
