"""Row builders: one tuple per ClickHouse row, in the column order of the DDL.

Timestamps are UTC epoch milliseconds (``int``), which clickhouse-connect
writes into ``DateTime64(3, 'UTC')`` exactly, with no local-time reading.
Column tuples (``*_COLUMNS``) name the columns in tuple order; the tables are
defined in ``infra/clickhouse/``.
"""

from __future__ import annotations

import time
from itertools import compress, repeat
from operator import is_, itemgetter
from typing import Sequence

import msgspec

from pipeline.contracts import RequestEvent, Verdict, carries_texts, encode
from pipeline.storage import DATABASE

EVENTS_TABLE = f"{DATABASE}.request_events"
#: Where ``request_events`` rows are inserted (Null engine, DDL 014; its view writes ``request_events``).
EVENTS_INPUT_TABLE = f"{DATABASE}.request_events_input_v2"
#: Where whole batch envelopes are inserted (Null engine, DDL 014; its view writes ``request_events``; :mod:`.batches`).
EVENT_BATCHES_TABLE = f"{DATABASE}.request_event_envelopes_v2"
VERDICTS_TABLE = f"{DATABASE}.channel_verdicts"
QUALITY_SCORES_TABLE = f"{DATABASE}.quality_scores"
QUALITY_LABELS_TABLE = f"{DATABASE}.quality_labels"
OVERRIDES_TABLE = f"{DATABASE}.channel_overrides"
#: The sinks' tables by short name, in flush order (``ClickHouseSink`` attributes; ``ProcessSink`` counters);
#: ``event_batches``: ``request_events`` rows that come as whole envelopes (:mod:`pipeline.sinks.batches`).
TABLE_NAMES = ("events", "event_batches", "verdicts", "quality_scores", "quality_labels", "overrides")

EVENT_COLUMNS: tuple[str, ...] = (
    "event_id", "ts", "channel", "route", "tier", "status", "latency_ms", "ttft_ms",
    "max_stream_gap_ms", "input_tokens", "output_tokens", "cost_usd", "quota_remaining",
    "http_status", "error_type", "gateway_id", "trace_id", "parse_ok", "missing_fields",
    "ingested_at", "error_message", "retry_after_s", "account", "error_class",
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
#: ``channel_overrides`` rows: :func:`pipeline.stream.control.audit_row` (``key_id``: DDL 013).
OVERRIDE_COLUMNS: tuple[str, ...] = (
    "override_key", "action", "kind", "channel", "route", "weight", "by", "reason", "set_ts", "expires_ts", "at",
    "ingested_at", "key_id",
)  # fmt: skip

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
    ``error_class`` is the event's as ingest resolved it (:mod:`pipeline.ingest.error_class`),
    ``""`` when None.

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
        event.error_message,
        _opt_float(event.retry_after_s),
        event.account,
        event.error_class or "",
    )


_FIRST, _SECOND, _THIRD = itemgetter(0), itemgetter(1), itemgetter(2)
_JSON = msgspec.json.Encoder()


def event_payload(stored: Sequence[tuple[RequestEvent, bool | None, Sequence[str] | None]]) -> bytes:
    """``request_events`` rows of a whole batch as one JSON array for ``request_events_input``.

    ``stored``: ``(event, parse_ok, missing_fields)`` tuples as in
    :func:`event_row` (``missing_fields`` None = none). Each row is
    ``[event, parse_ok, missing_fields]`` with the event as msgspec encodes
    it, minus its texts (not stored); ClickHouse turns them into the values
    :func:`event_row` gives, with ``ingested_at`` the time of the insert (the
    view in ``infra/clickhouse/014_error_fields.sql``, as 006). No Python
    per value (:class:`pipeline.sinks.json_table.JsonTableSink`).

    Raises ``ValueError`` like :func:`event_row` (nothing encoded).

    >>> e = RequestEvent(event_id="e1", ts_ms=5, channel="c", route="r", status="ok", latency_ms=1.5,
    ...                  response_text="long text")
    >>> event_payload([(e, True, [])])
    b'[[{"event_id":"e1","ts_ms":5,"channel":"c","route":"r","status":"ok","latency_ms":1.5},true,[]]]'
    """
    refuse_unchecked_missing(stored)
    cut = list(compress(range(len(stored)), carries_texts(map(_FIRST, stored))))
    if cut:  # texts are not stored: do not encode, ship and parse them (a short ``expected_fields`` list
        # costs less to encode and skip than a copy of the event without it)
        stored = list(stored)
        for i in cut:
            e, ok, missing = stored[i]
            stored[i] = (msgspec.structs.replace(e, response_text=None, prompt_text=None), ok, missing)
    return _JSON.encode(stored)


def refuse_unchecked_missing(stored: Sequence[tuple[RequestEvent, bool | None, Sequence[str] | None]]) -> None:
    """Raise :func:`event_row`'s ``ValueError`` if a triple has missing fields but ``parse_ok`` None.

    One C-level scan per batch; rows are only built again for the explanation.

    >>> refuse_unchecked_missing([("e", True, ["a"]), ("e", None, None)])
    """
    if any(compress(map(_THIRD, stored), map(is_, map(_SECOND, stored), repeat(None)))):  # missing but unchecked
        for e, ok, miss in stored:
            if ok is None and miss:
                event_row(e, ok, miss, 0)  # raises the explanatory ValueError


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
