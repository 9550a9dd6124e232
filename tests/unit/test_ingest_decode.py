"""pipeline.ingest.decode: bad input -> dead letters with exact reasons (SPEC §3)."""

from __future__ import annotations

import base64
import hashlib
import json

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.contracts import RequestEvent
from pipeline.ingest.decode import DeadLetter, DecodeCounters, Decoder
from pipeline.ingest.reasons import ALL_REASONS

NOW = 1_750_000_000_000  # 2025-06-15T15:06:40Z, the decoder clock in these tests
HOUR = 3_600_000
DAY = 86_400_000


def event(i: int = 1, **overrides: object) -> dict:
    """A valid request event as a plain dict (ts = NOW)."""
    doc = {
        "event_id": f"e{i}",
        "ts_ms": NOW,
        "channel": "lepton/llama-70b@free",
        "route": "chat-70b",
        "status": "ok",
        "latency_ms": 180.5,
    }
    doc.update(overrides)
    return doc


def dumps(doc: object) -> bytes:
    return json.dumps(doc, separators=(",", ":")).encode()


def without(doc: dict, key: str) -> dict:
    return {k: v for k, v in doc.items() if k != key}


@pytest.fixture
def decoder() -> Decoder:
    return Decoder()


def only_dead_letter(result) -> DeadLetter:
    assert result.events == []
    assert len(result.dead_letters) == 1
    return result.dead_letters[0]


# --------------------------------------------------------------- good input


def test_single_event_decodes_with_all_values(decoder: Decoder) -> None:
    raw = dumps(event(7, tier="free", http_status=200, ttft_ms=35, quota_remaining=0.25,
                      expected_fields=[{"function": "f", "required": ["a"]}]))
    result = decoder.decode(raw, NOW)
    assert result.dead_letters == []
    (ev,) = result.events
    assert ev.event_id == "e7"
    assert ev.ts_ms == NOW
    assert ev.latency_ms == 180.5
    assert ev.ttft_ms == 35.0
    assert ev.quota_remaining == 0.25
    assert ev.tier == "free"
    assert ev.expected_fields[0].function == "f"
    assert ev.expected_fields[0].required == ["a"]


def test_good_batch_keeps_every_event_in_order(decoder: Decoder) -> None:
    raw = dumps({"events": [event(i, latency_ms=float(i)) for i in range(50)]})
    result = decoder.decode(raw, NOW)
    assert result.dead_letters == []
    assert [e.event_id for e in result.events] == [f"e{i}" for i in range(50)]
    assert [e.latency_ms for e in result.events] == [float(i) for i in range(50)]


def test_unknown_fields_are_ignored(decoder: Decoder) -> None:
    result = decoder.decode(dumps(event(1, region="eu-west", extra={"a": [1, 2]})), NOW)
    assert [e.event_id for e in result.events] == ["e1"]


# ---------------------------------------------------- whole-message failures


def test_invalid_json(decoder: Decoder) -> None:
    raw = b'{"event_id": "e1", "ts_ms": '
    dead = only_dead_letter(decoder.decode(raw, NOW))
    assert dead.reason == "invalid_json"
    assert dead.raw == raw
    assert dead.detail.startswith("message is not valid JSON")


def test_empty_message_is_invalid_json(decoder: Decoder) -> None:
    assert only_dead_letter(decoder.decode(b"  \n", NOW)).reason == "invalid_json"


def test_tombstone(decoder: Decoder) -> None:
    dead = only_dead_letter(decoder.decode(None, NOW))  # type: ignore[arg-type]
    assert (dead.reason, dead.raw) == ("empty_message", b"")


def test_not_utf8(decoder: Decoder) -> None:
    raw = dumps(event(1, channel="CHAN")).replace(b"CHAN", b"ch\xff\xfe")
    dead = only_dead_letter(decoder.decode(raw, NOW))
    assert dead.reason == "not_utf8"
    assert dead.raw == raw
    assert "UTF-8" in dead.detail


def test_invalid_utf8_in_an_unknown_key_of_a_batch_is_not_utf8(decoder: Decoder) -> None:
    # msgspec skips unknown keys without decoding them; found by the hostile-input property test
    raw = dumps({"events": [event(1), event(2)]}).replace(b'"status"', b'"in\xffput":1,"status"', 1)
    dead = only_dead_letter(decoder.decode(raw, NOW))
    assert (dead.reason, dead.raw) == ("not_utf8", raw)
    assert dead.detail.startswith("message is not valid UTF-8 (byte ")


def test_latin1_bytes_outside_strings_are_not_utf8(decoder: Decoder) -> None:
    assert only_dead_letter(decoder.decode(b"\xe9\xe9", NOW)).reason == "not_utf8"


def test_missing_required_field(decoder: Decoder) -> None:
    dead = only_dead_letter(decoder.decode(dumps(without(event(3), "latency_ms")), NOW))
    assert dead.reason == "missing_field"
    assert dead.detail == "latency_ms: missing required field"
    assert dead.event_id == "e3"
    assert dead.index is None


def test_missing_nested_field(decoder: Decoder) -> None:
    raw = dumps(event(1, expected_fields=[{"required": ["a"]}]))
    dead = only_dead_letter(decoder.decode(raw, NOW))
    assert (dead.reason, dead.detail) == ("missing_field", "expected_fields[0].function: missing required field")


def test_wrong_type(decoder: Decoder) -> None:
    dead = only_dead_letter(decoder.decode(dumps(event(1, latency_ms="fast")), NOW))
    assert dead.reason == "wrong_type"
    assert dead.detail == "latency_ms: Expected `float`, got `str`"
    assert dead.event_id == "e1"


def test_float_timestamp_is_wrong_type(decoder: Decoder) -> None:
    dead = only_dead_letter(decoder.decode(dumps(event(1, ts_ms=NOW + 0.5)), NOW))
    assert (dead.reason, dead.detail) == ("wrong_type", "ts_ms: Expected `int`, got `float`")


def test_mixed_expected_fields_is_wrong_type(decoder: Decoder) -> None:
    raw = dumps(event(1, expected_fields=["a", {"function": "f", "required": []}]))
    dead = only_dead_letter(decoder.decode(raw, NOW))
    assert dead.reason == "wrong_type"
    assert dead.detail.startswith("expected_fields mixes")


def test_unknown_status_is_invalid_enum(decoder: Decoder) -> None:
    dead = only_dead_letter(decoder.decode(dumps(event(1, status="great")), NOW))
    assert (dead.reason, dead.detail) == ("invalid_enum", "status: Invalid enum value 'great'")


def test_negative_latency(decoder: Decoder) -> None:
    dead = only_dead_letter(decoder.decode(dumps(event(1, latency_ms=-3)), NOW))
    assert dead.reason == "out_of_range"
    assert dead.detail == "latency_ms: Expected `float` >= 0.0"


def test_quota_above_one_and_empty_event_id_are_out_of_range(decoder: Decoder) -> None:
    dead = only_dead_letter(decoder.decode(dumps(event(1, quota_remaining=1.5)), NOW))
    assert (dead.reason, dead.detail) == ("out_of_range", "quota_remaining: Expected `float` <= 1.0")
    dead = only_dead_letter(decoder.decode(dumps(event(1, event_id="")), NOW))
    assert (dead.reason, dead.detail) == ("out_of_range", "event_id: Expected `str` of length >= 1")
    assert dead.event_id is None


@pytest.mark.parametrize("literal", [b"NaN", b"Infinity", b"-Infinity"])
def test_nan_and_infinity_literals_are_invalid_json(decoder: Decoder, literal: bytes) -> None:
    raw = dumps(event(1, latency_ms=12345)).replace(b"12345", literal)
    assert literal in raw
    dead = only_dead_letter(decoder.decode(raw, NOW))
    assert dead.reason == "invalid_json"
    assert dead.raw == raw


def test_python_nan_from_json_dumps_is_invalid_json(decoder: Decoder) -> None:
    raw = json.dumps(event(1, latency_ms=float("nan"))).encode()
    assert only_dead_letter(decoder.decode(raw, NOW)).reason == "invalid_json"


def test_number_overflowing_to_infinity_is_out_of_range(decoder: Decoder) -> None:
    raw = dumps(event(1, latency_ms=12345)).replace(b"12345", b"1e999")
    dead = only_dead_letter(decoder.decode(raw, NOW))
    assert (dead.reason, dead.detail, dead.event_id) == ("out_of_range", "latency_ms: Number out of range", "e1")


def test_overflowing_number_in_a_batch_rejects_only_its_element(decoder: Decoder) -> None:
    bad = dumps(event(2, latency_ms=12345)).replace(b"12345", b"-1e400")
    raw = b'{"events":[' + b",".join([dumps(event(1)), bad, dumps(event(3))]) + b"]}"
    result = decoder.decode(raw, NOW)
    assert [e.event_id for e in result.events] == ["e1", "e3"]
    (dead,) = result.dead_letters
    assert (dead.reason, dead.raw, dead.index) == ("out_of_range", bad, 1)


def test_timestamp_far_in_future(decoder: Decoder) -> None:
    dead = only_dead_letter(decoder.decode(dumps(event(1, ts_ms=NOW + 2 * HOUR)), NOW))
    assert dead.reason == "ts_in_future"
    assert dead.detail == f"ts_ms: {NOW + 2 * HOUR} is 2.0 h ahead of the decoder clock {NOW} (limit 1.0 h)"
    assert dead.event_id == "e1"


def test_timestamp_just_inside_future_limit_is_kept(decoder: Decoder) -> None:
    assert len(decoder.decode(dumps(event(1, ts_ms=NOW + HOUR)), NOW).events) == 1
    assert decoder.decode(dumps(event(1, ts_ms=NOW + HOUR + 1)), NOW).dead_letters[0].reason == "ts_in_future"


def test_timestamp_years_old(decoder: Decoder) -> None:
    three_years_ago = NOW - 3 * 365 * DAY
    dead = only_dead_letter(decoder.decode(dumps(event(1, ts_ms=three_years_ago)), NOW))
    assert dead.reason == "ts_too_old"
    assert dead.detail == f"ts_ms: {three_years_ago} is 1095.0 days behind the decoder clock {NOW} (limit 7.0 days)"


def test_six_day_old_event_is_kept_and_age_check_can_be_switched_off() -> None:
    assert len(Decoder().decode(dumps(event(1, ts_ms=NOW - 6 * DAY)), NOW).events) == 1
    replay = Decoder(max_age_ms=None)
    assert len(replay.decode(dumps(event(1, ts_ms=NOW - 900 * DAY)), NOW).events) == 1


def test_five_megabyte_message_is_too_large(decoder: Decoder) -> None:
    raw = dumps(event(1, response_text="x" * 5_000_000))
    dead = only_dead_letter(decoder.decode(raw, NOW))
    assert dead.reason == "too_large"
    assert dead.detail == f"message is {len(raw)} bytes; the limit is 1000000"
    assert dead.raw == raw
    value = json.loads(dead.to_kafka_value())
    assert value["raw_size"] == len(raw)
    assert value["raw_truncated"] is True
    assert value["raw_encoding"] == "utf-8"
    # The escaped copy fills the 256,000-byte budget: each '"' of the header escapes to 2 bytes.
    assert value["raw"] == raw[:256_000 - raw[:1_000].count(b'"')].decode()


def test_top_level_array_is_wrong_type(decoder: Decoder) -> None:
    dead = only_dead_letter(decoder.decode(dumps([event(1)]), NOW))
    assert dead.reason == "wrong_type"
    assert dead.detail == 'message: expected a JSON object (one event) or {"events": [...]}, got array'


def test_deeply_nested_json_is_invalid_json(decoder: Decoder) -> None:
    raw = b"[" * 100_000 + b"]" * 100_000
    assert only_dead_letter(decoder.decode(raw, NOW)).reason == "invalid_json"


# ------------------------------------------------------------------ batches


def test_batch_with_one_bad_element_keeps_the_good_ones(decoder: Decoder) -> None:
    elements = [dumps(event(1)), dumps(event(2, latency_ms=-1)), dumps(event(3)), dumps(event(4))]
    bad = elements[1]
    raw = b'{"events": [' + b" ,\n ".join(elements) + b"]}"
    result = decoder.decode(raw, NOW)
    assert [e.event_id for e in result.events] == ["e1", "e3", "e4"]
    (dead,) = result.dead_letters
    assert dead.reason == "out_of_range"
    assert dead.detail == "latency_ms: Expected `float` >= 0.0"
    assert dead.raw == bad
    assert dead.event_id == "e2"
    assert dead.index == 1


def test_batch_with_several_kinds_of_bad_element(decoder: Decoder) -> None:
    elements = [
        dumps(event(1)),
        b"17",
        dumps(without(event(3), "route")),
        dumps(event(4, ts_ms=NOW - 30 * DAY)),
        dumps(event(5)),
    ]
    raw = b'{"events":[' + b",".join(elements) + b"]}"
    result = decoder.decode(raw, NOW)
    assert [e.event_id for e in result.events] == ["e1", "e5"]
    got = [(d.index, d.reason, d.raw, d.event_id) for d in result.dead_letters]
    assert got == [
        (1, "wrong_type", b"17", None),
        (2, "missing_field", elements[2], "e3"),
        (3, "ts_too_old", elements[3], "e4"),
    ]
    assert result.dead_letters[0].detail == "event: Expected `object`, got `int`"


def test_fast_path_time_failure_still_dead_letters_the_elements_own_bytes(decoder: Decoder) -> None:
    # every element is schema-valid, so the typed fast path succeeds; the bytes
    # of the one too-old element must still be its exact original slice
    elements = [dumps(event(1)), b'{ "event_id" : "e2", "ts_ms": 5, "channel": "c", "route": "r",'
                b' "status": "ok", "latency_ms": 1 }', dumps(event(3))]
    raw = b'{"events":[' + b",".join(elements) + b"]}"
    result = decoder.decode(raw, NOW)
    assert [e.event_id for e in result.events] == ["e1", "e3"]
    (dead,) = result.dead_letters
    assert (dead.reason, dead.raw, dead.index) == ("ts_too_old", elements[1], 1)


def test_empty_batch(decoder: Decoder) -> None:
    raw = b'{"events": []}'
    dead = only_dead_letter(decoder.decode(raw, NOW))
    assert dead.reason == "bad_batch"
    assert dead.raw == raw
    assert dead.detail == "events: empty batch (a batch is {\"events\": [event, ...]})"


def test_batch_events_not_an_array(decoder: Decoder) -> None:
    dead = only_dead_letter(decoder.decode(b'{"events": {"event_id": "e1"}}', NOW))
    assert dead.reason == "bad_batch"
    assert dead.detail.startswith("events: Expected `array`, got `object`")


def test_duplicate_event_id_inside_one_batch(decoder: Decoder) -> None:
    first, second = dumps(event(1, latency_ms=10)), dumps(event(1, latency_ms=99))
    raw = b'{"events":[' + b",".join([first, dumps(event(2)), second]) + b"]}"
    result = decoder.decode(raw, NOW)
    assert [(e.event_id, e.latency_ms) for e in result.events] == [("e1", 10.0), ("e2", 180.5)]
    (dead,) = result.dead_letters
    assert dead.reason == "duplicate_in_batch"
    assert dead.raw == second
    assert dead.index == 2
    assert dead.detail == "event_id: 'e1' appears earlier in this batch"


def test_duplicate_across_messages_is_not_a_decode_error(decoder: Decoder) -> None:
    assert len(decoder.decode(dumps(event(1)), NOW).events) == 1
    assert len(decoder.decode(dumps(event(1)), NOW).events) == 1  # storage dedups by event_id


# ------------------------------------------------------------ text limits


def test_long_texts_are_truncated_not_rejected() -> None:
    decoder = Decoder(max_text_chars=100)
    raw = dumps(event(1, response_text="r" * 250, prompt_text="p" * 101, status="error"))
    (ev,) = decoder.decode(raw, NOW).events
    assert ev.response_text == "r" * 100
    assert ev.prompt_text == "p" * 100
    assert ev.missing_fields is None  # status error: no structure check
    assert decoder.counters.texts_truncated == 2


def test_long_structured_answer_is_checked_before_truncation() -> None:
    answer = json.dumps({"summary": "s" * 300, "score": 3})
    raw = dumps(event(1, response_text=answer, expected_fields=["summary", "score", "tags"]))
    (ev,) = Decoder(max_text_chars=100).decode(raw, NOW).events
    assert len(ev.response_text) == 100
    assert ev.missing_fields == ["tags"]
    assert ev.parse_ok is True


def test_short_answer_is_checked_once_at_ingest() -> None:
    raw = dumps(event(1, response_text='{"a": 1}', expected_fields=["a", "b"]))
    (ev,) = Decoder().decode(raw, NOW).events
    assert (ev.response_text, ev.missing_fields, ev.parse_ok) == ('{"a": 1}', ["b"], True)


def test_decoder_resolves_the_structure_flags_onto_every_event() -> None:
    """The one structure rule (resolve_structure) runs at ingest, on the lean path and in envelopes alike;
    an envelope whose flags change is not stored as it came."""
    gateway_checked = event(1, missing_fields=["x"])                        # parse_ok absent: "parsed"
    not_ok = event(2, status="error", missing_fields=["x"], parse_ok=False)  # only ok events are judged
    unchecked = event(3, parse_ok=True)                                    # nothing to judge
    decoder = Decoder()
    events, _, dead, _, _ = decoder.decode_many([dumps(gateway_checked), dumps(not_ok), dumps(unchecked)], NOW)
    assert not dead
    assert [(e.parse_ok, e.missing_fields) for e in events] == [(True, ["x"]), (None, None), (None, None)]
    as_data = decoder.decode(dumps({"events": [gateway_checked, event(4)]}), NOW)
    assert as_data.envelope is not None  # its bytes state the stored flags (parse_ok's default included)
    assert [(e.parse_ok, e.missing_fields) for e in as_data.events] == [(True, ["x"]), (None, None)]
    changed = decoder.decode(dumps({"events": [gateway_checked, not_ok]}), NOW)
    assert changed.envelope is None
    assert [(e.parse_ok, e.missing_fields) for e in changed.events] == [(True, ["x"]), (None, None)]


# ---------------------------------------------------------- DLQ and counters


def test_dead_letter_kafka_value_utf8_and_base64() -> None:
    text = DeadLetter("invalid_json", "message is not valid JSON", b'{"a": "\xc3\xa9"', "e9", 2)
    assert json.loads(text.to_kafka_value()) == {
        "schema_version": 1, "reason": "invalid_json", "detail": "message is not valid JSON",
        "event_id": "e9", "index": 2, "raw_encoding": "utf-8", "raw": '{"a": "\u00e9"',
        "raw_size": 10, "raw_truncated": False,
        "raw_sha256": hashlib.sha256(b'{"a": "\xc3\xa9"').hexdigest(),
    }
    binary = DeadLetter("not_utf8", "bad bytes", b"\xff\x00\xfe")
    value = json.loads(binary.to_kafka_value())
    assert value["raw_encoding"] == "base64"
    assert base64.b64decode(value["raw"]) == b"\xff\x00\xfe"
    assert (value["event_id"], value["index"], value["raw_size"]) == (None, None, 3)


def test_counters_count_by_reason() -> None:
    counters = DecodeCounters()
    decoder = Decoder(counters=counters)
    decoder.decode(dumps(event(1)), NOW)
    decoder.decode(b"{", NOW)
    decoder.decode(dumps({"events": [event(2), event(3, latency_ms=-1), event(2)]}), NOW)
    assert decoder.counters is counters
    assert counters.snapshot() == {
        "messages": 3,
        "events": 2,
        "dead_letters": 3,
        "texts_truncated": 0,
        "dead_letters.duplicate_in_batch": 1,
        "dead_letters.invalid_json": 1,
        "dead_letters.out_of_range": 1,
    }


@pytest.mark.parametrize("kwargs", [{"max_message_bytes": 0}, {"max_text_chars": -1},
                                    {"max_future_ms": 1.5}, {"max_age_ms": True}])
def test_bad_limits_raise(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        Decoder(**kwargs)


def test_non_bytes_input_is_dead_lettered(decoder: Decoder) -> None:
    assert only_dead_letter(decoder.decode(12345, NOW)).reason == "wrong_type"  # type: ignore[arg-type]
    assert len(decoder.decode(dumps(event(1)).decode(), NOW).events) == 1  # type: ignore[arg-type]
    assert len(decoder.decode(bytearray(dumps(event(1))), NOW).events) == 1  # type: ignore[arg-type]


# ---------------------------------------------------------------- property


def expected_elements(raw: bytes) -> int:
    """How many inputs a message holds, computed with the stdlib JSON parser."""

    def reject(_: str) -> None:
        raise ValueError("non-standard constant")

    try:
        doc = json.loads(raw.decode("utf-8"), parse_constant=reject)
    except (UnicodeDecodeError, ValueError, RecursionError):
        return 1
    if isinstance(doc, dict) and "events" in doc and isinstance(doc["events"], list) and doc["events"]:
        return len(doc["events"])
    return 1


def check_accounting(raw: bytes) -> None:
    result = Decoder().decode(raw, NOW)
    assert len(result.events) + len(result.dead_letters) == expected_elements(raw)
    for ev in result.events:
        assert isinstance(ev, RequestEvent)
        assert NOW - 7 * DAY <= ev.ts_ms <= NOW + HOUR
    for dead in result.dead_letters:
        assert dead.reason in ALL_REASONS
        assert dead.reason != "internal_error", dead.detail
        assert dead.detail
        assert dead.raw in raw
        json.loads(dead.to_kafka_value())
    ids = [e.event_id for e in result.events]
    assert len(ids) == len(set(ids))


json_scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text()
json_values = st.recursive(
    json_scalars,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12,
)


def field(valid: st.SearchStrategy) -> st.SearchStrategy:
    """Mostly valid values, sometimes junk, sometimes absent (None -> dropped)."""
    return st.one_of(valid, valid, valid, json_values, st.just(None))


event_like = st.fixed_dictionaries(
    {
        "event_id": field(st.sampled_from(["e1", "e2", "e3", "e4"])),
        "ts_ms": field(st.integers(NOW - 8 * DAY, NOW + 2 * HOUR)),
        "channel": field(st.just("c1")),
        "route": field(st.just("r1")),
        "status": field(st.sampled_from(["ok", "error", "timeout", "rate_limited", "cancelled", "filtered"])),
        "latency_ms": field(st.floats(-10, 1e6, allow_nan=False)),
        "quota_remaining": field(st.floats(-0.5, 1.5, allow_nan=False)),
        "expected_fields": field(st.lists(st.text(max_size=5), max_size=3)),
        "response_text": field(st.text(max_size=20)),
    }
).map(lambda d: {k: v for k, v in d.items() if v is not None})

messages = st.one_of(
    json_values,
    event_like,
    st.fixed_dictionaries({"events": st.lists(st.one_of(event_like, json_values), max_size=8)}),
    st.fixed_dictionaries({"events": json_values}),
)


@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=300))
def test_random_bytes_never_raise_and_are_accounted_for(raw: bytes) -> None:
    check_accounting(raw)


@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(messages)
def test_random_json_never_raises_and_is_accounted_for(doc: object) -> None:
    check_accounting(json.dumps(doc).encode())


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 10_000), min_size=1, max_size=20, unique=True))
def test_valid_batches_round_trip(latencies: list[int]) -> None:
    docs = [event(i, latency_ms=lat) for i, lat in enumerate(latencies)]
    result = Decoder().decode(dumps({"events": docs}), NOW)
    assert result.dead_letters == []
    assert [msgspec.to_builtins(e) for e in result.events] == [{**d, "latency_ms": float(d["latency_ms"])} for d in docs]


# --------------------------------------------------------------- many messages at once


def test_decode_many_equals_decode_per_message() -> None:
    """The lean path for clean one-event messages gives exactly the per-message results and counters."""
    long_text = "z" * 9_000
    raws = [
        dumps(event(1)),
        dumps({"events": [event(2), event(3, ts_ms=NOW - 8 * DAY), event(4)]}),  # one element too old
        dumps(event(5, ts_ms=NOW + 2 * HOUR)),                                 # single, in the future
        None,                                                                  # tombstone
        dumps(event(6, response_text=long_text, expected_fields=["a"])),        # cut to 8,000 chars
        dumps(event(7, route="rüte")),                                          # not ASCII: full path
        b"{not json",
        dumps(event(8, prompt_text="p")),
        dumps(event(9, ts_ms=NOW - 8 * DAY)),                                   # single, too old
        dumps({"events": [event(10), event(11)]}),                              # clean: stored as it came
    ]
    ref = Decoder()
    per = [ref.decode(r, NOW) for r in raws]
    many = Decoder()
    events, owner, dead, envelopes, fields = many.decode_many(raws, NOW)
    assert events == [e for r in per for e in r.events]
    assert [e.event_id for e in events] == ["e1", "e2", "e4", "e6", "e7", "e8", "e10", "e11"]
    assert owner == [0, 1, 1, 4, 5, 7, 9, 9]
    assert envelopes == [(9, raws[9], 2)] and [r.envelope for r in per] == [None] * 9 + [raws[9]]
    assert dead == [d for r in per for d in r.dead_letters]
    assert [d.reason for d in dead] == ["ts_too_old", "ts_in_future", "empty_message", "invalid_json",
                                        "ts_too_old"]
    assert len(events[3].response_text) == 8_000 and events[3].parse_ok is False
    assert many.counters.snapshot() == ref.counters.snapshot()
    assert many.counters.snapshot()["texts_truncated"] == 1
    assert fields is None  # nothing asked to read them


def test_decode_many_reads_each_message_s_events_right_after_its_decode() -> None:
    """``read`` sees each message's accepted events once, in message order, after the decoder resolved
    and cut them; singles all on the lean path are read in one call; a mix of lean singles and
    full-path messages yields no fields (their order would need merging)."""
    seen: list[list[str]] = []

    def read(events):
        seen.append([(e.event_id, e.parse_ok, len(e.response_text or "")) for e in events])
        return len(seen)

    long = event(3, expected_fields=["a"], response_text='{"a": 1, "pad": "' + "x" * 9_000 + '"}')
    raws = [dumps({"events": [event(1), event(2)]}), dumps({"events": [event(-1, ts_ms=0)]}),
            dumps({"events": [long, event(4, ts_ms=0)]})]
    got = Decoder().decode_many(raws, NOW, read)
    assert [e.event_id for e in got.events] == ["e1", "e2", "e3"]
    assert got.fields == [1, 2]  # the second message has no accepted event: not read
    assert seen == [[("e1", None, 0), ("e2", None, 0)], [("e3", True, 8_000)]]
    seen.clear()
    got = Decoder().decode_many([dumps(event(i)) for i in range(5)], NOW, read)
    assert got.fields == [1] and [s[0] for s in seen[0]] == ["e0", "e1", "e2", "e3", "e4"]
    seen.clear()
    got = Decoder().decode_many([dumps(event(1)), dumps({"events": [event(2)]})], NOW, read)
    assert got.fields is None and [e.event_id for e in got.events] == ["e1", "e2"]


def test_decode_many_of_clean_single_events_takes_no_per_message_call() -> None:
    class Counting(Decoder):
        calls = 0

        def decode(self, raw, now_ms):
            Counting.calls += 1
            return super().decode(raw, now_ms)

    d = Counting()
    events, owner, dead, envelopes, fields = d.decode_many([dumps(event(i)) for i in range(50)], NOW)
    assert (len(events), owner[-1], dead, envelopes, Counting.calls) == (50, 49, [], [], 0)
    assert d.counters.snapshot()["messages"] == 50


def test_decode_many_turns_an_internal_error_into_a_dead_letter(monkeypatch) -> None:
    import pipeline.ingest.limits as D  # where the long-text cut calls the structure check

    def broken(text, fields):
        raise RuntimeError("structure checker bug")

    monkeypatch.setattr(D, "check_structure", broken)
    raws = [dumps(event(1)), dumps(event(2, response_text="q" * 9_000, expected_fields=["a"])), dumps(event(3))]
    d = Decoder()
    events, owner, dead, envelopes, _ = d.decode_many(raws, NOW)
    assert ([e.event_id for e in events], owner, envelopes) == (["e1", "e3"], [0, 2], [])
    assert [(x.reason, x.detail) for x in dead] == [("internal_error", "decoder error RuntimeError: structure checker bug")]
    assert d.counters.snapshot()["messages"] == 3
