"""Manual overrides (issue #20 item 2): the pure table, the control-topic codec, the worker hook."""

from __future__ import annotations

import msgspec
import pytest

from pipeline.contracts import Verdict, decode_verdict, encode
from pipeline.policy.override import Override, OverrideTable, validate
from pipeline.stream.control import (ClearRecord, SetRecord, apply_record, audit_row, bump_seq, decode_record,
                                     encode_record)
from pipeline.stream.control_agent import ControlHook

T0 = 1_700_000_000_000


def verdict(channel: str = "c1", route: str = "r", state: str = "healthy", weight: float = 1.0,
            share: float = 0.5, seq: int = 1, reasons: list[str] | None = None) -> Verdict:
    return Verdict(channel=channel, route=route, state=state, weight=weight, reasons=reasons or [],
                   metrics={"route_share": share, "p95_ratio": 1.0}, ts_ms=T0, seq=seq)


def ov(kind: str = "open", channel: str | None = "c1", route: str | None = None, weight: float | None = None,
       ttl_ms: int = 60_000) -> Override:
    return Override(kind=kind, by="ana", reason="vendor incident", set_ts_ms=T0, expires_ts_ms=T0 + ttl_ms,
                    channel=channel, route=route, weight=weight)


def test_open_override_forces_state_weight_share_and_keeps_findings() -> None:
    t = OverrideTable()
    assert [c.action for c in t.put(ov("open"), T0)] == ["set"]
    out = t.apply(verdict(state="degraded", weight=0.5, reasons=["latency_p95_ratio"]))
    assert (out.state, out.weight, out.reasons) == ("open", 0.0, ["latency_p95_ratio"])
    assert out.metrics["route_share"] == 0.0
    assert (out.metrics["engine_state"], out.metrics["engine_weight"], out.metrics["engine_route_share"]) == \
        ("degraded", 0.5, 0.5)
    assert out.override == {"kind": "open", "by": "ana", "reason": "vendor incident", "expires_ts_ms": T0 + 60_000,
                            "set_ts_ms": T0, "weight": 0.0, "state": "open"}
    # the encoded verdict carries it, and decodes back
    assert decode_verdict(encode(out)).override == out.override


def test_weight_override_keeps_engine_state() -> None:
    t = OverrideTable()
    t.put(ov("weight", weight=0.3), T0)
    out = t.apply(verdict(state="degraded", weight=0.5))
    assert (out.state, out.weight, out.override["weight"]) == ("degraded", 0.3, 0.3)
    assert "state" not in out.override


def test_no_override_leaves_verdict_unchanged_and_unencoded() -> None:
    t = OverrideTable()
    v = verdict()
    assert t.apply(v) is v
    assert b"override" not in encode(v)


def test_expiry_is_wall_time_and_reported_once() -> None:
    t = OverrideTable()
    t.put(ov("healthy", ttl_ms=1_000), T0)
    t.apply(verdict(state="open", weight=0.0))
    assert t.expire(T0 + 999) == []
    gone = t.expire(T0 + 1_000)
    assert [(c.action, c.override.kind, c.at_ms) for c in gone] == [("expire", "healthy", T0 + 1_000)]
    assert t.expire(T0 + 2_000) == []
    again = t.republish("c1")
    assert again is not None and again.override is msgspec.UNSET
    assert (again.state, again.weight, again.seq) == ("open", 0.0, 2)


def test_already_expired_and_replayed_records_change_nothing() -> None:
    t = OverrideTable()
    assert t.put(ov(ttl_ms=10), T0 + 10) == []
    assert len(t.put(ov(), T0)) == 1
    assert t.put(ov(), T0) == []  # the same record again (topic replay)


def test_freeze_holds_route_weights_while_channel_degrades() -> None:
    t = OverrideTable()
    t.apply(verdict("a", share=0.5))
    t.apply(verdict("b", share=0.5))
    t.put(ov("freeze", channel=None, route="r"), T0)
    out = t.apply(verdict("a", state="open", weight=0.0, share=0.0, seq=2, reasons=["error_rate"]))
    assert (out.state, out.weight, out.metrics["route_share"], out.reasons) == ("open", 1.0, 0.5, ["error_rate"])
    assert out.override["kind"] == "freeze" and out.override["route"] == "r"
    assert t.affected(t.clear("route:r", T0 + 5)) == ["a", "b"]
    back = t.apply(verdict("a", state="open", weight=0.0, share=0.0, seq=3))
    assert (back.weight, back.metrics["route_share"]) == (0.0, 0.0)


def test_channel_override_wins_over_freeze() -> None:
    t = OverrideTable()
    t.put(ov("freeze", channel=None, route="r"), T0)
    t.put(ov("open"), T0)
    assert t.apply(verdict()).override["kind"] == "open"


def test_republish_of_an_overridden_verdict_starts_from_the_engine_values() -> None:
    t = OverrideTable()
    t.put(ov("open"), T0)
    t.apply(verdict(state="degraded", weight=0.5, share=0.4))
    t.clear("channel:c1", T0 + 1)
    back = t.republish("c1")
    assert (back.state, back.weight, back.metrics["route_share"], back.seq) == ("degraded", 0.5, 0.4, 2)
    assert "engine_state" not in back.metrics


@pytest.mark.parametrize("bad, message", [
    (dict(kind="weight", weight=1.5), "0..1"),
    (dict(kind="weight", weight=None), "0..1"),
    (dict(kind="open", reason=" "), "reason"),
    (dict(kind="open", expires_ts_ms=T0), "TTL"),
    (dict(kind="freeze", channel="c1", route=None), "route"),
    (dict(kind="open", channel=None, route="r"), "channel"),
])
def test_validate_refuses_bad_overrides(bad: dict, message: str) -> None:
    fields = dict(kind="open", by="ana", reason="x", set_ts_ms=T0, expires_ts_ms=T0 + 1, channel="c1")
    fields.update(bad)
    with pytest.raises(ValueError, match=message):
        validate(Override(**fields))


def test_control_record_codec_round_trip_and_clear_audit() -> None:
    key, value = encode_record(SetRecord(ov("weight", weight=0.25)))
    assert key == b"channel:c1"
    rec = decode_record(value)
    assert isinstance(rec, SetRecord) and rec.override.weight == 0.25
    t = OverrideTable()
    apply_record(t, rec, T0)
    key, value = encode_record(ClearRecord(key="channel:c1", by="bo", reason="fixed", at_ms=T0 + 5))
    changes = apply_record(t, decode_record(value), T0 + 5)
    row = audit_row(changes[0], T0 + 6)
    assert row == ("channel:c1", "clear", "weight", "c1", "", 0.25, "bo", "fixed", T0, T0 + 60_000, T0 + 5, T0 + 6, "")


def test_bad_control_records_are_refused() -> None:
    with pytest.raises(msgspec.ValidationError):
        decode_record(b'{"action": "nuke"}')
    with pytest.raises(ValueError, match="0..1"):
        decode_record(b'{"action":"set","override":{"kind":"weight","by":"a","reason":"r","set_ts_ms":1,'
                      b'"expires_ts_ms":2,"channel":"c","weight":2}}')


def test_hook_republishes_with_next_seq_and_moves_engine_seq() -> None:
    class Store:
        names = ["c0", "c1"]

    class Eng:
        store = Store()
        seq = [4, 7]
        changed = [False, False]

        def mark_changed(self, rows):
            for i in rows:
                self.changed[i] = True

    hook = ControlHook()
    hook.apply([verdict(seq=7)])
    out = hook.changes_to_verdicts(hook.table.put(ov("open"), T0), Eng())
    assert [(v.channel, v.seq, v.state) for v in out] == [("c1", 8, "open")]
    assert Eng.seq == [4, 8] and Eng.changed == [False, True]  # the next snapshot carries seq 8
    assert hook.pending_audit[0][:3] == ("channel:c1", "set", "open")
    bump_seq(Eng(), "unknown", 99)  # ignored
    assert Eng.seq == [4, 8]


def test_freeze_holds_weights_through_an_engine_outage_and_releases_on_expiry() -> None:
    """Engine replay: the primary fails hard under a route freeze; its verdicts go open with their reasons,
    weight and route_share stay at the pre-freeze values; after the TTL they follow the engine again."""
    from pipeline.engine.replay import replay

    start, warm_s, outage_s = 1_700_000_040_000, 600, 300
    events = []
    for k in range((warm_s + outage_s) * 4):
        ts, t_s = start + k * 250, k / 4
        for ch in ("primary", "backup"):
            down = ch == "primary" and t_s >= warm_s
            events.append({"event_id": f"{ch}{k}", "ts_ms": ts, "channel": ch, "route": "chat-70b",
                           "status": "error" if down else "ok", "latency_ms": 200.0 + k % 30, "tier": "paid"})
    _, verdicts = replay(events)
    t = OverrideTable()
    freeze_at = start + warm_s * 1000 - 30_000  # the verdicts' event time doubles as the wall clock here
    frozen = None
    seen = []
    for v in verdicts:
        if frozen is None and v.ts_ms >= freeze_at:
            frozen = {c: (x.weight, x.metrics["route_share"]) for c, x in t.last.items()}
            t.put(Override(kind="freeze", by="ana", reason="hold", set_ts_ms=freeze_at, route="chat-70b",
                           expires_ts_ms=freeze_at + outage_s * 1000 - 60_000), freeze_at)
        t.expire(v.ts_ms)
        seen.append((v, t.apply(v)))
    assert frozen == {"primary": (1.0, 0.5), "backup": (1.0, 0.5)}
    held = [(e, o) for e, o in seen if o.override is not msgspec.UNSET and o.channel == "primary"]
    assert any(e.state == "open" for e, _ in held)
    for e, o in held:
        assert (o.weight, o.metrics["route_share"], o.state, o.reasons) == (1.0, 0.5, e.state, e.reasons)
    last = seen[-1][1] if seen[-1][1].channel == "primary" else seen[-2][1]
    assert last.override is msgspec.UNSET and last.weight == 0.0 and last.state == "open"


# --- issue #35: `override list` folds the topic as the worker does -------------------------------------------------

def _records(*recs: SetRecord | ClearRecord) -> list[tuple[bytes, bytes]]:
    return [encode_record(r) for r in recs]


def _list_fold(monkeypatch: pytest.MonkeyPatch, records: list[tuple[bytes, bytes]], now_ms: int) -> OverrideTable:
    """What `override list` computes: :func:`read_overrides` over ``records`` (the broker read replaced)."""
    import asyncio

    from pipeline.stream import control

    async def fake_read_to_end(bootstrap, topic, handle, security=None, timeout_s=10.0):  # noqa: ANN001
        for k, v in records:
            handle(k, v)
        return len(records)

    monkeypatch.setattr(control, "read_to_end", fake_read_to_end)
    return asyncio.run(control.read_overrides("x", "channel.control", now_ms=now_ms))


def _worker_fold(arrivals: list[tuple[int, tuple[bytes, bytes]]], now_ms: int) -> tuple[OverrideTable, Verdict]:
    """What the worker publishes: each record applied at its arrival (wall ms), expiries at each poll and at
    ``now_ms``; returns its table and the verdict it publishes for c1 (engine weight 1) at ``now_ms``."""
    from pipeline.stream.control import ControlReader

    class Eng:  # the engine's part bump_seq touches
        class store:
            names = ["c1"]
        seq = [1]

        def mark_changed(self, rows: list[int]) -> None:
            pass

    hook, reader, eng = ControlHook(), ControlReader("x", "channel.control"), Eng()
    hook.apply([verdict("c1")])
    for at, (k, v) in arrivals:
        rec = reader.decode(v, k)
        assert rec is not None
        hook.changes_to_verdicts(reader.apply(hook.table, rec, at) + hook.table.expire(at), eng)
    hook.changes_to_verdicts(hook.table.expire(now_ms), eng)
    return hook.table, hook.apply([verdict("c1", seq=99)])[0]


def _set(kind: str, at: int, ttl_ms: int, weight: float | None = None, channel: str = "c1") -> SetRecord:
    return SetRecord(Override(kind=kind, by="ana", reason="r", set_ts_ms=at, expires_ts_ms=at + ttl_ms,
                              channel=channel, weight=weight))


@pytest.mark.parametrize("name, arrivals, now, weight", [
    # the report of issue #35: weight 0.2 for 30 min, then --healthy for 5 s (a bare "--ttl 5"), read 10 s later.
    # Old code: `override list` kept weight 0.2 (the expired healthy record was skipped) while the worker had
    # replaced it, let it expire, and published the engine's weight 1.
    ("stacked then expired", [(T0, _set("weight", T0, 1_800_000, 0.2)), (T0 + 1_000, _set("healthy", T0 + 1_000, 5_000))],
     T0 + 11_000, 1.0),
    ("stacked, both in force", [(T0, _set("weight", T0, 1_800_000, 0.2)), (T0 + 1_000, _set("open", T0 + 1_000, 60_000))],
     T0 + 11_000, 0.0),
    ("expired alone", [(T0, _set("weight", T0, 5_000, 0.2))], T0 + 11_000, 1.0),
    ("cleared", [(T0, _set("weight", T0, 1_800_000, 0.2)),
                 (T0 + 2_000, ClearRecord(key="channel:c1", by="bo", reason="done", at_ms=T0 + 2_000))],
     T0 + 11_000, 1.0),
    ("cleared then set again", [(T0, _set("open", T0, 1_800_000)),
                                (T0 + 2_000, ClearRecord(key="channel:c1", by="bo", reason="done", at_ms=T0 + 2_000)),
                                (T0 + 3_000, _set("weight", T0 + 3_000, 600_000, 0.3))], T0 + 11_000, 0.3),
])
def test_override_list_matches_what_the_worker_publishes(monkeypatch: pytest.MonkeyPatch, name: str,
                                                         arrivals: list, now: int, weight: float) -> None:
    encoded = [(at, encode_record(rec)) for at, rec in arrivals]
    listed = _list_fold(monkeypatch, [kv for _, kv in encoded], now)
    worker, published = _worker_fold(encoded, now)
    assert listed.active() == worker.active(), name
    assert published.weight == weight, name
    in_force = listed.active()
    listed_weight = (1.0 if not in_force else {"open": 0.0, "healthy": 1.0}.get(in_force[0].kind, in_force[0].weight))
    assert listed_weight == published.weight, name


def test_expired_record_replacing_an_override_is_audited_as_set_and_expire() -> None:
    t = OverrideTable()
    t.put(ov("weight", weight=0.2, ttl_ms=1_800_000), T0)
    late = Override(kind="healthy", by="bo", reason="r", set_ts_ms=T0, expires_ts_ms=T0 + 5_000, channel="c1")
    assert [(c.action, c.override.kind) for c in t.put(late, T0 + 6_000)] == [("set", "healthy"),
                                                                               ("expire", "healthy")]
    assert t.active() == []
