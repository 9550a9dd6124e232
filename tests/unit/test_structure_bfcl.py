"""pipeline.ingest.structure on real BFCL tool-call outputs and hand-made answers (SPEC §4.4, §6)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline.contracts import ExpectedCall, RequestEvent
from pipeline.ingest.structure import StructureResult, check_structure, resolve_structure

DATA = Path(__file__).parents[2].parent / "shared/data/function-call-outputs/bfcl_outputs.jsonl"


def native_rows() -> list[dict]:
    if not DATA.exists():
        pytest.skip(f"real data not found: {DATA} (../shared/data is absent)")
    rows = [json.loads(line) for line in DATA.read_text().splitlines() if line.strip()]
    return [r for r in rows if r["output_format"].startswith("native tool calls")]


def simple_missing(row: dict) -> list[str]:
    """Required args absent from the row's calls, the plain way: walk expected
    entries in order, each takes the first unused call of its function."""
    calls = []
    for item in json.loads(row["output"]):
        (name, args), = item.items()
        calls.append([name, json.loads(args) if isinstance(args, str) else args, False])
    missing = []
    for want in row["expected_fields"]:
        args = {}
        for call in calls:
            if call[0] == want["function"] and not call[2]:
                call[2] = True
                args = call[1]
                break
        missing += [f"{want['function']}.{a}" for a in want["required"] if a not in args]
    return missing


def test_every_native_bfcl_row() -> None:
    rows = native_rows()
    assert len(rows) == 1250
    with_missing = 0
    for row in rows:
        result = check_structure(row["output"], row["expected_fields"])
        assert result.parse_ok == row["json_args_parse_ok"], row["id"]
        assert result.missing_fields == simple_missing(row), row["id"]
        with_missing += bool(result.missing_fields)
    # rows where the model skipped or misnamed an expected call
    assert with_missing == 48


def test_bfcl_rows_with_known_missing_fields() -> None:
    rows = {r["id"]: r for r in native_rows()}
    misnamed = rows["live_multiple_33-10-3"]  # called add(a, b) where multiply(a, b) was expected
    assert check_structure(misnamed["output"], misnamed["expected_fields"]) == StructureResult(
        True, ["multiply.a", "multiply.b"]
    )
    unordered = rows["parallel_multiple_94"]  # three of four calls, not in the expected order
    assert check_structure(unordered["output"], unordered["expected_fields"]) == StructureResult(
        True, ["sort_list.elements"]
    )
    nothing = rows["live_multiple_425-141-14"]  # "[]": no call at all
    assert check_structure(nothing["output"], nothing["expected_fields"]) == StructureResult(
        True,
        [
            "Movies_1_BuyMovieTickets.movie_name",
            "Movies_1_BuyMovieTickets.number_of_tickets",
            "Movies_1_BuyMovieTickets.location",
        ],
    )


# ---------------------------------------------------------------- JSON object


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('{"name": "Ada", "age": 36, "city": "London"}', StructureResult(True, [])),
        ('{"name": "Ada"}', StructureResult(True, ["age", "city"])),
        ('  {"age": null, "city": ""}  ', StructureResult(True, ["name"])),
        ('```json\n{"name": "Ada", "age": 36}\n```', StructureResult(True, ["city"])),
        ('Here you go:\n```json\n{"name": "Ada", "city": "Paris"}\n```\nAnything else?', StructureResult(True, ["age"])),
        ('```\n{"name": "A", "age": 1, "city": "B"}\n```', StructureResult(True, [])),
        ('["name", "age", "city"]', StructureResult(False, ["name", "age", "city"])),
        ('"just a string"', StructureResult(False, ["name", "age", "city"])),
        ('{"name": "Ada", "age": 36', StructureResult(False, ["name", "age", "city"])),
        ('```json\n{"name": "Ada", "age": 36', StructureResult(False, ["name", "age", "city"])),
        ("Sorry, I cannot help with that.", StructureResult(False, ["name", "age", "city"])),
        ("", StructureResult(False, ["name", "age", "city"])),
    ],
)
def test_json_object_answers(text: str, expected: StructureResult) -> None:
    assert check_structure(text, ["name", "age", "city"]) == expected


def test_dotted_names_reach_into_nested_objects() -> None:
    text = '{"address": {"city": "Oslo"}, "a.b": 1}'
    assert check_structure(text, ["address.city", "address.zip", "a.b"]) == StructureResult(True, ["address.zip"])


# ------------------------------------------------------------------ tool calls

WEATHER = [{"function": "get_weather", "required": ["city", "unit"]}]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('[{"get_weather": "{\\"city\\": \\"Oslo\\", \\"unit\\": \\"C\\"}"}]', StructureResult(True, [])),
        ('[{"get_weather": {"city": "Oslo"}}]', StructureResult(True, ["get_weather.unit"])),
        ('[{"name": "get_weather", "arguments": "{\\"unit\\": \\"C\\"}"}]', StructureResult(True, ["get_weather.city"])),
        ('{"tool_calls": [{"id": "c1", "type": "function", "function": {"name": "get_weather",'
         ' "arguments": "{\\"city\\": \\"Oslo\\", \\"unit\\": \\"C\\"}"}}]}', StructureResult(True, [])),
        ('[{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}]',
         StructureResult(True, ["get_weather.unit"])),
        ('{"name": "get_weather", "arguments": {"city": "Oslo", "unit": "F"}}', StructureResult(True, [])),
        ('[{"get_time": "{\\"tz\\": \\"UTC\\"}"}]', StructureResult(True, ["get_weather.city", "get_weather.unit"])),
        ("[]", StructureResult(True, ["get_weather.city", "get_weather.unit"])),
        # arguments that are not JSON: the call is there but nothing in it can be read
        ('[{"get_weather": "{\\"city\\": \\"Oslo\\", "}]', StructureResult(False, ["get_weather.city", "get_weather.unit"])),
        ('[{"get_weather": "[1, 2]"}]', StructureResult(False, ["get_weather.city", "get_weather.unit"])),
        # the text itself does not parse, or is not a tool-call shape
        ('[{"get_weather": "{}"', StructureResult(False, ["get_weather.city", "get_weather.unit"])),
        ("get_weather(city='Oslo', unit='C')", StructureResult(False, ["get_weather.city", "get_weather.unit"])),
        ("42", StructureResult(False, ["get_weather.city", "get_weather.unit"])),
        ('[{"a": "{}", "b": "{}"}]', StructureResult(False, ["get_weather.city", "get_weather.unit"])),
    ],
)
def test_tool_call_answers(text: str, expected: StructureResult) -> None:
    assert check_structure(text, WEATHER) == expected


def test_argument_less_call_with_empty_string_arguments() -> None:
    expected = [{"function": "ping", "required": []}]
    assert check_structure('[{"name": "ping", "arguments": ""}]', expected) == StructureResult(True, [])


def test_repeated_function_matches_calls_one_to_one_in_order() -> None:
    expected = [ExpectedCall("f", ["x"]), ExpectedCall("f", ["x", "y"]), ExpectedCall("g", ["z"])]
    text = '[{"f": "{\\"x\\": 1}"}, {"g": "{}"}, {"f": "{\\"y\\": 2}"}]'
    # first f gets {"x"}, second f gets {"y"} (missing x), g misses z
    assert check_structure(text, expected) == StructureResult(True, ["f.x", "g.z"])


def test_empty_expected_fields_only_checks_parsing() -> None:
    assert check_structure("[]", []) == StructureResult(True, [])
    assert check_structure('{"free": "form"}', []) == StructureResult(True, [])
    assert check_structure("plain prose", []) == StructureResult(False, [])


def test_mixed_expected_fields_raise() -> None:
    with pytest.raises(TypeError):
        check_structure("{}", ["a", {"function": "f", "required": []}])


# ----------------------------------------------------------- resolve_structure


def make(**kw: object) -> RequestEvent:
    base = dict(event_id="e1", ts_ms=1, channel="c", route="r", status="ok", latency_ms=1.0)
    base.update(kw)
    return RequestEvent(**base)  # type: ignore[arg-type]


def test_resolve_prefers_the_gateways_own_check() -> None:
    ev = make(missing_fields=["b"], response_text='{"a": 1, "b": 2}', expected_fields=["a", "b"])
    assert resolve_structure(ev) == (True, ["b"])
    assert resolve_structure(make(missing_fields=[], parse_ok=False)) == (False, [])


def test_resolve_checks_the_text_itself() -> None:
    ev = make(response_text='{"a": 1}', expected_fields=["a", "b"])
    assert resolve_structure(ev) == (True, ["b"])
    calls = make(response_text='[{"f": "{bad"}]', expected_fields=[ExpectedCall("f", ["x"])])
    assert resolve_structure(calls) == (False, ["f.x"])


def test_resolve_not_checked() -> None:
    assert resolve_structure(make()) == (None, None)
    assert resolve_structure(make(response_text='{"a": 1}')) == (None, None)
    assert resolve_structure(make(expected_fields=["a"])) == (None, None)
    assert resolve_structure(make(response_text="{}", expected_fields=[])) == (None, None)
    # only ok answers are judged
    assert resolve_structure(make(status="error", response_text="{}", expected_fields=["a"], missing_fields=["a"])) == (
        None,
        None,
    )
