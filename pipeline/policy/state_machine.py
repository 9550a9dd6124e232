"""Per-channel circuit-breaker state machine (SPEC §4 "States and weights").

States and weights::

    no_data ─events→ healthy ─soft→ degraded (weight −0.15/round, floor 0.5)
    any ─hard (error-rate trip or failure run)→ open (weight 0)
    open ─90 s cooldown→ half_open (weight 0.05, observe 90 s)
    half_open ─probe error rate < 0.3 %→ recovering (0.10, +0.10 / 120 s to
        0.40, then +0.20 steps) ─weight 1.0→ healthy
    half_open ─failure run or error rate ≥ 0.3 %→ open
    healthy/degraded ─no events for 5 min→ no_data

All times are event time (ms). The machine is pure: :meth:`ChannelMachine.step`
takes what the detectors found and returns whether the published verdict
changed; it never reads a clock.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pipeline.policy.defaults import PolicyConfig, Thresholds

HEALTHY, DEGRADED, OPEN, HALF_OPEN, RECOVERING, NO_DATA = (
    "healthy", "degraded", "open", "half_open", "recovering", "no_data")

_EPS = 1e-9


@dataclass
class ChannelMachine:
    """State of one channel's circuit breaker.

    ``weight`` in [0, 1]; ``entered_ms`` event time of the last state change;
    ``last_step_ms`` time of the last ramp step; ``penalty`` >= 0 decays with
    ``penalty_half_life_ms`` (SPEC §4 "penalties decay with a half-life").
    """

    state: str = NO_DATA
    weight: float = 1.0
    entered_ms: int = 0
    last_step_ms: int = 0
    penalty: float = 0.0
    penalty_ms: int = 0
    reasons: list[str] = field(default_factory=list)

    def _enter(self, state: str, now_ms: int, weight: float) -> None:
        self.state = state
        self.entered_ms = now_ms
        self.last_step_ms = now_ms
        self.weight = round(float(weight), 4)

    def add_penalty(self, amount: float, now_ms: int, cfg: PolicyConfig) -> None:
        """Decay the penalty to ``now_ms`` and add ``amount`` (>= 0), capped at ``max_penalty``."""
        if now_ms > self.penalty_ms:
            self.penalty *= 0.5 ** ((now_ms - self.penalty_ms) / cfg.penalty_half_life_ms)
            self.penalty_ms = int(now_ms)
        self.penalty = float(min(self.penalty + float(amount), cfg.max_penalty))

    def trip(self, now_ms: int, reasons: list[str]) -> bool:
        """Open the circuit now (hard signal). Returns True if the state changed.

        In ``open`` the cooldown keeps running from the first trip.
        """
        if self.state == OPEN:
            self.reasons = sorted(set(self.reasons) | set(reasons))
            return False
        self._enter(OPEN, now_ms, 0.0)
        self.reasons = list(reasons)
        return True

    def step(self, now_ms: int, hard: list[str], soft: list[str], probe_requests: float,
             probe_failures: float, last_event_ms: int | None, cfg: PolicyConfig,
             th: Thresholds) -> bool:
        """One evaluation round at event time ``now_ms``.

        ``hard`` / ``soft``: reason codes that fired this round;
        ``probe_requests`` / ``probe_failures``: judged requests and failures
        since the state was entered (used in ``half_open``);
        ``last_event_ms``: the channel's newest event time (None: never);
        ``th``: the channel's thresholds (``half_open_max_error_rate``).
        Returns True when the state changed (weights move every round anyway).
        """
        self.add_penalty(0.0, now_ms, cfg)
        before = self.state
        if hard:
            changed = self.trip(now_ms, hard)
            return changed
        if self.state == OPEN:
            self.reasons = [r for r in self.reasons if r != "no_data"]
            if now_ms - self.entered_ms >= cfg.open_cooldown_ms:
                self._enter(HALF_OPEN, now_ms, cfg.half_open_weight)
        elif self.state == HALF_OPEN:
            if now_ms - self.entered_ms >= cfg.half_open_observe_ms and probe_requests > 0:
                rate = probe_failures / probe_requests
                if rate < th.half_open_max_error_rate:
                    self._enter(RECOVERING, now_ms, cfg.ramp_small_step)
                    self.reasons = []
                else:
                    self._enter(OPEN, now_ms, 0.0)
                    self.reasons = ["error_rate"]
        elif self.state == RECOVERING:
            self.reasons = list(soft)
            if not soft and now_ms - self.last_step_ms >= cfg.ramp_interval_ms:
                step = cfg.ramp_small_step if self.weight < cfg.ramp_small_until - _EPS else cfg.ramp_large_step
                self.weight = round(min(1.0, self.weight + step), 4)
                self.last_step_ms = now_ms
                if self.weight >= 1.0 - _EPS:
                    self._enter(HEALTHY, now_ms, 1.0)
                    self.penalty = 0.0  # the ramp already paid for the incident
        else:  # healthy, degraded, no_data
            idle = last_event_ms is None or now_ms - last_event_ms >= cfg.no_data_after_ms
            if idle:
                if self.state != NO_DATA:
                    self._enter(NO_DATA, now_ms, self.weight)
                self.reasons = ["no_data"]
            elif soft:
                if self.state != DEGRADED:
                    self._enter(DEGRADED, now_ms, self.weight)
                self.weight = round(max(cfg.degraded_floor_weight,
                                        self.weight - cfg.max_weight_cut_per_round), 4)
                self.reasons = list(soft)
            else:
                full = 1.0 - min(self.penalty, cfg.max_penalty)
                if self.state == DEGRADED:
                    self.weight = round(min(full, self.weight + cfg.degraded_recovery_step), 4)
                    if self.weight >= full - _EPS:
                        self._enter(HEALTHY, now_ms, full)
                else:
                    if self.state == NO_DATA:
                        self._enter(HEALTHY, now_ms, full)
                    self.weight = round(full, 2)
                self.reasons = [] if self.state == HEALTHY else self.reasons
        return self.state != before
