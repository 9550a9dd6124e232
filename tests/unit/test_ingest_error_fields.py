"""The decoder and the error fields of SPEC §3 (issue #32): bounds, dead letters, the class at ingest."""

from __future__ import annotations

import msgspec
import pytest

from pipeline.ingest import reasons as R
from pipeline.ingest.decode import Decoder

NOW = 1_767_225_600_000


def _raw(**extra: object) -> bytes:
    doc = {"event_id": "e1", "ts_ms": NOW, "channel": "openai/gpt-4o", "route": "chat", "status": "error",
           "latency_ms": 12.0, **extra}
    return msgspec.json.encode(doc)


@pytest.mark.parametrize(("extra", "reason", "field"), [
    ({"retry_after_s": -1}, R.OUT_OF_RANGE, "retry_after_s"),
    ({"retry_after_s": 86_401}, R.OUT_OF_RANGE, "retry_after_s"),
    ({"retry_after_s": "20"}, R.WRONG_TYPE, "retry_after_s"),
    ({"account": ""}, R.OUT_OF_RANGE, "account"),
    ({"account": "a" * 513}, R.OUT_OF_RANGE, "account"),
    ({"account": 7}, R.WRONG_TYPE, "account"),
    ({"error_message": "m" * 65_537}, R.OUT_OF_RANGE, "error_message"),
    ({"error_message": ["x"]}, R.WRONG_TYPE, "error_message"),
    ({"error_class": "fatal"}, R.INVALID_ENUM, "error_class"),
])  # fmt: skip
def test_out_of_bounds_error_fields_are_dead_lettered_naming_the_field(extra: dict, reason: str,
                                                                        field: str) -> None:
    result = Decoder().decode(_raw(**extra), NOW)
    assert result.events == []
    [dead] = result.dead_letters
    assert dead.reason == reason and dead.detail.startswith(field + ":")


def test_in_bounds_error_fields_are_kept_and_the_class_resolved() -> None:
    raw = _raw(http_status=429, retry_after_s=86_400, account="acct-a", error_message="余额不足" + "x" * 700)
    [event] = Decoder().decode(raw, NOW).events
    assert event.retry_after_s == 86_400 and event.account == "acct-a"
    assert event.error_message == ("余额不足" + "x" * 700)[:512]
    assert event.error_class == "quota_exhausted"


def test_a_bad_element_of_a_batch_costs_only_itself() -> None:
    good = _raw(http_status=401)
    bad = _raw(event_id="e2", retry_after_s=-5)
    result = Decoder().decode(b'{"events":[' + good + b"," + bad + b"]}", NOW)
    assert [(e.event_id, e.error_class) for e in result.events] == [("e1", "credential")]
    assert [(d.reason, d.index) for d in result.dead_letters] == [(R.OUT_OF_RANGE, 1)]


def test_lean_path_resolves_the_class_too() -> None:
    decoded = Decoder().decode_many([_raw(http_status=400, error_message="maximum context length is 8192 tokens"),
                                     _raw(event_id="e2", status="ok")], NOW)
    assert [e.error_class for e in decoded.events] == ["caller", None]
