"""SPEC §4.2 probe on evidence (issue #33): an ``open`` channel whose own traffic still fails when its cooldown
ends (a trailing failure run of a trip's length, failures in the last round, no 429 among them) counts a
failed probe without going ``half_open``: it stays ``open`` and backs off (:meth:`ChannelMachine.probe_answered`).

On the code before, every cooldown's end sent the channel ``half_open`` (weight 0.05, real users' requests)
and its probe failed at once: the engine test below fails there (``half_open`` at 720 s into a 503 outage)."""

from __future__ import annotations

import pytest

from pipeline.engine.replay import replay
from pipeline.policy.defaults import PolicyConfig
from pipeline.policy.state_machine import HALF_OPEN, OPEN, ChannelMachine

from tests.unit.test_error_class_policy import T0, _stream, _t

CFG = PolicyConfig()


def test_probe_answered_counts_a_failed_probe_only_once_the_cooldown_ended():
    m = ChannelMachine()
    m.trip(T0, ["consecutive_failures"], CFG)
    assert m.probe_answered(T0 + 89_999, CFG) is False and m.next_probe_ms(CFG) == T0 + 90_000  # still cooling
    assert m.probe_answered(T0 + 90_000, CFG) is True
    # stays open, the next attempt of the re-open series: 90 s x 2 with its jitter, from now
    want = CFG.backoff("").delay_ms(1, seed=T0 + 90_000)
    assert 180_000 <= want <= 198_000
    assert (m.state, m.weight, m.reopens, m.cooldown_ms, m.entered_ms) == (OPEN, 0.0, 1, want, T0 + 90_000)
    assert m.reasons == ["consecutive_failures"] and m.next_probe_ms(CFG) == T0 + 90_000 + want
    assert m.probe_answered(T0 + 90_000 + want, CFG) is True and m.reopens == 2  # 90 s x 4 (+ jitter) next
    assert m.cooldown_ms == CFG.backoff("").delay_ms(2, seed=T0 + 90_000 + want)
    # a failed probe after it (half_open -> open) is the attempt after those: the series is one
    m.step(m.next_probe_ms(CFG), [], [], 0.0, 0.0, None, CFG, CFG.thresholds("c", "paid"))
    assert m.state == HALF_OPEN
    m.trip(m.entered_ms + 1_000, ["consecutive_failures"], CFG)
    assert m.reopens == 3
    for cause, reason in (("credential", "credential_invalid"), ("rate_limited", "rate_limited")):
        other = ChannelMachine()  # an error class keeps its own schedule (SPEC §4.1): its probe runs
        other.trip(T0, [reason], CFG, cause=cause)
        assert other.probe_answered(T0 + 3_600_000, CFG) is False and other.reopens == 0
    assert ChannelMachine().probe_answered(T0, CFG) is False  # not open


def _faults(ch: str, i: int, t: float) -> dict | None:
    """From 600 s to 1500 s: ``x503`` answers 503 to every request, ``silent`` fails until 650 s and then
    sends nothing, ``x429`` answers 503 until 700 s (opened by the detectors) and then 429 (no Retry-After),
    ``half`` fails every other one;
    ``ok*`` (their route peers) never fail."""
    if not 600 <= t < 1500:
        return None
    if ch.startswith(("x503", "silent")):
        return {"http": 503}
    if ch.startswith("x429"):
        return {"http": 503 if t < 700 else 429}
    if ch.startswith("half") and i % 2 == 0:
        return {"http": 503}
    return None


def _events() -> list[dict]:
    names = ("x503", "silent", "x429", "half")
    chans = {**{f"{n}/m@paid": {"route": n} for n in names}, **{f"ok{n}/m@paid": {"route": n} for n in names}}
    return [e for e in _stream(chans, 0, 2400, _faults)
            if not (e["channel"] == "silent/m@paid" and 650 <= (e["ts_ms"] - T0) / 1000 < 1500)]


def test_an_open_channel_whose_own_traffic_still_fails_is_not_probed_until_it_answers():
    _, verdicts = replay(_events())
    by = {ch: [v for v in verdicts if v.channel == ch] for ch in ("x503/m@paid", "silent/m@paid",
                                                                   "x429/m@paid", "half/m@paid")}
    x503 = by["x503/m@paid"]
    first = next(v for v in x503 if v.state == OPEN)
    assert 600 < _t(first) < 603  # the failure run pre-trips it
    # no half_open while its own 503s go on: at each round at or after the published cooldown end it stays
    # open, with the next cooldown of the series (90 s, then 90 s x 2, x 4, x 8, with jitter) from that round
    assert [_t(v) for v in x503 if v.state == HALF_OPEN and _t(v) < 1500] == []
    answered, due, k = [], first.metrics["next_probe_ts_ms"], 0
    for v in x503:
        if v.state == OPEN and v.ts_ms >= due and _t(v) < 1500:
            k += 1
            assert v.ts_ms == -(-due // 30_000) * 30_000  # the first round at or after it
            assert v.metrics["next_probe_ts_ms"] == v.ts_ms + CFG.backoff("").delay_ms(k, seed=v.ts_ms)
            answered.append(_t(v))
            due = v.metrics["next_probe_ts_ms"]
    assert answered == [720.0, 930.0, 1320.0] and k == 3
    # the outage ended at 1500 s: the probe comes at the round after the last published cooldown end, passes
    back = next(v for v in x503 if v.state != OPEN and _t(v) > 1500)
    assert back.state == HALF_OPEN and back.ts_ms == -(-due // 30_000) * 30_000
    assert next(v for v in x503 if _t(v) > _t(back) and v.state != HALF_OPEN).state == "recovering"
    # no traffic in the last round (silent), a rate limit (x429: SPEC §4.1 judges it on its probe) or no
    # run of a trip's length (half: every other request fails): the half_open probe runs as before
    for ch in ("silent/m@paid", "x429/m@paid", "half/m@paid"):
        opened = next(v for v in by[ch] if v.state == OPEN)
        probe = next(v for v in by[ch] if v.state == HALF_OPEN)
        assert probe.ts_ms == -(-opened.metrics["next_probe_ts_ms"] // 30_000) * 30_000, ch
        assert _t(probe) < 1500, ch


@pytest.mark.parametrize("threshold", [3, 8])
def test_the_evidence_is_a_run_of_the_channels_own_trip_threshold(threshold, tmp_path):
    """The run asked for is the channel's ``consecutive_failures`` (its tier's, here 3 or 8): ``x503``'s run
    is the whole round, over either; ``half`` fails every other request, a run of 1, under either."""
    from pipeline.policy.defaults import load_policy

    path = tmp_path / "policy.toml"
    path.write_text(f"[tier.paid.consecutive_failures]\nconsecutive_failures = {threshold}\n")
    cfg = load_policy(path)
    assert cfg.thresholds("x503/m@paid", "paid").consecutive_failures == threshold
    _, verdicts = replay(_events(), policy=cfg)
    assert not [v for v in verdicts if v.channel == "x503/m@paid" and v.state == HALF_OPEN and _t(v) < 1500]
    assert [v for v in verdicts if v.channel == "half/m@paid" and v.state == HALF_OPEN and _t(v) < 1500]


def test_probe_on_evidence_can_be_turned_off_and_is_validated(tmp_path):
    import dataclasses

    from pipeline.policy.defaults import load_policy

    assert CFG.probe_on_evidence is True
    _, verdicts = replay(_events(), policy=dataclasses.replace(CFG, probe_on_evidence=False))
    assert [_t(v) for v in verdicts if v.channel == "x503/m@paid" and v.state == HALF_OPEN and _t(v) < 1500] == [
        720.0, 930.0, 1320.0]  # each cooldown's end probes, and the probe fails within the round (as before)
    path = tmp_path / "policy.toml"
    path.write_text("[policy]\nprobe_on_evidence = false\n")
    assert load_policy(path).probe_on_evidence is False
    for bad in (1, "no"):
        with pytest.raises(ValueError, match="probe_on_evidence must be true or false"):
            PolicyConfig(probe_on_evidence=bad)
