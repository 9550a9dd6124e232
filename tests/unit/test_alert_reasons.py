"""Alerts in people's numbers (issue #35 part 3): the reason table, unknown codes, forced states, restarts."""

from __future__ import annotations

import math

import msgspec
import pytest
from hypothesis import given, settings, strategies as st

from pipeline.alert.config import parse_alert_config
from pipeline.alert.formats import channel_line, text
from pipeline.alert.reasons import RENDERERS, next_step, pct, render_reason
from pipeline.alert.runner import AlertService
from pipeline.contracts import Verdict, encode

#: The metrics of a real verdict: error-creep seed 0, the first open (/work/notes/digest/final/error-creep.0.jsonl).
CREEP = {"consecutive_failures": 0.0, "error_rate_1m": 0.0207, "error_rate_5m": 0.0049, "requests_1m": 242.0,
         "requests_5m": 1215.0, "error_rate_trip": 0.005, "error_cusum": 18.6405, "error_cusum_h": 13.4601,
         "error_baseline_rate": 0.0002, "p95_ms": 640.2, "baseline_p95_ms": 171.0, "latency_p95_ratio": 3.74,
         "latency_samples_5m": 1209.0, "missing_rate_5m": 0.031, "checked_5m": 880.0, "missing_baseline_rate": 0.005,
         "quota_remaining": 0.04, "quota_drain_per_h": 0.3, "quota_exhaustion_s": 480.0, "route_share": 0.0}
T = 1_780_005_840_000


def v(state: str = "open", reasons: tuple[str, ...] = ("error_rate",), metrics: dict | None = None,
      seq: int = 1, channel: str = "creep/llama-70b@paid", **kw) -> Verdict:
    return Verdict(channel=channel, route="creep", state=state, weight={"open": 0.0}.get(state, 1.0),
                   reasons=list(reasons), metrics=CREEP if metrics is None else metrics, ts_ms=T + seq, seq=seq, **kw)


def test_each_reason_shows_value_line_or_baseline_and_sample_size() -> None:
    assert render_reason("error_rate", CREEP) == ("error rate 2.1 % last minute, 0.49 % over 5 min "
                                                  "(line 0.5 %, baseline 0.02 %, 1,215 requests)")
    assert render_reason("latency_p95_ratio", CREEP) == "P95 640 ms vs 171 ms baseline (3.7x, 1,209 requests)"
    assert render_reason("missing_fields", CREEP) == ("missing fields in 3.1 % of answers over 5 min "
                                                      "(baseline 0.5 %, 880 checked)")
    assert render_reason("quota", CREEP) == "quota 4 % left, draining 30 % per hour, empty in about 8 min"
    line = channel_line(v(), since_ms=T)
    assert "error_cusum" not in line and "reasons -" not in line
    assert line.endswith("next: next probe at about 22:05:30 UTC (half_open 90 s after the trip, longer after "
                         "repeated trips)")


@pytest.mark.parametrize("code, metrics, expected", [
    ("credential_invalid", {"credential_invalid_share_5m": 0.5, "requests_5m": 40.0}, "credential invalid "
     "(credential_invalid_share_5m 0.5)"),
    ("route_panic", {"route_panic_healthy_share": 0.25, "route_share": 0.1}, "route panic (route_panic_healthy_share "
     "0.25, route_share 0.1)"),
    ("rate_limited", {}, "rate limited"),
    ("quota_exhausted", {"quota_remaining": 0.0}, "quota exhausted (quota_remaining 0)"),
    ("caller_errors", {"caller_errors_5m": 1204.0}, "caller errors (caller_errors_5m 1,204)"),
])
def test_unknown_codes_render_generically_from_their_metrics(code: str, metrics: dict, expected: str) -> None:
    assert code not in RENDERERS
    assert render_reason(code, metrics) == expected


def test_over_capacity_shows_the_cap_the_share_taken_and_the_failures() -> None:
    """Issue #33 part 2: the capped backup's reason in numbers (before: the generic 'over capacity' line)."""
    m = {"max_share": 0.549, "route_share": 1.0, "error_rate_1m": 0.0178}
    assert render_reason("over_capacity", m) == ("over capacity: cap 55 % of the route, taking 100 %, "
                                                 "1.8 % failing last minute")


def test_a_known_code_with_its_numbers_missing_falls_back_instead_of_blanking() -> None:
    assert render_reason("latency_p95_ratio", {"p95_ms": None, "latency_p95_ratio": 2.5}) == \
        "latency p95 ratio (latency_p95_ratio 2.5)"
    assert render_reason("error_rate", {"error_rate_5m": math.nan}) == "error rate"
    assert render_reason("latency_p95_ratio", {"p95_ms": 10.0, "baseline_p95_ms": 0.0}) == \
        "P95 10 ms vs 0 ms baseline (infx)"


_values = st.one_of(st.none(), st.floats(allow_nan=True, allow_infinity=True), st.integers(-10**30, 10**30),
                    st.text(max_size=5), st.booleans())


@settings(max_examples=300, deadline=None)
@given(code=st.one_of(st.sampled_from(sorted(RENDERERS)), st.text(max_size=30)),
       metrics=st.dictionaries(st.sampled_from(sorted(CREEP) + ["x", "rate_limited_n"]), _values, max_size=12))
def test_rendering_never_raises_nor_returns_empty(code: str, metrics: dict) -> None:
    out = render_reason(code, metrics)
    assert isinstance(out, str) and (out or code == "")
    # 4 metrics at most, each a short number: huge values (1e30) are not spelled out digit by digit
    assert len(out) <= len(code) + 4 * 60 + 200, out


def test_huge_values_stay_short() -> None:
    assert render_reason("latency_p95_ratio", {"p95_ms": 1e300, "baseline_p95_ms": 1e-300,
                                               "latency_samples_5m": 1e300}) == \
        "P95 1e+300 ms vs 1e-300 ms baseline (infx, 1e+300 requests)"
    assert render_reason("quota", {"quota_remaining": 1e30, "quota_exhaustion_s": 1e30}) == \
        "quota 1e+32 % left, empty in about 1.16e+25 d"


def test_pct_keeps_two_digits_and_small_values_visible() -> None:
    assert [pct(x) for x in (0.0207, 0.005, 0.0002, 0.0, 0.5, 1.0, 1e-7)] == \
        ["2.1 %", "0.5 %", "0.02 %", "0 %", "50 %", "100 %", "1.0e-05 %"]


def test_forced_open_alert_says_who_forced_it_and_why() -> None:
    forced = v(reasons=(), metrics={**CREEP, "engine_state": "healthy"},
               override={"kind": "open", "by": "ana", "key_id": "oncall-2", "reason": "vendor incident #123",
                         "expires_ts_ms": T + 1_800_000, "state": "open", "weight": 0.0})
    line = channel_line(forced)
    assert line == ("state open, weight 0, forced open by ana (key oncall-2) until 22:34:00 UTC: vendor incident "
                    "#123; detectors: nothing found; next: held by the override until 22:34:00 UTC; then the "
                    "detectors decide again")
    unsigned = msgspec.structs.replace(forced, override={"kind": "weight", "by": "bo", "reason": "ticket",
                                                         "weight": 0.2})
    assert "weight forced to 0.2 by bo (unsigned): ticket" in channel_line(unsigned)


def test_next_step_per_state() -> None:
    assert next_step("half_open", T, 90_000, 90_000).startswith("probing: recovers at about 22:05:30 UTC")
    assert next_step("open", None, 90_000, 90_000) == ("next probe (half_open 90 s after the trip, longer after "
                                                       "repeated trips)")
    assert next_step("weird", None, 1, 1) == "nothing: healthy"


def test_an_open_channel_says_the_probe_time_its_verdict_published() -> None:
    """A re-open after a failed probe backs off (180 s here, SPEC §4.2): the alert says that, not 90 s."""
    assert next_step("open", T, 90_000, 90_000, next_probe_ts_ms=T + 180_000) == (
        "next probe at 22:07:00 UTC (half_open 3 min after the trip, as the worker published)")
    assert next_step("open", None, 90_000, 90_000, next_probe_ts_ms=T + 180_000) == (
        "next probe at 22:07:00 UTC (half_open, as the worker published)")


def _service() -> tuple[AlertService, list[float]]:
    cfg = parse_alert_config({"route": [{"name": "im", "url": "http://h/x", "format": "json"}],
                              "grouping": {"group_wait_s": 1}}, env={})
    now = [0.0]
    return AlertService(cfg, clock=lambda: now[0], wall=lambda: 1_800_000_000.0), now


def test_a_restarted_alert_process_resolves_what_it_fired() -> None:
    """Old code: a restarted process started empty, so the channel's healthy verdict resolved nothing."""
    first, now = _service()
    first.handle(encode(v(seq=1)))
    now[0] = 2.0
    (fired,) = first.due()
    assert fired.kind == "firing"
    # the process restarts: the compacted topic holds the newest verdict per channel
    topic = [encode(v(seq=1)), encode(v(channel="calm", state="healthy", reasons=(), seq=5)), b"junk", None]
    second, now2 = _service()
    assert second.rebuild(topic) == 1 and second.bad_messages == 1
    now2[0] = 2.0
    (again,) = second.due()
    assert again.kind == "firing" and again.key == fired.key
    assert again.detail.startswith("still firing after an alert-process restart")
    second.handle(encode(v(seq=1)))  # the group offsets replay an old verdict: ignored
    second.handle(encode(v(state="healthy", reasons=(), seq=9)))
    now2[0] = 400.0
    (resolved,) = [n for n in second.due() if n.key != "channel-health/heartbeat"]
    assert (resolved.kind, resolved.key, [x.channel for x in resolved.resolved]) == \
        ("resolved", fired.key, ["creep/llama-70b@paid"])


def test_a_half_open_channel_after_a_restart_is_still_firing_and_the_text_has_its_next_step() -> None:
    svc, now = _service()
    assert svc.rebuild([encode(v(state="half_open", seq=3))]) == 1
    now[0] = 2.0
    (n,) = svc.due()
    assert n.severity == "critical" and "next: probing: recovers at about" in text(n)
