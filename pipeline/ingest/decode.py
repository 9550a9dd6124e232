"""Kafka message bytes -> validated request events + dead letters (SPEC §3).

A ``gateway.requests`` message holds one request event (a JSON object) or a
batch envelope ``{"events": [...]}`` (any top-level object with an ``events``
key is taken as a batch). Validation is the msgspec decode into
:class:`pipeline.contracts.RequestEvent` plus the checks JSON Schema cannot
express: ``ts_ms`` within ``[now - max_age_ms, now + max_future_ms]``, and
``event_id`` unique within a batch (a repeat of an id already kept from the
same batch is dead-lettered as ``duplicate_in_batch``).

Bad input never raises and never stops the pipeline: each bad message, or
each bad element of a batch, becomes one :class:`DeadLetter` with a reason
code from :mod:`pipeline.ingest.reasons`; the good events of a batch are kept.
So for a batch of N >= 1 elements ``len(events) + len(dead_letters) == N``,
and any other message yields exactly one event or one dead letter.

Every accepted event leaves with its structure verdict (SPEC §4.4) resolved
onto its ``parse_ok`` / ``missing_fields``
(:func:`pipeline.ingest.structure.resolve_onto`): the one place the rule is
applied; the engine and the sinks only read the two fields.

Fast path: a typed msgspec decode of the whole message (batch or event);
per-element decoding happens only when that fails.
"""

from __future__ import annotations

from itertools import compress, repeat
from operator import attrgetter
from typing import Any, Callable, NamedTuple, Sequence

import msgspec

from pipeline.contracts import Batch, RequestEvent, TypedBatch
from pipeline.ingest import reasons as R
from pipeline.ingest.counters import DecodeCounters
from pipeline.ingest.dead_letter import DeadLetter
from pipeline.ingest.error_class import Classifier
from pipeline.ingest.envelope import storable_envelope, with_error_classes
from pipeline.ingest.limits import DAY_MS, HOUR_MS, EventLimits
from pipeline.ingest.reasons import classify_validation_error
from pipeline.ingest.structure import resolve_onto

_TS = attrgetter("ts_ms")
_ID = attrgetter("event_id")

__all__ = ["Decoder", "Decoded", "DecodeResult", "DeadLetter", "DecodeCounters"]

_MAX_ID_CHARS = 512
_JSON_TYPES = {dict: "object", list: "array", str: "string", int: "number", float: "number",
               bool: "boolean", type(None): "null"}


class DecodeResult(msgspec.Struct):
    """What one Kafka message decoded to: accepted ``events`` (in message
    order) and ``dead_letters`` (in message order).

    ``envelope``: the message's bytes when they can stand for ``events``
    as they are (see :func:`pipeline.ingest.envelope.storable_envelope`), their
    structure flags included (resolving changed none:
    :func:`pipeline.ingest.structure.resolve_onto` returned 0), with the
    events' error classes added beside them
    (:func:`pipeline.ingest.envelope.with_error_classes`), else None.
    """

    events: list[RequestEvent]
    dead_letters: list[DeadLetter]
    envelope: bytes | None = None


class Decoded(NamedTuple):
    """What :meth:`Decoder.decode_many` made of several messages.

    ``events``: accepted events in message order; ``owner[i]``: the index of
    the message ``events[i]`` came from; ``dead_letters``: in message order;
    ``envelopes``: ``(message index, bytes, events)`` of the messages whose
    bytes stand for their events as they are (:attr:`DecodeResult.envelope`);
    ``fields``: what ``read`` returned for each message's events, in message
    order (``read`` is called right after a message is decoded, while its
    events are in the CPU's cache), or None (no ``read`` given, or no events).
    """

    events: list[RequestEvent]
    owner: list[int]
    dead_letters: list[DeadLetter]
    envelopes: list[tuple[int, bytes, int]]
    fields: list[Any] | None = None


class _IdProbe(msgspec.Struct):
    """Reads only ``event_id`` from a rejected element (for the dead letter)."""

    event_id: Any = None


class Decoder(EventLimits):
    """Validating decoder for ``gateway.requests`` messages (SPEC §3).

    Limits (all keyword-only, ints > 0; ``None`` switches a time check off,
    e.g. to replay old traces with their original timestamps):

    ``max_message_bytes`` (default 1,000,000): larger messages -> ``too_large``.
    ``max_future_ms`` (default 1 h): ``ts_ms > now_ms + max_future_ms`` -> ``ts_in_future``.
    ``max_age_ms`` (default 7 days, ``CHANNEL_HEALTH_MAX_EVENT_AGE``): ``ts_ms < now_ms - max_age_ms``
    -> ``ts_too_old``; with :attr:`age_clock_ms` set (replay), measured from it instead of ``now_ms``.
    ``max_text_chars`` (default 8,000): longer ``response_text`` /
    ``prompt_text`` are cut to this many characters, not rejected. When a
    ``response_text`` that the structure check (SPEC §4.4) would judge is cut,
    the check runs first on the full text and its result is stored in the
    event's ``missing_fields`` / ``parse_ok``.

    ``counters``: a :class:`DecodeCounters` to update (a new one by default),
    exposed as ``self.counters``. ``classifier``: the error classes (SPEC §4.1) of the policy
    (:attr:`pipeline.policy.defaults.PolicyConfig.classifier`: its ``[error_classes.<provider>]``
    patterns); default the built-in phrases only.

    Raises ``ValueError`` for a limit that is not a positive int.
    """

    def __init__(
        self,
        *,
        max_message_bytes: int = 1_000_000,
        max_future_ms: int | None = HOUR_MS,
        max_age_ms: int | None = 7 * DAY_MS,
        max_text_chars: int = 8_000,
        counters: DecodeCounters | None = None,
        classifier: Classifier | None = None,
    ) -> None:
        for name, value, optional in (
            ("max_message_bytes", max_message_bytes, False),
            ("max_future_ms", max_future_ms, True),
            ("max_age_ms", max_age_ms, True),
            ("max_text_chars", max_text_chars, False),
        ):
            if value is None and optional:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        self.max_message_bytes = max_message_bytes
        self.max_future_ms = max_future_ms
        self.max_age_ms = max_age_ms
        self.max_text_chars = max_text_chars
        #: Replay mode: when set, the age bound runs from this event time (UTC epoch ms) instead of ``now_ms``
        #: (the caller keeps it at the newest event accepted); the future bound stays on ``now_ms``.
        self.age_clock_ms: int | None = None
        self.counters = counters if counters is not None else DecodeCounters()
        self.classifier = classifier
        self._event_decoder = msgspec.json.Decoder(RequestEvent)
        self._typed_batch_decoder = msgspec.json.Decoder(TypedBatch)
        self._raw_batch_decoder = msgspec.json.Decoder(Batch)
        self._probe_decoder = msgspec.json.Decoder(_IdProbe)
        self._any_decoder = msgspec.json.Decoder()

    # ------------------------------------------------------------------ API

    def decode(self, raw: bytes, now_ms: int) -> DecodeResult:
        """Decode one Kafka message value.

        ``raw``: the message value (``bytes``, ``bytearray``, ``memoryview``;
        ``None`` for a tombstone -> ``empty_message``). ``now_ms``: the
        decoder's clock, UTC epoch ms, for the ``ts_ms`` sanity window.
        Updates ``self.counters``. Never raises: an unexpected internal error
        becomes one ``internal_error`` dead letter holding the input.
        """
        try:
            result = self._decode(raw, now_ms)
            if resolve_onto(result.events, self.classifier) and result.envelope is not None:
                result.envelope = None  # its bytes no longer state the flags stored: rows instead
            if result.envelope is not None:  # the error classes go beside the bytes (SPEC 4.1)
                result.envelope = with_error_classes(result.envelope, result.events)
        except Exception as exc:  # noqa: BLE001 - bad input must never stop the stream
            detail = f"decoder error {type(exc).__name__}: {exc}"[: R.MAX_DETAIL_CHARS]
            result = DecodeResult([], [DeadLetter(R.INTERNAL_ERROR, detail, _safe_bytes(raw))])
        counters = self.counters
        counters.messages += 1
        counters.events += len(result.events)
        for dead in result.dead_letters:
            counters.add_dead_letter(dead.reason)
        return result

    def decode_many(self, raws: Sequence[Any], now_ms: int,
                    read: Callable[[list[RequestEvent]], Any] | None = None) -> Decoded:
        """Decode several message values, in order (see :class:`Decoded`).

        The results and counters are exactly those of :meth:`decode` called
        per message (tests pin it): one-event messages that decode cleanly
        take a lean path (one msgspec call each, the time window checked on
        the batch's min/max), everything else (batch envelopes, anything that
        fails a check) goes through :meth:`decode`. Never raises on bad input.

        ``read``: called with the accepted events of each message that has
        some, right after it is decoded (the lean path's events in one call);
        its results are :attr:`Decoded.fields`. When some messages take the
        lean path and others not, ``fields`` is None (the order would need
        merging; such batches hold bad messages and are rare). An exception
        of ``read`` propagates.
        """
        fast, fast_at, full = self._lean_singles(raws, now_ms)
        if not full:
            return Decoded(fast, fast_at, [], [], [read(fast)] if read is not None and fast else None)
        parts: list[Any] | None = [] if read is not None and not fast else None
        results: dict[int, DecodeResult] = {}
        res: DecodeResult | None
        for k in full:
            res = results[k] = self.decode(raws[k], now_ms)
            if parts is not None and res.events:
                parts.append(read(res.events))  # type: ignore[misc]
        envelopes = [(k, res.envelope, len(res.events)) for k, res in results.items() if res.envelope is not None]
        events: list[RequestEvent] = []
        owner: list[int] = []
        dead: list[DeadLetter] = []
        at = 0
        for k in range(len(raws)):
            res = results.get(k)
            if res is None:
                if at < len(fast_at) and fast_at[at] == k:
                    events.append(fast[at])
                    owner.append(k)
                    at += 1
                continue
            events.extend(res.events)
            owner.extend(repeat(k, len(res.events)))
            dead.extend(res.dead_letters)
        return Decoded(events, owner, dead, envelopes, parts or None)

    def _lean_singles(self, raws: Sequence[Any], now_ms: int) -> tuple[list[RequestEvent], list[int], list[int]]:
        """The lean path of :meth:`decode_many`: ``(events, their message indices, indices of the messages
        left for the full path)``; counts the messages it accepted."""
        fast: list[RequestEvent] = []
        fast_at: list[int] = []
        full: list[int] = []
        decode_one = self._event_decoder.decode
        limit = self.max_message_bytes
        for k, raw in enumerate(raws):
            # Same gates as _decode: bytes within the size limit, ASCII (no UTF-8 check needed), not a batch
            if type(raw) is bytes and len(raw) <= limit and raw.isascii() and b'"events"' not in raw:
                try:
                    fast.append(decode_one(raw))
                    fast_at.append(k)
                    continue
                except Exception:  # noqa: BLE001 - the full path finds out what is wrong and dead-letters it
                    pass
            full.append(k)

        def demote(keep: list[bool]) -> None:
            """Leave the events not kept to the full path."""
            nonlocal fast, fast_at, full
            full = sorted(full + [k for k, ok in zip(fast_at, keep) if not ok])
            fast, fast_at = list(compress(fast, keep)), list(compress(fast_at, keep))

        if fast:
            ts = list(map(_TS, fast))
            if not self._all_in_window(ts, now_ms):
                demote([self._time_problem(t, now_ms) is None for t in ts])
        failed: list[int] = []  # decode() turns such a message into an internal_error dead letter
        self._cut_long_texts(fast, failed)
        try:
            resolve_onto(fast, self.classifier)
        except Exception:  # noqa: BLE001 - find the event; decode() dead-letters it
            for i, event in enumerate(fast):
                try:
                    resolve_onto([event], self.classifier)
                except Exception:  # noqa: BLE001
                    failed.append(i)
        if failed:
            keep = [True] * len(fast)
            for i in failed:
                keep[i] = False
            demote(keep)
        self.counters.messages += len(fast)
        self.counters.events += len(fast)
        return fast, fast_at, full

    # ------------------------------------------------------------ internals

    def _decode(self, raw: Any, now_ms: int) -> DecodeResult:
        """:meth:`decode` without the safety net and the counting."""
        if raw is None:
            return _rejected(R.EMPTY_MESSAGE, "message has no value (tombstone)", b"")
        if isinstance(raw, str):
            raw = raw.encode("utf-8", "surrogatepass")
        elif isinstance(raw, (bytearray, memoryview)):
            raw = bytes(raw)
        elif not isinstance(raw, bytes):
            return _rejected(R.WRONG_TYPE, f"message: expected bytes, got {type(raw).__name__}", b"")
        size = len(raw)
        if size > self.max_message_bytes:
            return _rejected(R.TOO_LARGE, f"message is {size} bytes; the limit is {self.max_message_bytes}", raw)
        if not raw or raw.isspace():
            return _rejected(R.INVALID_JSON, "message is empty", raw)
        if not raw.isascii():  # msgspec skips unknown keys without checking their UTF-8: check it here
            try:
                raw.decode("utf-8")
            except UnicodeDecodeError as bad:
                return _rejected(R.NOT_UTF8, f"message is not valid UTF-8 (byte {bad.start}: {bad.reason})", raw)
        if b'"events"' in raw:
            try:
                batch = self._typed_batch_decoder.decode(raw)
            except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
                pass
            else:
                result = self._finish_batch(batch.events, raw, None, now_ms)
                if storable_envelope(raw, result.events, result.dead_letters):
                    result.envelope = raw
                return result
        else:
            try:
                event = self._event_decoder.decode(raw)
            except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
                pass
            else:
                return self._finish_single(event, raw, now_ms)
        return self._slow(raw, now_ms)

    def _slow(self, raw: bytes, now_ms: int) -> DecodeResult:
        """Find out what is wrong: JSON, envelope, or which element (UTF-8 is checked before)."""
        try:
            top = self._any_decoder.decode(raw)
        except (msgspec.DecodeError, RecursionError) as exc:
            if isinstance(exc, RecursionError):
                return _rejected(R.INVALID_JSON, "message: JSON nested too deeply", raw)
            if str(exc).startswith("Number out of range"):
                return self._with_overflow(raw, now_ms)
            return _rejected(R.INVALID_JSON, f"message is not valid JSON: {exc}", raw)
        if not isinstance(top, dict):
            return _rejected(
                R.WRONG_TYPE,
                'message: expected a JSON object (one event) or {"events": [...]}, '
                f"got {_JSON_TYPES.get(type(top), 'value')}",
                raw,
            )
        if "events" not in top:
            try:
                event = self._event_decoder.decode(raw)
            except msgspec.ValidationError as exc:
                reason, detail = classify_validation_error(str(exc))
                return _rejected(reason, detail, raw, _id_of(top))
            return self._finish_single(event, raw, now_ms)
        try:
            elements = self._raw_batch_decoder.decode(raw).events
        except msgspec.ValidationError as exc:
            _, detail = classify_validation_error(str(exc))
            if detail.startswith("events: Expected `array` of length >= 1"):
                detail = "events: empty batch"
            return _rejected(R.BAD_BATCH, f"{detail} (a batch is {{\"events\": [event, ...]}})", raw)
        return self._batch_elements(raw, elements, now_ms)

    def _with_overflow(self, raw: bytes, now_ms: int) -> DecodeResult:
        """A message with a number too large for a float (e.g. ``1e999``): the
        generic parser refuses it, so find the shape with the typed decoders
        (each element of a batch is then judged on its own)."""
        try:
            elements = self._raw_batch_decoder.decode(raw).events
        except msgspec.ValidationError:
            try:
                event = self._event_decoder.decode(raw)
            except msgspec.ValidationError as exc:
                reason, detail = classify_validation_error(str(exc))
                return _rejected(reason, detail, raw, self._probe_id(raw))
            except (msgspec.DecodeError, RecursionError) as exc:
                return _rejected(R.INVALID_JSON, f"message is not valid JSON: {exc}", raw)
            return self._finish_single(event, raw, now_ms)
        except (msgspec.DecodeError, RecursionError) as exc:
            return _rejected(R.INVALID_JSON, f"message is not valid JSON: {exc}", raw)
        return self._batch_elements(raw, elements, now_ms)

    def _batch_elements(self, raw: bytes, elements: list[msgspec.Raw], now_ms: int) -> DecodeResult:
        """Decode each batch element on its own; bad ones become dead letters."""
        decoded: list[RequestEvent | DeadLetter] = []
        for index, element in enumerate(elements):
            try:
                decoded.append(self._event_decoder.decode(element))
            except msgspec.ValidationError as exc:
                reason, detail = classify_validation_error(str(exc))
                if detail.startswith("Expected `object`"):
                    detail = f"event: {detail}"
                decoded.append(DeadLetter(reason, detail, bytes(element), self._probe_id(element), index))
            except (msgspec.DecodeError, RecursionError) as exc:
                reason, detail = R.INVALID_JSON, f"event is not valid JSON: {exc}"[: R.MAX_DETAIL_CHARS]
                decoded.append(DeadLetter(reason, detail, bytes(element), self._probe_id(element), index))
        return self._finish_batch(decoded, raw, elements, now_ms)

    def _finish_single(self, event: RequestEvent, raw: bytes, now_ms: int) -> DecodeResult:
        """Post-decode checks for a one-event message."""
        problem = self._time_problem(event.ts_ms, now_ms)
        if problem is not None:
            return _rejected(problem[0], problem[1], raw, event.event_id)
        self._truncate(event)
        return DecodeResult([event], [])

    def _finish_batch(
        self,
        items: list[Any],
        raw: bytes,
        elements: list[msgspec.Raw] | None,
        now_ms: int,
    ) -> DecodeResult:
        """Post-decode checks for a batch; ``items`` are events or already-made dead letters.

        ``elements`` (each element's bytes) is decoded lazily on the fast path,
        only when an element must be dead-lettered.
        """
        fast = self._all_clean(items, now_ms, typed=elements is None)
        if fast is not None:
            return fast
        events: list[RequestEvent] = []
        dead: list[DeadLetter] = []
        seen: set[str] = set()
        for index, item in enumerate(items):
            if isinstance(item, DeadLetter):
                dead.append(item)
                continue
            problem = self._time_problem(item.ts_ms, now_ms)
            if problem is None and item.event_id in seen:
                problem = (R.DUPLICATE_IN_BATCH, f"event_id: {item.event_id!r} appears earlier in this batch"
                           [: R.MAX_DETAIL_CHARS])
            if problem is None:
                seen.add(item.event_id)
                self._truncate(item)
                events.append(item)
                continue
            if elements is None:
                elements = self._element_bytes(raw, len(items))
            element = bytes(elements[index]) if elements is not None else msgspec.json.encode(item)
            dead.append(DeadLetter(problem[0], problem[1], element, item.event_id, index))
        return DecodeResult(events, dead)

    def _all_clean(self, items: list[Any], now_ms: int, typed: bool = False) -> DecodeResult | None:
        """The common case in one pass of C-level maps: every item decoded, inside the time window, ids
        unique in the batch. Returns the result (long texts truncated), or None to take the per-event path.
        ``typed``: the items come from the typed batch decode (all events: their types are not checked)."""
        if not typed and set(map(type, items)) != {RequestEvent}:  # a dead letter among them
            return None
        if not self._all_in_window(list(map(_TS, items)), now_ms):
            return None
        if len(set(map(_ID, items))) != len(items):
            return None
        self._cut_long_texts(items)
        return DecodeResult(items, [])

    def _element_bytes(self, raw: bytes, expected: int) -> list[msgspec.Raw] | None:
        """Each batch element's original bytes, or None if they cannot be matched up."""
        try:
            elements = self._raw_batch_decoder.decode(raw).events
        except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
            return None
        return elements if len(elements) == expected else None

    def _probe_id(self, element: bytes | msgspec.Raw) -> str | None:
        """``event_id`` of a rejected element if it is a 1..512-char string."""
        try:
            value = self._probe_decoder.decode(element).event_id
        except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
            return None
        return value if isinstance(value, str) and 0 < len(value) <= _MAX_ID_CHARS else None


def _id_of(obj: dict[str, Any]) -> str | None:
    """``event_id`` from an already-parsed object, if it is a 1..512-char string."""
    value = obj.get("event_id")
    return value if isinstance(value, str) and 0 < len(value) <= _MAX_ID_CHARS else None


def _rejected(reason: str, detail: str, raw: bytes, event_id: str | None = None) -> DecodeResult:
    """A result with no events and one whole-message dead letter."""
    return DecodeResult([], [DeadLetter(reason, detail[: R.MAX_DETAIL_CHARS], raw, event_id)])


def _safe_bytes(raw: Any) -> bytes:
    """Best-effort bytes of any input, for an ``internal_error`` dead letter."""
    if isinstance(raw, bytes):
        return raw
    try:
        return raw.encode("utf-8", "surrogatepass") if isinstance(raw, str) else bytes(raw)
    except Exception:  # noqa: BLE001
        return repr(raw).encode("utf-8", "replace")
