"""Hostile ``channel.control`` records (issue #30 items 2 and 4): bounded decode, signatures, the live cap.

Every refusal is a ``ValueError`` (``OverrideRefused`` or msgspec's), counted by
the reader by reason and logged in one line; the table and the other
overrides are left as they were.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import jsonschema
import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.config import MIN_PRODUCER_REQUEST_BYTES, ConfigError, ControlSettings, load_settings
from pipeline.contracts import Verdict, encode
from pipeline.policy.override import (MAX_BY_CHARS, MAX_NAME_CHARS, MAX_REASON_CHARS, MAX_TS_MS, Override,
                                      OverrideRefused, OverrideTable)
from pipeline.redaction import Secret
from pipeline.stream.control import (ClearRecord, ControlReader, SetRecord, SignedRecord, audit_row, decode_record,
                                     encode_record, signature)
from pipeline.stream.control_agent import REQUEST_OVERHEAD_BYTES, ControlHook, fit_verdict

NOW = 1_790_000_000_000  # 2026-09-21, the wall clock of these tests
HOUR = 3_600_000
ANA = "ana-secret-0123456789"
BO = "bo-secret-9876543210xx"
KEYS = ControlSettings(keys=(("ana", Secret(ANA)), ("bo", Secret(BO))))


def override(channel: str = "c1", reason: str = "vendor incident", ttl_ms: int = HOUR, **extra) -> dict:
    fields = {"kind": "open", "channel": channel, "by": "ana", "reason": reason, "set_ts_ms": NOW,
              "expires_ts_ms": NOW + ttl_ms}
    fields.update(extra)
    return fields


def set_value(**kw) -> bytes:
    return json.dumps({"action": "set", "override": override(**kw)}).encode()


def reader(control: ControlSettings | None = None) -> ControlReader:
    return ControlReader("unused:9092", "channel.control", control=control)


def feed(r: ControlReader, table: OverrideTable, key: bytes | None, value: bytes | None, now_ms: int = NOW) -> list:
    rec = r.decode(value, key)
    return [] if rec is None else r.apply(table, rec, now_ms)


def verdict(channel: str = "c1") -> Verdict:
    return Verdict(channel=channel, route="r", state="healthy", weight=1.0, reasons=[], metrics={"route_share": 0.5},
                   ts_ms=NOW, seq=1)


def control_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "channel_health.control"]


# -- item 2: bounded records ---------------------------------------------------------------------


def test_one_megabyte_reason_is_refused_counted_logged_once_and_table_unchanged(caplog) -> None:
    r, table = reader(), OverrideTable()
    assert [c.action for c in feed(r, table, b"channel:c2", set_value(channel="c2"))] == ["set"]
    before = table.active()
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="channel_health.control"):
        assert feed(r, table, b"channel:c1", set_value(reason="x" * 1_000_000)) == []
    assert table.active() == before
    assert (r.bad_records, dict(r.refused)) == (1, {"too_large": 1})
    lines = control_lines(caplog)
    assert len(lines) == 1 and "too_large" in lines[0] and "channel:c1" in lines[0]


def test_a_flood_of_bad_records_logs_a_few_lines_and_counts_all(caplog) -> None:
    r, table = reader(), OverrideTable()
    with caplog.at_level(logging.WARNING, logger="channel_health.control"):
        for _ in range(500):
            feed(r, table, b"channel:c1", set_value(reason="y" * (MAX_REASON_CHARS + 1)))
    assert (r.bad_records, dict(r.refused)) == (500, {"malformed": 500})
    assert len(control_lines(caplog)) == 3
    assert table.active() == []


@pytest.mark.parametrize("field, value", [
    ("reason", "r" * (MAX_REASON_CHARS + 1)),
    ("by", "b" * (MAX_BY_CHARS + 1)),
    ("channel", "c" * (MAX_NAME_CHARS + 1)),
])
def test_overlong_text_fields_are_refused_with_their_name(field: str, value: str) -> None:
    with pytest.raises(OverrideRefused, match=field) as info:
        decode_record(set_value(**{field: value}))
    assert info.value.code == "malformed"


@pytest.mark.parametrize("expires", [2**64 - 1, 2**63, -1, MAX_TS_MS + 1, NOW + 25 * HOUR])
def test_expiry_out_of_range_or_beyond_the_max_ttl_is_refused(expires: int) -> None:
    value = set_value(expires_ts_ms=expires)
    with pytest.raises(OverrideRefused, match="expires_ts_ms must be an integer 0..9999999999999|exceeds the maximum"):
        decode_record(value)


def test_ttl_beyond_the_maximum_is_refused_with_a_readable_reason() -> None:
    with pytest.raises(OverrideRefused, match=r"TTL 25\.0 h exceeds the maximum 24 h") as info:
        decode_record(set_value(ttl_ms=25 * HOUR))
    assert info.value.code == "ttl"
    assert decode_record(set_value(ttl_ms=24 * HOUR)).override.expires_ts_ms == NOW + 24 * HOUR
    short = ControlSettings(max_ttl_ms=HOUR)
    with pytest.raises(OverrideRefused, match="maximum 1 h"):
        decode_record(set_value(ttl_ms=2 * HOUR), control=short)


def test_a_record_dated_in_the_future_cannot_outlive_the_max_ttl_from_now() -> None:
    r, table = reader(), OverrideTable()
    far = set_value(set_ts_ms=NOW + 365 * 24 * HOUR, expires_ts_ms=NOW + 365 * 24 * HOUR + HOUR)
    assert feed(r, table, b"channel:c1", far, now_ms=NOW) == []
    assert dict(r.refused) == {"ttl": 1} and table.active() == []


def test_hostile_expiries_never_drop_the_audit_rows_of_valid_records() -> None:
    r, hook = reader(), ControlHook()
    changes = []
    for channel, expires in (("a", NOW + HOUR), ("b", 2**64 - 1), ("c", -5), ("d", NOW + 2 * HOUR)):
        changes += feed(r, hook.table, f"channel:{channel}".encode(), set_value(channel=channel, expires_ts_ms=expires))
    hook.changes_to_verdicts(changes, engine=None)
    rows = hook.pending_audit
    assert [(row[0], row[1], row[9]) for row in rows] == [("channel:a", "set", NOW + HOUR),
                                                         ("channel:d", "set", NOW + 2 * HOUR)]
    assert all(0 <= ts <= MAX_TS_MS for row in rows for ts in (row[8], row[9], row[10], row[11]))
    assert r.bad_records == 2


_NOT_STR = [None, True, 1, 1.5, [], {}]
_NOT_INT = [None, True, 1.5, "1", [], {}, 2**70]
WRONG_SET = ([("kind", v) for v in [None, 1, "nuke", [], {}]]
             + [(f, v) for f in ("channel", "by", "reason") for v in _NOT_STR]
             + [(f, v) for f in ("set_ts_ms", "expires_ts_ms") for v in _NOT_INT]
             + [("weight", v) for v in [None, True, "0.5", [], {}, 1.5, -0.1, 1e308]])


@pytest.mark.parametrize("field, value", WRONG_SET)
def test_wrong_types_in_every_set_field_are_refused(field: str, value: object) -> None:
    fields = override(kind="weight", weight=0.5)
    fields[field] = value
    with pytest.raises(ValueError):
        decode_record(json.dumps({"action": "set", "override": fields}).encode(), b"channel:c1")


WRONG_CLEAR = ([("key", v) for v in _NOT_STR + ["", "nokey:x", "channel:", "channel:" + "c" * (MAX_NAME_CHARS + 1)]]
               + [("by", v) for v in _NOT_STR + ["", "b" * (MAX_BY_CHARS + 1)]]
               + [("reason", v) for v in _NOT_STR + ["r" * (MAX_REASON_CHARS + 1)]]
               + [("at_ms", v) for v in _NOT_INT + [-1, MAX_TS_MS + 1, 2**64 - 1]])


@pytest.mark.parametrize("field, value", WRONG_CLEAR)
def test_wrong_types_in_every_clear_field_are_refused(field: str, value: object) -> None:
    fields = {"action": "clear", "key": "channel:c1", "by": "bo", "reason": "fixed", "at_ms": NOW}
    fields[field] = value
    with pytest.raises(ValueError):
        decode_record(json.dumps(fields).encode())


def test_null_value_and_garbage_are_refused_by_the_reader() -> None:
    r, table = reader(), OverrideTable()
    for value in (None, b"", b"\xff\xfe", b"[]", b'{"action":"nuke"}', b'{"action":"set"}'):
        assert feed(r, table, b"channel:c1", value) == []
    assert r.bad_records == 6 and table.active() == []


def test_live_overrides_are_capped_and_the_cap_refusal_is_counted() -> None:
    r = reader(ControlSettings(max_overrides=3))
    table = r.new_table()
    for c in ("a", "b", "c"):
        assert len(feed(r, table, f"channel:{c}".encode(), set_value(channel=c))) == 1
    assert feed(r, table, b"channel:d", set_value(channel="d")) == []
    assert dict(r.refused) == {"too_many_overrides": 1}
    assert [o.channel for o in table.active()] == ["a", "b", "c"]
    # replacing one in force is not a new one; a clear makes room
    assert len(feed(r, table, b"channel:a", set_value(channel="a", reason="still"))) == 1
    clear = json.dumps({"action": "clear", "key": "channel:b", "by": "bo", "reason": "ok", "at_ms": NOW}).encode()
    assert len(feed(r, table, b"channel:b", clear)) == 1
    assert len(feed(r, table, b"channel:d", set_value(channel="d"))) == 1


def test_largest_allowed_override_keeps_the_verdict_under_the_producer_limit() -> None:
    worst = "\x01"  # JSON-escaped as \u0001: 6 bytes per character
    o = Override(kind="freeze", by=worst * MAX_BY_CHARS, reason=worst * MAX_REASON_CHARS, set_ts_ms=NOW,
                 expires_ts_ms=NOW + 24 * HOUR, route=worst * MAX_NAME_CHARS, key_id="k" * MAX_BY_CHARS)
    key, value = encode_record(SetRecord(o))
    assert decode_record(value, key).override.reason == o.reason  # it is allowed
    table = OverrideTable()
    table.put(o, NOW)
    v = table.apply(Verdict(channel=worst * MAX_NAME_CHARS, route=o.route, state="healthy", weight=1.0, reasons=[],
                            metrics={"route_share": 0.5}, ts_ms=NOW, seq=1))
    assert len(encode(v)) < 16_384 < MIN_PRODUCER_REQUEST_BYTES - REQUEST_OVERHEAD_BYTES


def test_final_guard_cuts_an_oversized_override_to_fit() -> None:
    hook = ControlHook(max_verdict_bytes=10_000)
    huge = Override(kind="open", by="ana", reason="z" * 1_000_000, set_ts_ms=NOW, expires_ts_ms=NOW + HOUR,
                    channel="c1")  # never decodable: put straight into the table
    hook.table.put(huge, NOW)
    [out] = hook.apply([verdict()])
    assert len(encode(out)) <= 10_000 and out.state == "open" and out.override["reason"].startswith("(cut:")
    assert hook.cut_verdicts == 1
    # a budget too small for any text: the override keeps only its numbers and kind
    assert fit_verdict(out, 200).override == {"kind": "open", "expires_ts_ms": NOW + HOUR, "set_ts_ms": NOW,
                                              "weight": 0.0, "state": "open"}


# -- item 4: signed records ----------------------------------------------------------------------


def signed(rec: SetRecord | ClearRecord, kid: str = "ana") -> tuple[bytes, bytes]:
    return encode_record(rec, KEYS, kid)


def set_rec(channel: str = "c1", by: str = "ana") -> SetRecord:
    return SetRecord(Override(kind="healthy", by=by, reason="ticket 42", set_ts_ms=NOW, expires_ts_ms=NOW + HOUR,
                              channel=channel))


def test_valid_signed_record_is_applied_and_audited_with_its_key_id() -> None:
    key, value = signed(set_rec(by="someone else"), "bo")
    assert json.loads(value)["kid"] == "bo"
    r, hook = reader(KEYS), ControlHook(KEYS)
    changes = feed(r, hook.table, key, value)
    hook.apply([verdict()])
    hook.changes_to_verdicts(changes, engine=_Engine())
    assert r.bad_records == 0
    assert hook.pending_audit[0][0:2] == ("channel:c1", "set") and hook.pending_audit[0][-1] == "bo"
    assert hook.table.last["c1"].override["key_id"] == "bo"
    # a signed clear by another operator: the audit names the clearing key
    ckey, cvalue = signed(ClearRecord(key="channel:c1", by="ana", reason="fixed", at_ms=NOW + 5), "ana")
    [change] = feed(r, hook.table, ckey, cvalue, NOW + 5)
    assert audit_row(change, NOW + 6)[-1] == "ana" and audit_row(change, NOW + 6)[6] == "ana"


class _Engine:
    class store:  # noqa: N801 - the shape pipeline.stream.control.bump_seq reads
        names = ["c1"]

    seq = [1]

    def mark_changed(self, rows: list[int]) -> None:
        pass


@pytest.mark.parametrize("case", ["unsigned", "bad_signature", "unknown_key", "replayed_under_other_key",
                                  "tampered_record", "forged_key_id_field"])
def test_with_keys_unsigned_and_badly_signed_records_are_refused(case: str, caplog) -> None:
    key, value = signed(set_rec("A"))
    env = json.loads(value)
    expect = {"unsigned": "unsigned", "bad_signature": "bad_signature", "unknown_key": "unknown_key",
              "replayed_under_other_key": "bad_signature", "tampered_record": "bad_signature",
              "forged_key_id_field": "bad_signature"}[case]
    if case == "unsigned":
        key, value = encode_record(set_rec("A"))
    elif case == "bad_signature":
        env["hmac"] = ("0" if env["hmac"][0] != "0" else "1") + env["hmac"][1:]
    elif case == "unknown_key":
        env["kid"] = "mallory"
    elif case == "replayed_under_other_key":
        key = b"channel:B"
    elif case == "tampered_record":
        env["record"] = env["record"].replace("ticket 42", "ticket 43")
    else:  # a record made up with a key id it claims for itself, signed with nobody's key
        env["record"] = env["record"].replace('"by":"ana"', '"by":"ana","key_id":"ana"')
        env["hmac"] = signature(b"not-a-configured-secret", key, env["record"].encode())
    if case != "unsigned":
        value = json.dumps(env).encode()
    r, table = reader(KEYS), OverrideTable()
    with caplog.at_level(logging.WARNING, logger="channel_health.control"):
        assert feed(r, table, key, value) == []
    assert dict(r.refused) == {expect: 1} and table.active() == []
    lines = control_lines(caplog)
    assert len(lines) == 1 and ANA not in lines[0] and BO not in lines[0]


def test_record_of_channel_a_signed_correctly_but_sent_under_key_b_is_refused() -> None:
    """Even with a valid signature over key B, the record must name the target of its key."""
    rec = set_rec("A")
    inner = msgspec.json.encode(rec)
    env = {"action": "signed", "kid": "ana", "hmac": signature(ANA.encode(), b"channel:B", inner),
           "record": inner.decode()}
    with pytest.raises(OverrideRefused) as info:
        decode_record(json.dumps(env).encode(), b"channel:B", KEYS)
    assert info.value.code == "key_mismatch"


def test_without_keys_records_work_as_today_and_the_reader_says_so_once(caplog) -> None:
    r, table = reader(), OverrideTable()
    forged = json.dumps({"action": "set", "override": override(key_id="ana")}).encode()
    with caplog.at_level(logging.WARNING, logger="channel_health.control"):
        assert len(feed(r, table, b"channel:c1", forged)) == 1
        assert len(feed(r, table, b"channel:c2", set_value(channel="c2"))) == 1
    assert [o.key_id for o in table.active()] == ["", ""]  # a key id is never taken from the record
    lines = control_lines(caplog)
    assert len(lines) == 1 and "CHANNEL_HEALTH_CONTROL_KEYS is unset" in lines[0]


def test_encode_record_signs_with_the_only_key_and_refuses_an_unknown_one() -> None:
    one = ControlSettings(keys=(("ana", Secret(ANA)),))
    key, value = encode_record(set_rec(), one)
    assert decode_record(value, key, one).override.key_id == "ana"
    with pytest.raises(ValueError, match="choose one"):
        encode_record(set_rec(), KEYS)
    with pytest.raises(ValueError, match="unknown control key id"):
        encode_record(set_rec(), KEYS, "mallory")


# -- settings ------------------------------------------------------------------------------------


def test_control_settings_are_read_from_the_environment(tmp_path) -> None:
    s = load_settings({"CHANNEL_HEALTH_CONTROL_KEYS": f"ana:{ANA}, bo:{BO}", "CHANNEL_HEALTH_OVERRIDE_MAX_TTL": "2h",
                       "CHANNEL_HEALTH_MAX_OVERRIDES": "7"}).control
    assert ([k for k, _ in s.keys], s.secret("bo"), s.max_ttl_ms, s.max_overrides) == \
        (["ana", "bo"], BO.encode(), 2 * HOUR, 7)
    assert ANA not in repr(load_settings({"CHANNEL_HEALTH_CONTROL_KEYS": f"ana:{ANA}"}))
    path = tmp_path / "keys"
    path.write_text(f"ana:{ANA}\nbo:{BO}\n")
    assert load_settings({"CHANNEL_HEALTH_CONTROL_KEYS": str(path)}).control.secret("ana") == ANA.encode()
    default = load_settings({}).control
    assert (default.keys, default.max_ttl_ms, default.max_overrides) == ((), 24 * HOUR, 1000)


@pytest.mark.parametrize("env, name", [
    ({"CHANNEL_HEALTH_CONTROL_KEYS": "ana"}, "CHANNEL_HEALTH_CONTROL_KEYS"),
    ({"CHANNEL_HEALTH_CONTROL_KEYS": "ana:short-secret"}, "CHANNEL_HEALTH_CONTROL_KEYS"),
    ({"CHANNEL_HEALTH_CONTROL_KEYS": f"a b:{ANA}"}, "CHANNEL_HEALTH_CONTROL_KEYS"),
    ({"CHANNEL_HEALTH_CONTROL_KEYS": f"ana:{ANA},ana:{BO}"}, "CHANNEL_HEALTH_CONTROL_KEYS"),
    ({"CHANNEL_HEALTH_OVERRIDE_MAX_TTL": "forever"}, "CHANNEL_HEALTH_OVERRIDE_MAX_TTL"),
    ({"CHANNEL_HEALTH_OVERRIDE_MAX_TTL": "400d"}, "CHANNEL_HEALTH_OVERRIDE_MAX_TTL"),
    ({"CHANNEL_HEALTH_MAX_OVERRIDES": "0"}, "CHANNEL_HEALTH_MAX_OVERRIDES"),
])
def test_bad_control_settings_raise_config_error_naming_the_variable(env: dict, name: str) -> None:
    with pytest.raises(ConfigError, match=name) as info:
        load_settings(env)
    assert ANA not in str(info.value) and BO not in str(info.value) and "short-secret" not in str(info.value)


# -- the language-neutral contract (schemas/control.v1.json) ---------------------------------------


SCHEMA = json.loads((Path(__file__).parents[2] / "schemas" / "control.v1.json").read_text())
VALIDATOR = jsonschema.Draft202012Validator(SCHEMA)


def test_control_schema_is_valid_and_its_bounds_are_the_code_bounds() -> None:
    jsonschema.Draft202012Validator.check_schema(SCHEMA)
    o = SCHEMA["$defs"]["set"]["properties"]["override"]["properties"]
    assert (o["by"]["maxLength"], o["reason"]["maxLength"], SCHEMA["$defs"]["name"]["maxLength"]) == \
        (MAX_BY_CHARS, MAX_REASON_CHARS, MAX_NAME_CHARS)
    assert SCHEMA["$defs"]["ts_ms"]["maximum"] == MAX_TS_MS
    fields = msgspec.structs.fields
    assert set(o) == {f.name for f in fields(Override)}
    assert SCHEMA["$defs"]["set"]["properties"]["override"]["required"] == [f.name for f in fields(Override)
                                                                           if f.required]
    assert SCHEMA["$defs"]["clear"]["required"] == ["action"] + [f.name for f in fields(ClearRecord) if f.required]
    assert set(SCHEMA["$defs"]["signed"]["required"]) == {"action"} | {f.name for f in fields(SignedRecord)}


@pytest.mark.parametrize("control", [ControlSettings(), KEYS], ids=["unsigned", "signed"])
def test_records_the_code_writes_satisfy_the_schema(control: ControlSettings) -> None:
    recs = [set_rec(), SetRecord(Override(kind="weight", by="ana", reason="r", set_ts_ms=NOW, expires_ts_ms=NOW + 1,
                                          channel="c" * MAX_NAME_CHARS, weight=0.0)),
            SetRecord(Override(kind="freeze", by="b" * MAX_BY_CHARS, reason="r" * MAX_REASON_CHARS, set_ts_ms=NOW,
                               expires_ts_ms=NOW + HOUR, route="r")),
            ClearRecord(key="route:r", by="bo", reason="", at_ms=NOW)]
    for rec in recs:
        _, value = encode_record(rec, control, "bo" if control.keys else None)
        VALIDATOR.validate(json.loads(value))
        if control.keys:
            VALIDATOR.validate(json.loads(json.loads(value)["record"]))


@pytest.mark.parametrize("value", [set_value(reason="r" * (MAX_REASON_CHARS + 1)), set_value(expires_ts_ms=2**64 - 1),
                                   set_value(channel=""), set_value(kind="nuke"), b'{"action":"clear","key":"x:1",'
                                   b'"by":"b","reason":"","at_ms":1}'])
def test_records_the_code_refuses_break_the_schema_too(value: bytes) -> None:
    with pytest.raises(ValueError):
        decode_record(value)
    assert not VALIDATOR.is_valid(json.loads(value))


# -- fuzz ----------------------------------------------------------------------------------------


def assert_within_bounds(rec: SetRecord | ClearRecord, control: ControlSettings) -> None:
    if isinstance(rec, ClearRecord):
        assert rec.key.split(":")[0] in ("channel", "route") and 0 <= rec.at_ms <= MAX_TS_MS
        assert 1 <= len(rec.by) <= MAX_BY_CHARS and len(rec.reason) <= MAX_REASON_CHARS
        return
    o = rec.override
    assert 0 <= o.set_ts_ms < o.expires_ts_ms <= min(MAX_TS_MS, o.set_ts_ms + control.max_ttl_ms)
    assert 1 <= len(o.by) <= MAX_BY_CHARS and 1 <= len(o.reason) <= MAX_REASON_CHARS
    assert 1 <= len(o.channel or o.route or "") <= MAX_NAME_CHARS
    assert o.weight is None or 0.0 <= o.weight <= 1.0
    assert o.key_id in ("",) + tuple(k for k, _ in control.keys)


_scalars = st.one_of(st.none(), st.booleans(), st.integers(min_value=-2**70, max_value=2**70),
                     st.floats(allow_nan=False), st.text(max_size=40))
_field_values = st.one_of(_scalars, st.sampled_from(["open", "healthy", "weight", "freeze", "c1", "ana"]),
                          st.integers(min_value=NOW - HOUR, max_value=NOW + 30 * HOUR), st.lists(_scalars, max_size=3))
_override_fields = st.dictionaries(
    st.sampled_from(["kind", "channel", "route", "by", "reason", "set_ts_ms", "expires_ts_ms", "weight", "key_id"]),
    _field_values, max_size=9)
_near_valid = st.one_of(  # a valid record with at most one field changed
    st.builds(lambda o: {"action": "set", "override": {**override(), **o}},
              st.dictionaries(st.sampled_from(["kind", "channel", "route", "by", "reason", "set_ts_ms",
                                               "expires_ts_ms", "weight", "key_id"]), _field_values, max_size=1)),
    st.builds(lambda c: {"action": "clear", "key": "channel:c1", "by": "bo", "reason": "ok", "at_ms": NOW, **c},
              st.dictionaries(st.sampled_from(["key", "by", "reason", "at_ms", "key_id"]), _field_values,
                              max_size=1)))
_records = st.one_of(
    st.builds(lambda o: {"action": "set", "override": o}, _override_fields),
    st.dictionaries(st.sampled_from(["action", "key", "by", "reason", "at_ms", "key_id"]),
                    st.one_of(_field_values, st.just("clear"), st.just("channel:c1")), max_size=6),
    st.recursive(_scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner,
                                                                                        max_size=3), max_leaves=8))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(raw=st.one_of(st.binary(max_size=300), _records.map(lambda r: json.dumps(r).encode()),
                    _near_valid.map(lambda r: json.dumps(r).encode())),
       key=st.sampled_from([None, b"channel:c1", b"channel:c1", b"channel:c2", b"\xff"]),
       with_keys=st.booleans(), sign=st.booleans())
def test_fuzzed_values_are_refused_or_decoded_within_the_bounds(raw: bytes, key: bytes | None, with_keys: bool,
                                                                sign: bool) -> None:
    control = KEYS if with_keys else ControlSettings()
    if sign:
        text = raw.decode("utf-8", "replace")
        raw = json.dumps({"action": "signed", "kid": "ana", "record": text,
                          "hmac": signature(ANA.encode(), key or b"", text.encode())}).encode()
    try:
        rec = decode_record(raw, key, control)
    except ValueError:  # the documented refusal (OverrideRefused, msgspec.DecodeError/ValidationError)
        return
    assert_within_bounds(rec, control)
    if key is not None:
        assert key == (rec.override.key if isinstance(rec, SetRecord) else rec.key).encode()


def test_the_sink_process_scrubs_the_control_keys_from_its_logs_too() -> None:
    """Settings reach the sink process pickled, which does not register secrets: the child registers them."""
    import pickle
    import subprocess
    import sys

    settings = load_settings({"CHANNEL_HEALTH_CONTROL_KEYS": f"ana:{ANA}"})
    code = ("import pickle, sys\n"
            "from pipeline.redaction import redact_secrets\n"
            "from pipeline.sinks.child import _register_secrets\n"
            "s = pickle.loads(sys.stdin.buffer.read())\n"
            f"print(redact_secrets('key {ANA}'))\n"
            "_register_secrets(s)\n"
            f"print(redact_secrets('key {ANA}'))\n")
    out = subprocess.run([sys.executable, "-c", code], input=pickle.dumps(settings), capture_output=True,
                         timeout=60, check=True).stdout.decode().splitlines()
    assert out == [f"key {ANA}", "key ***"]
