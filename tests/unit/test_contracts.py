"""schemas/*.json (the language-neutral contract, SPEC §3) agree with pipeline.contracts."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import jsonschema
import msgspec
import pytest
from referencing import Registry, Resource

from pipeline.contracts import Batch, ExpectedCall, RequestEvent, Verdict
from pipeline.ingest.dead_letter import DeadLetter

SCHEMAS = Path(__file__).parents[2] / "schemas"
DBL_MAX = sys.float_info.max


def load(name: str) -> dict:
    return json.loads((SCHEMAS / name).read_text())


REQUEST = load("request_event.v1.json")
BATCH = load("batch.v1.json")
HEALTH = load("channel_health.v1.json")
DEAD = load("dead_letter.v1.json")
REGISTRY = Registry().with_resources(
    [(s["$id"], Resource.from_contents(s)) for s in (REQUEST, BATCH, HEALTH, DEAD)]
)


def validator(schema: dict) -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator(schema, registry=REGISTRY)


@pytest.mark.parametrize("schema", [REQUEST, BATCH, HEALTH, DEAD], ids=lambda s: s["$id"].rsplit("/", 1)[1])
def test_schema_files_are_valid_draft_2020_12(schema: dict) -> None:
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    jsonschema.Draft202012Validator.check_schema(schema)


# ------------------------------------------------- structural agreement


def code_facts(t: msgspec.inspect.Type) -> dict[str, Any]:
    """What a msgspec type allows, in JSON Schema terms (floats are finite: +-DBL_MAX)."""
    members = t.types if isinstance(t, msgspec.inspect.UnionType) else (t,)
    facts: dict[str, Any] = {"types": set()}
    for m in members:
        if isinstance(m, msgspec.inspect.NoneType):
            facts["types"].add("null")
        elif isinstance(m, msgspec.inspect.StrType):
            facts["types"].add("string")
            facts.update({k: v for k, v in (("minLength", m.min_length), ("maxLength", m.max_length)) if v is not None})
        elif isinstance(m, msgspec.inspect.BoolType):
            facts["types"].add("boolean")
        elif isinstance(m, msgspec.inspect.IntType):
            facts["types"].add("integer")
            facts.update({k: v for k, v in (("minimum", m.ge), ("maximum", m.le)) if v is not None})
        elif isinstance(m, msgspec.inspect.FloatType):
            facts["types"].add("number")
            facts["minimum"] = -DBL_MAX if m.ge is None else m.ge
            facts["maximum"] = DBL_MAX if m.le is None else m.le
        elif isinstance(m, msgspec.inspect.LiteralType):
            facts["enum"] = set(m.values)
        elif isinstance(m, msgspec.inspect.ListType):
            facts["types"].add("array")
            facts["items"] = code_facts(m.item_type)
            if m.min_length is not None:
                facts["minItems"] = m.min_length
        elif isinstance(m, msgspec.inspect.DictType):
            facts["types"].add("object")
            facts["values"] = code_facts(m.value_type)
        elif isinstance(m, msgspec.inspect.RawType):
            facts["types"].add("any JSON")
        else:  # pragma: no cover - a new field type needs a rule here
            raise AssertionError(f"no rule for {m!r}")
    if "number" in facts["types"]:
        facts["types"].discard("integer")  # JSON Schema "number" includes integers
    return facts


def schema_facts(s: dict) -> dict[str, Any]:
    """The same facts read from a JSON Schema fragment."""
    types = s.get("type", [])
    facts: dict[str, Any] = {"types": set([types] if isinstance(types, str) else types)}
    if "enum" in s:
        values = set(s["enum"])
        if None in values:
            values.discard(None)
            facts["types"].add("null")
        facts["enum"] = values
    for key in ("minimum", "maximum", "minLength", "maxLength", "minItems"):
        if key in s:
            facts[key] = s[key]
    if "items" in s:
        facts["items"] = {"types": {"any JSON"}} if "$ref" in s["items"] else schema_facts(s["items"])
    if "additionalProperties" in s:
        facts["values"] = schema_facts(s["additionalProperties"])
    if facts["types"] - {"null"} and "minimum" in facts and "number" not in facts["types"] and "integer" not in facts["types"]:
        raise AssertionError(f"bounds on a non-number: {s}")
    return facts


def check_struct_against_schema(struct: type, schema: dict, skip: tuple[str, ...] = ()) -> None:
    info = msgspec.inspect.type_info(struct)
    assert {f.name for f in info.fields} == set(schema["properties"])
    assert {f.name for f in info.fields if f.required} == set(schema.get("required", []))
    for f in info.fields:
        if f.name in skip:
            continue
        assert code_facts(f.type) == schema_facts(schema["properties"][f.name]), f.name


def test_request_event_fields_match() -> None:
    check_struct_against_schema(RequestEvent, REQUEST, skip=("expected_fields",))
    assert set(REQUEST["required"]) == {"event_id", "ts_ms", "channel", "route", "status", "latency_ms"}


def test_request_event_enums_match() -> None:
    info = {f.name: f.type for f in msgspec.inspect.type_info(RequestEvent).fields}
    assert set(info["status"].values) == set(REQUEST["properties"]["status"]["enum"]) == {
        "ok", "error", "timeout", "rate_limited", "cancelled", "filtered"
    }
    tier = next(t for t in info["tier"].types if isinstance(t, msgspec.inspect.LiteralType))
    assert set(tier.values) | {None} == set(REQUEST["properties"]["tier"]["enum"]) == {"free", "paid", None}


def test_expected_fields_shape_matches() -> None:
    prop = REQUEST["properties"]["expected_fields"]["anyOf"]
    assert prop[0] == {"type": "null"}
    assert prop[1] == {"type": "array", "items": {"type": "string"}}
    assert prop[2] == {"type": "array", "items": {"$ref": "#/$defs/expected_call"}}
    check_struct_against_schema(ExpectedCall, REQUEST["$defs"]["expected_call"])


def test_batch_matches() -> None:
    check_struct_against_schema(Batch, BATCH)
    assert BATCH["properties"]["events"]["items"] == {"$ref": "request_event.v1.json"}


def test_verdict_fields_and_enums_match() -> None:
    check_struct_against_schema(Verdict, HEALTH)
    state = {f.name: f.type for f in msgspec.inspect.type_info(Verdict).fields}["state"]
    assert set(state.values) == set(HEALTH["properties"]["state"]["enum"]) == {
        "healthy", "degraded", "open", "half_open", "recovering", "no_data"
    }


# --------------------------------------------- same verdict on sample docs


def base(**kw: Any) -> dict:
    doc = {"event_id": "e1", "ts_ms": 1_750_000_000_000, "channel": "c", "route": "r", "status": "ok", "latency_ms": 1.5}
    doc.update(kw)
    return doc


def drop(key: str) -> dict:
    return {k: v for k, v in base().items() if k != key}


def as_bytes(doc: Any) -> bytes:
    return doc if isinstance(doc, bytes) else json.dumps(doc).encode()


REQUEST_SAMPLES = [
    (base(), True),
    (base(latency_ms=0), True),
    (base(tier="paid", http_status=429, error_type="quota", ttft_ms=0.0, max_stream_gap_ms=8000,
          input_tokens=10, output_tokens=0, cost_usd=0.002, quota_remaining=1, gateway_id="gw", trace_id="t"), True),
    (base(tier=None, quota_remaining=None, expected_fields=None, missing_fields=None), True),
    (base(expected_fields=["a", "b"], missing_fields=["b"], parse_ok=True), True),
    (base(expected_fields=[{"function": "f", "required": ["x"]}, {"function": "g"}]), True),
    (base(expected_fields=[{"function": "f", "required": [], "extra": 1}]), True),
    (base(expected_fields=[]), True),
    (base(response_text="{}", prompt_text="p", unknown_extra={"a": 1}), True),
    (base(event_id="x" * 512), True),
    (base(ts_ms=0), True),
    (drop("event_id"), False),
    (drop("ts_ms"), False),
    (drop("channel"), False),
    (drop("route"), False),
    (drop("status"), False),
    (drop("latency_ms"), False),
    (base(event_id=""), False),
    (base(event_id="x" * 513), False),
    (base(event_id=7), False),
    (base(ts_ms="1750000000000"), False),
    (base(ts_ms=1.5), False),
    (base(ts_ms=-1), False),
    (base(status="OK"), False),
    (base(status=None), False),
    (base(latency_ms=-0.1), False),
    (base(latency_ms="1"), False),
    (base(latency_ms=True), False),
    (base(latency_ms=None), False),
    (as_bytes(base(latency_ms=12345)).replace(b"12345", b"1e999"), False),
    (base(tier="gold"), False),
    (base(http_status=1000), False),
    (base(http_status=-1), False),
    (base(quota_remaining=1.01), False),
    (base(quota_remaining=-0.01), False),
    (base(input_tokens=-1), False),
    (base(output_tokens=2.5), False),
    (base(cost_usd=-1), False),
    (base(ttft_ms=-5), False),
    (base(expected_fields=["a", {"function": "f", "required": []}]), False),
    (base(expected_fields=[{"required": ["x"]}]), False),
    (base(expected_fields=[{"function": "f", "required": "x"}]), False),
    (base(expected_fields="a"), False),
    (base(missing_fields=[1]), False),
    (base(parse_ok="yes"), False),
    (base(response_text=5), False),
    ([base()], False),
    ("event", False),
]


def schema_accepts(schema: dict, raw: bytes) -> bool:
    return validator(schema).is_valid(json.loads(raw))


def code_accepts(struct: type, raw: bytes) -> bool:
    try:
        msgspec.json.decode(raw, type=struct)
    except (msgspec.ValidationError, msgspec.DecodeError):
        return False
    return True


def code_accepts_batch(raw: bytes) -> bool:
    """The code's rule for a batch: a Batch envelope whose every element is a RequestEvent."""
    try:
        elements = msgspec.json.decode(raw, type=Batch).events
    except (msgspec.ValidationError, msgspec.DecodeError):
        return False
    return all(code_accepts(RequestEvent, e) for e in elements)


@pytest.mark.parametrize(("doc", "valid"), REQUEST_SAMPLES)
def test_request_event_samples_agree(doc: Any, valid: bool) -> None:
    raw = as_bytes(doc)
    assert schema_accepts(REQUEST, raw) is valid
    assert code_accepts(RequestEvent, raw) is valid


BATCH_SAMPLES = [
    ({"events": [base()]}, True),
    ({"events": [base(event_id="a"), base(event_id="b", status="error")], "gateway_id": "gw-1"}, True),
    ({"events": []}, False),
    ({"events": [base(), base(latency_ms=-1)]}, False),
    ({"events": [base(), 5]}, False),
    ({"events": base()}, False),
    ({"events": None}, False),
    ({}, False),
    ([base()], False),
]


@pytest.mark.parametrize(("doc", "valid"), BATCH_SAMPLES)
def test_batch_samples_agree(doc: Any, valid: bool) -> None:
    raw = as_bytes(doc)
    assert schema_accepts(BATCH, raw) is valid
    assert code_accepts_batch(raw) is valid


def verdict(**kw: Any) -> dict:
    doc = {"channel": "c", "route": "r", "state": "degraded", "weight": 0.85, "reasons": ["latency_p95_ratio"],
           "metrics": {"p95_ms": 420.0, "baseline_p95_ms": 200, "ratio": 2.1, "window": "5m", "quality": None},
           "ts_ms": 1_750_000_000_000, "seq": 12, "schema_version": 1}
    doc.update(kw)
    return doc


HEALTH_SAMPLES = [
    (verdict(), True),
    (verdict(weight=0, state="open", reasons=[], metrics={}), True),
    (verdict(weight=1, state="healthy"), True),
    ({k: v for k, v in verdict().items() if k != "schema_version"}, True),
    ({k: v for k, v in verdict().items() if k != "seq"}, False),
    ({k: v for k, v in verdict().items() if k != "metrics"}, False),
    (verdict(state="closed"), False),
    (verdict(weight=1.2), False),
    (verdict(weight=-0.1), False),
    (verdict(reasons="error_rate"), False),
    (verdict(metrics={"flag": True}), False),
    (verdict(metrics={"nested": {"a": 1}}), False),
    (verdict(seq=-1), False),
    (verdict(ts_ms=1.5), False),
    (as_bytes(verdict(metrics={"x": 12345})).replace(b"12345", b"-1e999"), False),
]


@pytest.mark.parametrize(("doc", "valid"), HEALTH_SAMPLES)
def test_verdict_samples_agree(doc: Any, valid: bool) -> None:
    raw = as_bytes(doc)
    assert schema_accepts(HEALTH, raw) is valid
    assert code_accepts(Verdict, raw) is valid


def test_known_divergence_integral_float_for_an_int_field() -> None:
    """JSON Schema counts 1.0 as an integer; msgspec (strict) does not. Gateways
    must send integers as integers; this test documents the one known gap."""
    raw = as_bytes(base(ts_ms=1_750_000_000_000.0))
    assert schema_accepts(REQUEST, raw) is True
    assert code_accepts(RequestEvent, raw) is False


@pytest.mark.parametrize(
    "dead",
    [
        DeadLetter("invalid_json", "message is not valid JSON", b'{"a": ', None, None),
        DeadLetter("not_utf8", "message is not valid UTF-8", b"\xff\xfe", "e1", 3),
        DeadLetter("too_large", "message is 2000000 bytes", b"x" * 2_000_000),
    ],
)
def test_dead_letter_values_match_their_schema(dead: DeadLetter) -> None:
    value = json.loads(dead.to_kafka_value())
    validator(DEAD).validate(value)
    assert value["raw_size"] == len(dead.raw)
