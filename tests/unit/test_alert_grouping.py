"""Severity, silences, grouping and the heartbeat of the alert process, on a fake clock (no sleeps)."""

from __future__ import annotations

from pipeline.alert.config import Grouping, SeverityRule, Silence, parse_alert_config
from pipeline.alert.grouping import Grouper
from pipeline.alert.heartbeat import Heartbeat
from pipeline.alert.runner import AlertService
from pipeline.alert.severity import outcome, silenced_by, tier_of
from pipeline.contracts import Verdict, encode


def verdict(channel: str, state: str, route: str = "chat", reasons: list[str] | None = None, seq: int = 1,
            **metrics) -> Verdict:
    return Verdict(channel=channel, route=route, state=state, weight={"open": 0.0, "degraded": 0.5}.get(state, 1.0),
                   reasons=reasons if reasons is not None else ([] if state == "healthy" else ["error_rate"]),
                   metrics=metrics, ts_ms=1_750_000_000_000 + seq, seq=seq)


def test_default_severities_and_overrides() -> None:
    assert [outcome(verdict("a", s)) for s in ("open", "degraded", "healthy", "half_open", "recovering", "no_data")] \
        == ["critical", "warning", "resolve", "keep", "keep", "keep"]
    rules = (SeverityRule("info", state="degraded", tier="free"),
             SeverityRule("critical", reason="quota"),
             SeverityRule("resolve", route="batch-*", state="degraded"))
    assert outcome(verdict("x@free", "degraded"), rules) == "info"
    assert outcome(verdict("x@paid", "degraded"), rules) == "warning"
    assert outcome(verdict("x@paid", "degraded", reasons=["quota"]), rules) == "critical"
    assert outcome(verdict("y", "degraded", route="batch-eu"), rules) == "resolve"
    assert tier_of(verdict("plain", "open", tier="paid")) == "paid" and tier_of(verdict("plain", "open")) is None


def test_silences_match_by_glob_and_expire() -> None:
    s = Silence(until_s=1000.0, channel="lepton/*", route="*")
    assert silenced_by(verdict("lepton/llama@free", "open"), [s], wall_s=999.0) is s
    assert silenced_by(verdict("lepton/llama@free", "open"), [s], wall_s=1000.0) is None  # expired
    assert silenced_by(verdict("openai/gpt@paid", "open"), [s], wall_s=10.0) is None


def test_twenty_channels_opening_within_a_minute_give_two_alerts_then_one_resolve() -> None:
    g = Grouper(Grouping(group_wait_s=30, group_interval_s=300, repeat_interval_s=14_400))
    sent = []
    for t in range(0, 3601):  # one verdict per channel every 10 s, channel i opens at 3*i s, heals at 900 + 5*i s
        if t % 10 == 0 or t % 3 == 0:
            for i in range(20):
                if t >= 3 * i and (t % 10 == 0 or t == 3 * i):
                    state = "healthy" if t >= 900 + 5 * i else "open"
                    v = verdict(f"ch{i:02d}", state)
                    g.observe(v, outcome(v), float(t))
        sent += [(t, n) for n in g.due(float(t))]
    kinds = [(t, n.kind, len(n.firing), len(n.resolved)) for t, n in sent]
    assert kinds == [(30, "firing", 11, 0), (330, "firing", 20, 0), (1000, "resolved", 0, 20)]  # ch19 reports healthy at 1000
    assert all(n.severity == "critical" for _, n in sent[:2]) and sent[2][1].severity == "info"
    assert not g.groups


def test_repeats_suppressed_escalation_updates_and_repeat_interval_resends() -> None:
    g = Grouper(Grouping(group_wait_s=30, group_interval_s=300, repeat_interval_s=3600))
    g.observe(verdict("a", "degraded"), "warning", 0.0)
    assert g.due(29.0) == [] and [n.severity for n in g.due(30.0)] == ["warning"]
    for t in range(40, 300, 10):
        g.observe(verdict("a", "degraded", seq=t), "warning", float(t))
        assert g.due(float(t)) == []  # the same alert again: suppressed
    g.observe(verdict("a", "open"), "critical", 310.0)
    assert g.due(329.0) == [] and [n.severity for n in g.due(330.0)] == ["critical"]  # 300 s after the last
    assert g.due(3929.0) == [] and [n.kind for n in g.due(3930.0)] == ["firing"]  # repeat_interval
    assert g.next_due_s() == 3930.0 + 3600


def test_flap_inside_group_wait_sends_nothing() -> None:
    g = Grouper(Grouping(group_wait_s=30))
    g.observe(verdict("a", "open"), "critical", 0.0)
    g.observe(verdict("a", "healthy"), "resolve", 10.0)
    assert g.due(10.0) == [] and not g.groups


def test_heartbeat_fires_once_then_resolves_on_the_next_verdict() -> None:
    hb = Heartbeat(silent_after_s=2.0, now_s=100.0)
    assert hb.check(101.9) is None
    alert = hb.check(102.0)
    assert (alert.kind, alert.severity, alert.title) == ("firing", "critical", "pipeline silent")
    assert hb.check(110.0) is None  # not repeated
    resolve = hb.beat(111.0)
    assert (resolve.kind, resolve.key) == ("resolved", alert.key)
    assert hb.beat(112.0) is None and hb.next_due_s() == 114.0


def test_service_counts_bad_messages_and_silenced_channels() -> None:
    cfg = parse_alert_config({"route": [{"name": "im", "url": "http://h/x", "format": "json"}],
                              "silence": [{"channel": "muted", "until": "2030-01-01T00:00:00Z"}],
                              "grouping": {"group_wait_s": 1}}, env={})
    now = [0.0]
    svc = AlertService(cfg, clock=lambda: now[0], wall=lambda: 1_800_000_000.0)
    svc.handle(b"not json")
    svc.handle(b'{"channel": "a"}')
    svc.handle(None)
    svc.handle(encode(verdict("muted", "open")))
    svc.handle(encode(verdict("loud", "open")))
    now[0] = 1.0
    (n,) = svc.due()
    assert (svc.messages, svc.bad_messages, svc.silenced) == (5, 2, 1)
    assert [v.channel for v, _ in n.firing] == ["loud"]
