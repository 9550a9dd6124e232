"""Stream stalls, quota drain and cost creep: the faults of SPEC §5.6, §5.7 and §4.8.

:func:`apply_usage_faults` is called by the generator (:mod:`.generator`) for
one channel's requests of a block, after their status and healthy timings are
drawn and before their finish times are fixed. It changes the arrays in place
of the requests it affects and returns :class:`UsageMarks`, which
:meth:`UsageMarks.annotate` writes into the event dicts (``quota_remaining``,
client cancels). Channels without these faults and without a quota draw no
random numbers here, so every other scenario's events are unchanged.

Timings come from the llmperf measurements through
:class:`~.channels.LatencyModel` (TTFT, inter-token gaps): a stall adds to
them, it does not replace them.

``stream_stall`` (SPEC §5.6 "streams stall ~8 s, clients cancel at 15 s"):
a stalled stream pauses ``stall_ms`` (lognormal, median 8 s); half of them
pause twice. A pause either delays the first token (``ttft_ms``) or is the
longest gap between chunks (``max_stream_gap_ms``). A stream still running
at ``client_timeout_ms`` (15 s) is cancelled by the client: status
``cancelled`` (HTTP 499, ``client_cancelled``), ``latency_ms`` = 15 000, the
gap seen up to the cancel, ``ttft_ms`` only if the first token came, and
the output tokens streamed until then. With ``impatient``, clients also
cancel a share of the streams that did not stall, mid-generation (the
control of SPEC §4.6: cancels that are not the upstream's fault). Upstream errors stay at the channel's
baseline (0 in the ``slow-failure`` scenario).

``quota_drain`` (SPEC §5.7): ``quota_remaining`` falls linearly to 0; the
last ``slow_below`` of the quota is served slower and with a rising share of
429s; then every request is refused with 429 ``quota_exhausted``.

``cost_creep`` (SPEC §4.8): ``cost_usd`` of successful requests x ``factor``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .channels import ChannelProfile
from .faults import Fault

#: A client's cancel of a stalled stream: nginx's "client closed request".
CANCEL_HTTP, CANCEL_ERROR_TYPE = 499, "client_cancelled"
#: The refusal of a drained quota.
QUOTA_HTTP, QUOTA_ERROR_TYPE = 429, "quota_exhausted"
#: Defaults of ``stream_stall`` (SPEC §5.6 seed: ~8 s stalls, clients time out at 15 s).
STALL_MS, STALL_SIGMA, STALL_REPEAT, STALL_BEFORE_FIRST, CLIENT_TIMEOUT_MS = 8_000.0, 0.2, 0.5, 0.25, 15_000.0
#: Defaults of ``quota_drain``.
QUOTA_SLOW_BELOW, QUOTA_SLOW_FACTOR, QUOTA_PRE_429 = 0.1, 2.5, 0.1


def quota_level(profile: ChannelProfile, faults: tuple[Fault, ...] | list[Fault], t_s: np.ndarray) -> np.ndarray | None:
    """Reported ``quota_remaining`` of ``profile`` at scenario times ``t_s`` (shape of ``t_s``), or None.

    None when the channel reports no quota. Outside ``quota_drain`` windows:
    ``quota_remaining - quota_drain_per_h * t / 3600``, from 1.0 again after a
    window's end (the daily reset); inside: linear from the level at
    ``start_s`` to 0 at ``start_s + drain_s``, then 0. Clipped to [0, 1].
    """
    if profile.quota_remaining is None:
        return None
    t = np.asarray(t_s, dtype=np.float64)
    per_s = profile.quota_drain_per_h / 3600.0
    level = profile.quota_remaining - per_s * t
    for f in faults:
        if f.kind != "quota_drain" or f.channel != profile.name:
            continue
        start = float(np.clip(profile.quota_remaining - per_s * f.start_s, 0.0, 1.0))
        drain_s = float(f.params["drain_s"])
        inside = start * (1.0 - np.clip((t - f.start_s) / drain_s, 0.0, 1.0))
        level = np.where(f.active(t), inside, level)
        level = np.where(t >= f.end_s, 1.0 - per_s * (t - f.end_s), level)
    return np.clip(level, 0.0, 1.0)


def cost_factor(channel: str, faults: tuple[Fault, ...] | list[Fault], t_s: np.ndarray) -> np.ndarray | None:
    """Multiplier on ``cost_usd`` of ``channel`` at ``t_s`` from its ``cost_creep`` faults; None without any."""
    mine = [f for f in faults if f.kind == "cost_creep" and f.channel == channel]
    if not mine:
        return None
    t = np.asarray(t_s, dtype=np.float64)
    out = np.ones(t.shape)
    for f in mine:
        grow = float(f.params["factor"]) - 1.0
        strength = f.strength(t) if "ramp_s" in f.params else f.active(t).astype(np.float64)
        out = out * (1.0 + grow * strength)
    return out


def _quota_pressure(f: Fault, level: np.ndarray, t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(low, wall)`` of a ``quota_drain`` fault: 0..1 how deep the level is under ``slow_below``
    (1 at empty; 0 outside the window), and whether the 429 wall stands."""
    on = f.active(t)
    below = float(f.params.get("slow_below", QUOTA_SLOW_BELOW))
    low = np.where(on, np.clip((below - level) / below, 0.0, 1.0), 0.0)
    return low, on & (t >= f.start_s + float(f.params["drain_s"]))


def quota_refusal_probability(profile: ChannelProfile, faults: tuple[Fault, ...] | list[Fault],
                              t_s: np.ndarray) -> np.ndarray:
    """Probability that a request of ``profile`` at ``t_s`` is refused for its quota (0..1, shape of ``t_s``).

    1 behind the 429 wall; ``low x pre_429_share`` while the level is under
    ``slow_below``; 0 without a quota. Used for the injected truth
    (:meth:`~.scenario.Scenario.injected_error_rate`).
    """
    t = np.asarray(t_s, dtype=np.float64)
    level = quota_level(profile, faults, t)
    out = np.zeros(t.shape)
    if level is None:
        return out
    for f in faults:
        if f.kind == "quota_drain" and f.channel == profile.name:
            low, wall = _quota_pressure(f, level, t)
            p = np.where(wall, 1.0, low * float(f.params.get("pre_429_share", QUOTA_PRE_429)))
            out = 1.0 - (1.0 - out) * (1.0 - p)
    return out


@dataclass
class UsageMarks:
    """What :func:`apply_usage_faults` leaves for the event dicts of one call (arrays shape (n,)).

    ``quota``: reported ``quota_remaining`` (None: not reported);
    ``cancelled``: client-cancelled streams (None: none possible);
    ``first_token``: whether a cancelled stream had its first token;
    ``streamed``: share of the output streamed before the cancel;
    ``prices``: the channel's (input, output) USD per million tokens.
    """

    quota: np.ndarray | None = None
    cancelled: np.ndarray | None = None
    first_token: np.ndarray | None = None
    streamed: np.ndarray | None = None
    prices: tuple[float, float] = (0.0, 0.0)

    def annotate(self, events: list[dict]) -> None:
        """Write the marks into ``events`` (the dicts of this call, in order)."""
        if self.quota is not None:
            for e, q in zip(events, np.round(self.quota, 4).tolist()):
                e["quota_remaining"] = q
        if self.cancelled is None or not self.cancelled.any():
            return
        p_in, p_out = self.prices
        for i in np.flatnonzero(self.cancelled).tolist():
            e = events[i]
            e["status"] = "cancelled"
            e["http_status"], e["error_type"] = CANCEL_HTTP, CANCEL_ERROR_TYPE
            e["output_tokens"] = int(round(e["output_tokens"] * float(self.streamed[i])))
            e["cost_usd"] = round((e["input_tokens"] * p_in + e["output_tokens"] * p_out) / 1e6, 8)
            if not self.first_token[i]:
                e.pop("ttft_ms", None)
            for key in ("response_text", "missing_fields"):  # a cancelled stream has no answer to check
                e.pop(key, None)


def _stall(f: Fault, t: np.ndarray, ok: np.ndarray, latency: np.ndarray, ttft: np.ndarray, gap: np.ndarray,
           rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Apply one ``stream_stall`` fault in place; returns ``(cancelled, first_token, streamed)``."""
    p = f.params
    n = t.shape[0]
    u_hit, u_rep, u_first, u_pos1, u_pos2 = rng.random((5, n))
    z1, z2 = rng.standard_normal((2, n))
    median, sigma = float(p.get("stall_ms", STALL_MS)), float(p.get("stall_sigma", STALL_SIGMA))
    timeout = float(p.get("client_timeout_ms", CLIENT_TIMEOUT_MS))
    hit = ok & (u_hit < float(p["to_rate"]) * f.strength(t))
    s1 = np.where(hit, median * np.exp(sigma * z1), 0.0)
    s2 = np.where(hit & (u_rep < float(p.get("repeat", STALL_REPEAT))), median * np.exp(sigma * z2), 0.0)
    first = hit & (u_first < float(p.get("before_first_token", STALL_BEFORE_FIRST)))
    gen = np.maximum(latency - ttft, 0.0)  # healthy generation time after the first token
    a1, a2 = np.minimum(u_pos1, u_pos2), np.maximum(u_pos1, u_pos2)
    start1 = np.where(first, ttft, ttft + a1 * gen)  # a first-token stall starts before the first chunk
    start2 = ttft + a2 * gen + s1
    total = latency + s1 + s2
    cancelled = hit & (total >= timeout)
    seen1 = np.clip(np.minimum(s1, timeout - start1), 0.0, None)
    seen2 = np.clip(np.minimum(s2, timeout - start2), 0.0, None)
    new_ttft = np.where(first, ttft + s1, ttft)
    first_token = new_ttft < timeout
    new_gap = np.maximum(gap, np.maximum(np.where(first, 0.0, seen1), seen2))
    # generation time done before the cancel: what is left of 15 s after the first token and the pauses seen
    done = timeout - new_ttft - np.where(first, 0.0, seen1) - seen2
    streamed = np.where(cancelled, np.clip(done / np.maximum(gen, 1e-9), 0.0, 1.0), 1.0)
    latency[hit] = np.minimum(total, timeout)[hit]
    ttft[hit] = np.minimum(new_ttft, timeout)[hit]
    gap[hit] = new_gap[hit]
    if "impatient" in p:  # drawn only when asked, so the stalling channels' streams stay as they were
        u_imp, u_at = rng.random((2, n))
        imp = ok & ~hit & (u_imp < float(p["impatient"]) * f.strength(t))
        latency[imp] = (ttft + u_at * gen)[imp]  # cancelled mid-generation; the gaps seen were healthy
        streamed = np.where(imp, u_at, streamed)
        cancelled = cancelled | imp
    return cancelled, first_token, streamed


def apply_usage_faults(profile: ChannelProfile, faults: tuple[Fault, ...], t: np.ndarray, status: np.ndarray,
                       latency: np.ndarray, ttft: np.ndarray, gap: np.ndarray, rng: np.random.Generator,
                       refuse: tuple[int, float, float]) -> tuple[np.ndarray, UsageMarks]:
    """Stall, quota and refusal effects on one channel's requests arriving at ``t`` (scenario s, shape (n,)).

    ``status``: generator status indices (0 = ok); ``latency`` / ``ttft`` /
    ``gap``: ms, float arrays changed in place; ``rng``: the channel's
    stream (used only when the channel has such faults); ``refuse``:
    ``(status index of rate_limited, min ms, max ms)`` for 429 refusals.
    Returns ``(refused, marks)``: ``refused`` bool (n,), the requests now
    refused with 429 ``quota_exhausted`` (the caller sets their status and
    detail), and the :class:`UsageMarks` for :meth:`UsageMarks.annotate`.
    """
    marks = UsageMarks(prices=(profile.price_in_usd_per_mtok, profile.price_out_usd_per_mtok))
    n = t.shape[0]
    refused = np.zeros(n, bool)
    level = quota_level(profile, faults, t)
    marks.quota = level
    drains = [f for f in faults if f.kind == "quota_drain"]
    if drains and level is not None:
        u_ref, u_lat = rng.random((2, n))
        for f in drains:
            low, wall = _quota_pressure(f, level, t)
            pre = u_ref < low * float(f.params.get("pre_429_share", QUOTA_PRE_429))
            refused |= wall | (pre & (status == 0))
            slow = 1.0 + (float(f.params.get("slow_factor", QUOTA_SLOW_FACTOR)) - 1.0) * low
            for arr in (latency, ttft, gap):
                arr *= np.where(status == 0, slow, 1.0)
        _, lo, hi = refuse
        latency[refused] = (lo + (hi - lo) * u_lat)[refused]
    stalls = [f for f in faults if f.kind == "stream_stall"]
    if stalls:
        ok = (status == 0) & ~refused
        marks.cancelled = np.zeros(n, bool)
        marks.first_token = np.ones(n, bool)
        marks.streamed = np.ones(n)
        for f in stalls:
            c, ft, st = _stall(f, t, ok & ~marks.cancelled, latency, ttft, gap, rng)
            marks.cancelled |= c
            marks.first_token &= ft | ~c
            marks.streamed = np.where(c, st, marks.streamed)
    return refused, marks
