"""A verdict's reasons in people's numbers (issue #35 part 3): one table, reason code → renderer.

Each renderer reads the verdict's ``metrics`` (SPEC §3: the numbers behind
the reasons, keys as the signals publish them, :mod:`pipeline.signals`) and
returns one phrase with the value, its line or baseline and its sample size:

- ``error_rate``: ``error rate 2.1 % last minute, 0.49 % over 5 min (line 0.5 %, baseline 0.02 %, 1,215 requests)``
- ``latency_p95_ratio``: ``P95 640 ms vs 171 ms baseline (3.7x, 1,209 requests)``

A reason without a renderer (a code added after this table, e.g.
``credential_invalid`` or ``route_panic``), or whose renderer finds its
numbers missing, is rendered generically: the code in words and the metrics
that share its name (or its signal's declared metrics), so a new code never
breaks or blanks an alert. Rendering never raises.
"""

from __future__ import annotations

import math
import time
from typing import Any, Callable, Mapping, Sequence

Metrics = Mapping[str, Any]
Renderer = Callable[[Metrics], str]

#: Metrics shown at most by the generic renderer of one reason.
GENERIC_MAX = 4


class Missing(LookupError):
    """A renderer's number is absent or not finite: the generic renderer takes over."""


def _f(m: Metrics, key: str) -> float:
    x = m.get(key)
    if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x):
        raise Missing(key)
    return float(x)


def _opt(m: Metrics, key: str) -> float | None:
    try:
        return _f(m, key)
    except Missing:
        return None


#: Above this magnitude a number is written in 3 significant digits (``1.2e+12``): a corrupt or hostile
#: metric must not spell out hundreds of digits in an alert.
HUGE = 1e9


def pct(x: float) -> str:
    """A share 0..1 as a percentage with two significant digits: ``0.0207`` → ``2.1 %``, ``0.0002`` → ``0.02 %``."""
    p = 100.0 * x
    if p == 0:
        return "0 %"
    if abs(p) >= HUGE:
        return f"{p:.3g} %"
    if abs(p) >= 10:
        return f"{p:.0f} %"
    return f"{p:.2g} %" if abs(p) >= 0.01 else f"{p:.1e} %"


def count(x: float) -> str:
    """A count with thousands separators: ``1215.0`` → ``1,215``."""
    return f"{x:.3g}" if abs(x) >= HUGE else f"{int(round(x)):,}"


def ms(x: float) -> str:
    """Milliseconds: ``2699.58`` → ``2,700 ms``, ``95.6`` → ``96 ms``, ``0.4`` → ``0.4 ms``."""
    if abs(x) >= HUGE:
        return f"{x:.3g} ms"
    return f"{x:,.0f} ms" if abs(x) >= 1 else f"{x:.2g} ms"


def duration(s: float) -> str:
    """Seconds as ``45 s``, ``12 min``, ``3.5 h``, ``2.0 d``."""
    if s < 120:
        return f"{s:.0f} s"
    if s < 5400:
        return f"{s / 60:.0f} min"
    if s < 172_800:
        return f"{s / 3600:.1f} h"
    return f"{s / 86400:.3g} d"


def number(x: Any) -> str:
    """Any metric value for the generic renderer: counts with separators, small numbers with 3 digits."""
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return str(x)
    if not math.isfinite(x):
        return str(x)
    if float(x).is_integer() and abs(x) < HUGE:
        return f"{int(x):,}"
    return f"{x:.3g}"


def _error_rate(m: Metrics) -> str:
    r1, r5 = _opt(m, "error_rate_1m"), _opt(m, "error_rate_5m")
    if r1 is None and r5 is None:
        raise Missing("error_rate_5m")
    spans = ([f"{pct(r1)} last minute"] if r1 is not None else []) + \
        ([f"{pct(r5)} over 5 min"] if r5 is not None else [])
    parts = []
    trip, base = _opt(m, "error_rate_trip"), _opt(m, "error_baseline_rate")
    if trip is not None:
        parts.append(f"line {pct(trip)}")
    if base is not None:
        parts.append(f"baseline {pct(base)}")
    n = _opt(m, "requests_5m") if r5 is not None else _opt(m, "requests_1m")
    if n is not None:
        parts.append(f"{count(n)} requests")
    return f"error rate {', '.join(spans)}" + (f" ({', '.join(parts)})" if parts else "")


def _consecutive(m: Metrics) -> str:
    n = _f(m, "consecutive_failures")
    line = _opt(m, "consecutive_failures_threshold")
    return f"{count(n)} failures in a row" + (f" (line {count(line)})" if line is not None else "")


def _latency(m: Metrics) -> str:
    p95, base = _f(m, "p95_ms"), _f(m, "baseline_p95_ms")
    n = _opt(m, "latency_samples_5m")
    ratio = p95 / base if base > 0 else math.inf
    extra = f"{ratio:.1f}x" + (f", {count(n)} requests" if n is not None else "")
    return f"P95 {ms(p95)} vs {ms(base)} baseline ({extra})"


def _missing(m: Metrics) -> str:
    rate, n = _f(m, "missing_rate_5m"), _f(m, "checked_5m")
    base = _opt(m, "missing_baseline_rate")
    return (f"missing fields in {pct(rate)} of answers over 5 min ("
            + (f"baseline {pct(base)}, " if base is not None else "") + f"{count(n)} checked)")


def _quality(m: Metrics) -> str:
    score, base = _f(m, "quality_score_5m"), _f(m, "quality_baseline")
    n = _opt(m, "quality_samples_5m")
    return f"quality score {score:.3g} vs {base:.3g} baseline" + (f" ({count(n)} scored)" if n is not None else "")


def _quota(m: Metrics) -> str:
    left = _f(m, "quota_remaining")
    drain, empty = _opt(m, "quota_drain_per_h"), _opt(m, "quota_exhaustion_s")
    text = f"quota {pct(left)} left"
    if drain is not None:
        text += f", draining {pct(drain)} per hour"
    if empty is not None:
        text += f", empty in about {duration(empty)}"
    return text


def _slow_stream(m: Metrics) -> str:
    out = []
    gap, gap_base = _opt(m, "stream_gap_p95_ms"), _opt(m, "stream_gap_baseline_p95_ms")
    if gap is not None and gap_base is not None:
        out.append(f"stream gap P95 {ms(gap)} vs {ms(gap_base)} baseline")
    ttft, ttft_base = _opt(m, "ttft_p95_ms"), _opt(m, "ttft_baseline_p95_ms")
    if ttft is not None and ttft_base is not None:
        out.append(f"first token P95 {ms(ttft)} vs {ms(ttft_base)} baseline")
    stall, n = _opt(m, "stall_share_5m"), _opt(m, "streams_5m")
    if stall is not None and n is not None:
        out.append(f"{pct(stall)} of {count(n)} streams stalled over 5 min")
    if not out:
        raise Missing("stream_gap_p95_ms")
    return "slow streams: " + ", ".join(out)


def _cost(m: Metrics) -> str:
    now, base = _f(m, "cost_per_request_usd"), _f(m, "cost_baseline_per_request_usd")
    n = _opt(m, "cost_requests_10m")
    return (f"cost per request {now:.3g} USD vs {base:.3g} USD baseline"
            + (f" ({count(n)} requests over 10 min)" if n is not None else ""))


def _over_capacity(m: Metrics) -> str:
    cap = _f(m, "max_share")
    share = _opt(m, "route_share")
    r1 = _opt(m, "error_rate_1m")
    return (f"over capacity: cap {pct(cap)} of the route" + (f", taking {pct(share)}" if share is not None else "")
            + (f", {pct(r1)} failing last minute" if r1 is not None else ""))


def _no_data(m: Metrics) -> str:
    return "no requests seen in the window"


#: The one table reason code → renderer. A code not here is rendered by :func:`generic`.
RENDERERS: dict[str, Renderer] = {
    "error_rate": _error_rate,
    "consecutive_failures": _consecutive,
    "latency_p95_ratio": _latency,
    "missing_fields": _missing,
    "quality": _quality,
    "quota": _quota,
    "slow_stream": _slow_stream,
    "cost": _cost,
    "no_data": _no_data,
    "over_capacity": _over_capacity,  # SPEC §4.2: a learned capacity cap (pipeline.policy.capacity)
}


def _declared(reason: str) -> tuple[str, ...]:
    """The metrics a registered signal declares for ``reason`` (empty for an unregistered code)."""
    try:
        from pipeline.signals.registry import signal

        return tuple(signal(reason).metrics)
    except Exception:  # an unregistered code (KeyError) or a registry that cannot load: no declared metrics
        return ()


def _shown(x: Any) -> bool:
    """A metric worth showing: a finite number or a non-empty text (None, NaN and infinities are not)."""
    if isinstance(x, str):
        return bool(x)
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def generic(reason: str, m: Metrics) -> str:
    """``reason`` in words with up to :data:`GENERIC_MAX` metrics that belong to it.

    Metrics belonging to it: those its signal declares, else those whose key starts with the code or with
    its first word (``credential_invalid`` → ``credential_*``). E.g. ``route panic (route_panic_share 0.6)``;
    ``credential invalid`` when no number belongs to it.
    """
    code = str(reason)
    stem = code.split("_")[0]
    keys = [k for k in _declared(code) if k in m] or [
        k for k in m if isinstance(k, str) and (k.startswith(code) or (len(stem) > 2 and k.startswith(stem + "_")))]
    shown = [f"{k} {number(m[k])}" for k in keys if _shown(m.get(k))][:GENERIC_MAX]
    words = code.replace("_", " ") or "?"
    return f"{words} ({', '.join(shown)})" if shown else words


def render_reason(reason: str, m: Metrics) -> str:
    """One reason in people's numbers (the table's renderer, :func:`generic` when none or its numbers miss)."""
    fn = RENDERERS.get(reason)
    if fn is not None:
        try:
            return fn(m)
        except (Missing, ArithmeticError, ValueError, TypeError):
            pass
    try:
        return generic(reason, m)
    except Exception:  # never: but an alert must go out whatever the metrics hold
        return str(reason)


def render_reasons(reasons: Sequence[str], m: Metrics) -> list[str]:
    """Every reason of a verdict rendered, in the verdict's order."""
    return [render_reason(r, m) for r in reasons]


def override_text(o: Mapping[str, Any]) -> str:
    """One line for a verdict's ``override`` object: ``forced open by ana (key k1) until 12:30:00 UTC: why``.

    ``o``: the verdict's ``override`` (kind, by, reason, expires_ts_ms UTC epoch ms, key_id, weight, route);
    missing fields read as ``?`` (a verdict from an older worker).
    """
    kind = o.get("kind")
    what = {"open": "forced open", "healthy": "forced healthy",
            "weight": f"weight forced to {o.get('weight')}", "freeze": f"route {o.get('route')} frozen"}.get(
        str(kind), f"override {kind}")
    key = f" (key {o['key_id']})" if o.get("key_id") else " (unsigned)"
    until = o.get("expires_ts_ms")
    when = (time.strftime(" until %H:%M:%S UTC", time.gmtime(until / 1000))
            if isinstance(until, (int, float)) and 0 <= until < 1e14 else "")
    return f"{what} by {o.get('by', '?')}{key}{when}: {o.get('reason', '?')}"


def next_probe_ms(v: Any) -> int | None:
    """An ``open`` verdict's ``next_probe_ts_ms`` (:class:`~pipeline.contracts.Verdict`; event time ms its
    cooldown ends, SPEC §4.1/§4.2), else None (another state, or a verdict without it or with a value that is
    not a plausible epoch ms). The board, the alerts and their tests read the published probe time here."""
    x = v.metrics.get("next_probe_ts_ms") if v.state == "open" else None
    return int(x) if isinstance(x, (int, float)) and not isinstance(x, bool) and 0 <= x < 1e14 else None


def next_step(state: str, since_ms: int | None, open_cooldown_ms: int, half_open_observe_ms: int,
              override: Mapping[str, Any] | None = None, next_probe_ts_ms: float | None = None) -> str:
    """What happens next to a channel in ``state``, in words (no trailing period).

    ``since_ms``: event time (UTC epoch ms) the state began, None when unknown (then only the policy's
    delay is given); ``open_cooldown_ms`` / ``half_open_observe_ms``: the policy's schedule
    (:class:`~pipeline.policy.defaults.PolicyConfig`; the state machine may lengthen the cooldown after
    repeated trips). A forced state (``override`` kind ``open``/``healthy``) ends at the override's expiry.
    ``next_probe_ts_ms``: an ``open`` verdict's published probe time (UTC epoch ms, SPEC §4.1/§4.2: the
    backed-off or Retry-After cooldown the worker chose); when given it is the time said, not the policy's.
    """
    def at(ts_ms: float) -> str:
        return time.strftime("%H:%M:%S UTC", time.gmtime(ts_ms / 1000)) if 0 <= ts_ms < 1e14 else "?"

    if override and override.get("kind") in ("open", "healthy"):
        exp = override.get("expires_ts_ms")
        return ("held by the override until " + at(float(exp)) if isinstance(exp, (int, float))
                else "held by the override until it is cleared") + "; then the detectors decide again"
    if state == "open" and next_probe_ts_ms is not None:
        cooldown = f" {duration((next_probe_ts_ms - since_ms) / 1000)} after the trip" if since_ms is not None else ""
        return f"next probe at {at(next_probe_ts_ms)} (half_open{cooldown}, as the worker published)"
    if state == "open":
        delay = duration(open_cooldown_ms / 1000)
        when = f" at about {at(since_ms + open_cooldown_ms)}" if since_ms is not None else ""
        return f"next probe{when} (half_open {delay} after the trip, longer after repeated trips)"
    if state == "half_open":
        delay = duration(half_open_observe_ms / 1000)
        when = f" at about {at(since_ms + half_open_observe_ms)}" if since_ms is not None else ""
        return f"probing: recovers{when} if the probes pass ({delay} observation), else opens again"
    if state == "degraded":
        return "weight lowered while the finding holds; back to healthy when it clears"
    if state == "recovering":
        return "weight ramping back up step by step"
    if state == "no_data":
        return "waiting for traffic"
    return "nothing: healthy"
