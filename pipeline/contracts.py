"""Typed message classes mirroring ``schemas/`` and the one JSON codec.

The JSON Schemas in ``schemas/`` are the language-neutral contract (SPEC §3);
these msgspec Structs are the Python side of it, and
``tests/unit/test_contracts.py`` checks the two agree. Field names are the
contract; units are in the names (``_ms``, ``_usd``).
"""

from __future__ import annotations

from itertools import repeat
from operator import attrgetter, ne
from typing import Annotated, Iterable, Iterator, Literal, Sequence, Union

import msgspec

SCHEMA_VERSION = 1

#: Error classes (SPEC §4.1; :mod:`pipeline.ingest.error_class`).
ErrorClassName = Literal["caller", "credential", "quota_exhausted", "rate_limited", "transient"]
Status = Literal["ok", "error", "timeout", "rate_limited", "cancelled", "filtered"]
State = Literal["healthy", "degraded", "open", "half_open", "recovering", "no_data"]

#: Statuses that count as upstream failures (SPEC §4.1). ``cancelled`` is a
#: client decision and ``filtered`` a content-policy outcome: neither is an
#: upstream failure by itself.
FAILURE_STATUSES: frozenset[str] = frozenset({"error", "timeout", "rate_limited"})

#: Largest finite double: the upper bound makes msgspec itself refuse ``inf`` (and NaN fails ``ge``) in C
#: on decode and ``msgspec.convert``, instead of a Python check per event (JSON cannot spell them anyway).
DBL_MAX = 1.7976931348623157e308
NonNegFloat = Annotated[float, msgspec.Meta(ge=0, le=DBL_MAX)]
NonNegInt = Annotated[int, msgspec.Meta(ge=0)]
#: Token counts: stored as ``UInt32`` in ClickHouse (``request_events``), so a
#: larger value is rejected at ingest (``out_of_range``) instead of failing the
#: insert later and stalling the worker on a poison message.
TokenCount = Annotated[int, msgspec.Meta(ge=0, le=4_294_967_295)]
Share = Annotated[float, msgspec.Meta(ge=0, le=1)]
ShortStr = Annotated[str, msgspec.Meta(min_length=1, max_length=512)]
#: ``retry_after_s``: at most one day (a larger Retry-After is absurd: ``out_of_range``).
RetryAfter = Annotated[float, msgspec.Meta(ge=0, le=86_400)]
#: ``error_message`` as a gateway may send it: longer is ``out_of_range``; ingest keeps the first
#: 512 characters (:data:`pipeline.ingest.error_class.MAX_MESSAGE_CHARS`).
ErrorMessage = Annotated[str, msgspec.Meta(max_length=65_536)]


class ExpectedCall(msgspec.Struct, forbid_unknown_fields=False):
    """One expected tool call: the function name and its required arguments."""

    function: str
    required: list[str] = []


class RequestEvent(msgspec.Struct, omit_defaults=True, gc=False):
    """One upstream model request as a gateway reports it (SPEC §3).

    Not tracked by Python's cycle collector (``gc=False``, msgspec docs "Structs →
    Disabling Garbage Collection"): an event only holds strings, numbers and lists
    of them, so it can never be part of a reference cycle, and with half a million
    events alive per batch this saves most of the collector's traversal time
    (docs/THROUGHPUT.md, "Design measurements"). Do not store objects that refer back to the event in its fields.

    ``ts_ms`` is UTC epoch milliseconds when the request finished (event
    time), >= 0. ``latency_ms`` >= 0. ``expected_fields`` is either a list of
    field names (JSON-object answer) or a list of :class:`ExpectedCall`
    (tool-call answer), never a mix. ``missing_fields`` and the optional
    ``parse_ok`` are a structure check already done (by the gateway, or by the
    ingest decoder before it truncates a long ``response_text``);
    ``parse_ok`` absent with ``missing_fields`` present means "parsed".
    ``error_message`` (the provider's error code or message, at most 65,536
    characters; stored cut to 512), ``retry_after_s`` (0..86,400 s: the
    provider's Retry-After), ``account`` (1..512 characters: the credential /
    quota pool behind the channel) and ``error_class`` (SPEC §4.1: the
    gateway's explicit class; ingest sets it for every failed event and clears
    it for any other, :func:`pipeline.ingest.error_class.resolve_errors`).

    Raises ``msgspec.ValidationError`` on decode for a wrong type, a missing
    required field, a value out of range, a non-finite number or a mixed
    ``expected_fields`` list (the constructor itself checks only the last:
    msgspec validates constraints on decode and ``msgspec.convert``).
    """

    event_id: ShortStr
    ts_ms: NonNegInt
    channel: ShortStr
    route: ShortStr
    status: Status
    latency_ms: NonNegFloat
    gateway_id: str | None = None
    trace_id: str | None = None
    tier: Literal["free", "paid"] | None = None
    http_status: Annotated[int, msgspec.Meta(ge=0, le=999)] | None = None
    error_type: str | None = None
    ttft_ms: NonNegFloat | None = None
    max_stream_gap_ms: NonNegFloat | None = None
    input_tokens: TokenCount | None = None
    output_tokens: TokenCount | None = None
    cost_usd: NonNegFloat | None = None
    quota_remaining: Share | None = None
    expected_fields: list[Union[str, ExpectedCall]] | None = None
    missing_fields: list[str] | None = None
    parse_ok: bool | None = None
    response_text: str | None = None
    prompt_text: str | None = None
    error_message: ErrorMessage | None = None
    retry_after_s: RetryAfter | None = None
    account: ShortStr | None = None
    error_class: ErrorClassName | None = None

    def __post_init__(self) -> None:
        if self.expected_fields:
            kinds = {isinstance(f, str) for f in self.expected_fields}
            if len(kinds) > 1:
                raise ValueError("expected_fields mixes field names and {function, required} objects")


class Batch(msgspec.Struct):
    """Batch envelope: several request events in one Kafka message (SPEC §3).

    ``events`` holds each element's original JSON bytes (at least one); the
    ingest decoder validates them one by one (``pipeline.ingest.decode``).
    """

    events: Annotated[list[msgspec.Raw], msgspec.Meta(min_length=1)]


class TypedBatch(msgspec.Struct):
    """Batch envelope with every element decoded as a :class:`RequestEvent` (at least one).

    The ingest decoder's fast path (``pipeline.ingest.decode``) and the
    sink's re-encoding of an envelope ClickHouse refused (``pipeline.sinks.batches``).
    """

    events: Annotated[list[RequestEvent], msgspec.Meta(min_length=1)]


#: Verdict metric of a suspect channel (:mod:`pipeline.engine.suspects`): the failure run that made it suspect;
#: its ``route_share`` is then 0 while its state and weight stay. Read by the router table, the override table,
#: the board and the scorecard: one name for all of them.
SUSPECT_METRIC = "suspect_run"


class Verdict(msgspec.Struct, omit_defaults=False):
    """Channel-health verdict published on ``channel.health`` (SPEC §3).

    ``weight`` in [0, 1] is the recommended traffic-share multiplier;
    ``metrics`` holds the numbers behind ``reasons``; ``ts_ms`` is the event
    time of the evaluation; ``seq`` increases by one per published verdict of
    the channel.

    ``override`` (SPEC §3): present only while an operator's override is in
    force (:mod:`pipeline.policy.override`): ``kind``, ``by``, ``reason``,
    ``set_ts_ms`` and ``expires_ts_ms`` (UTC epoch ms, wall time), the forced
    ``weight``, the forced ``state`` (kinds ``open``/``healthy``) or the frozen
    ``route``. Absent (``msgspec.UNSET``, not encoded) otherwise.
    """

    channel: str
    route: str
    state: State
    weight: Share
    reasons: list[str]
    metrics: dict[str, Union[float, int, str, None]]
    ts_ms: NonNegInt
    seq: NonNegInt
    schema_version: int = SCHEMA_VERSION
    override: Union[dict[str, Union[float, int, str, None]], msgspec.UnsetType] = msgspec.UNSET


_encoder = msgspec.json.Encoder()
_verdict_decoder = msgspec.json.Decoder(Verdict)


_TEXTS = attrgetter("response_text", "prompt_text")


def carries_texts(events: Iterable[RequestEvent]) -> Iterator[bool]:
    """Per event, whether it carries a ``response_text`` or a ``prompt_text`` (a C-level map: no Python per event).

    >>> e = RequestEvent(event_id="e", ts_ms=0, channel="c", route="r", status="ok", latency_ms=1.0)
    >>> list(carries_texts([e, msgspec.structs.replace(e, prompt_text="p")]))
    [False, True]
    """
    return map(ne, map(_TEXTS, events), repeat((None, None)))


_RESPONSE = attrgetter("response_text")
_PROMPT = attrgetter("prompt_text")


def any_texts(events: Sequence[RequestEvent]) -> bool:
    """Whether any of ``events`` carries a ``response_text`` or a ``prompt_text`` (:func:`carries_texts`
    for the whole batch: one C-level scan per field and a count, no tuple per event).

    >>> e = RequestEvent(event_id="e", ts_ms=0, channel="c", route="r", status="ok", latency_ms=1.0)
    >>> any_texts([e]), any_texts([e, msgspec.structs.replace(e, prompt_text="p")])
    (False, True)
    """
    n = len(events)
    return list(map(_RESPONSE, events)).count(None) != n or list(map(_PROMPT, events)).count(None) != n


def encode(obj: object) -> bytes:
    """Encode a Struct (or plain JSON-able value) to compact JSON bytes."""
    return _encoder.encode(obj)


def decode_verdict(raw: bytes) -> Verdict:
    """Decode one ``channel.health`` message.

    Raises ``msgspec.DecodeError`` / ``msgspec.ValidationError`` on bad bytes.
    """
    return _verdict_decoder.decode(raw)
