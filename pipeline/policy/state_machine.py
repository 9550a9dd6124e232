"""Per-channel circuit-breaker state machine (SPEC §4 "States and weights").

States and weights::

    no_data ─events→ healthy ─soft→ degraded (weight −0.15/round, floor 0.5)
    any ─hard (error-rate trip or failure run)→ open (weight 0)
    open ─90 s cooldown→ half_open (weight 0.05, observe 90 s)
    half_open ─probe passes→ recovering (0.10, +0.10 / 120 s to 0.40, then
        +0.20 steps) ─weight 1.0→ healthy
    half_open ─failure run or probe fails→ open
    open ─its own traffic answers again while a route peer is over its cap→
        half_open before the cooldown ends (:meth:`ChannelMachine.readmit`, SPEC §4.2)
    open ─cooldown ends while its own traffic still fails→ open, the next
        backed-off cooldown: a failed probe without half_open
        (:meth:`ChannelMachine.probe_answered`, SPEC §4.2 probe on evidence)
    recovering ─weight 1.0 and window_ms since leaving open→ healthy

The probe passes when its error rate is below 0.3 % or consistent with the
channel's own pre-incident rate (:func:`pipeline.policy.probe.probe_passes`);
that rate is learned in ``healthy``/``degraded`` rounds (:meth:`learn`) and
frozen while the circuit is open, half-open or recovering. A channel in
``half_open`` or ``recovering`` is judged on the traffic since it left
``open`` (:attr:`ChannelMachine.judged_since_ms`).
    healthy/degraded ─no events for 5 min→ no_data

Backed-off cooldowns (SPEC §4.1, §4.2; :meth:`PolicyConfig.backoff
<pipeline.policy.defaults.PolicyConfig.backoff>`): every ``open`` has a
``cause`` (``""`` for the §4 detectors, else the error class that opened it:
``credential``, ``quota_exhausted``, ``rate_limited``) and a cooldown from that
cause's schedule; a re-open before the channel got back to ``healthy`` (from
``half_open`` or ``recovering``) is the next attempt of the series (90 s,
180 s, ... 15 min for the detectors; 5 min ... 30 min for a dead key or
exhausted quota), reset on reaching ``healthy``. A ``rate_limited`` open is
followed by a short half-open (``rate_limit_half_open_ms``) and a quicker ramp
(``rate_limit_ramp_interval_ms``).

All times are event time (ms). The machine is pure: :meth:`ChannelMachine.step`
takes what the detectors found and returns whether the published verdict
changed; it never reads a clock.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pipeline.stats import z_for
from pipeline.policy.defaults import PolicyConfig, Thresholds
from pipeline.policy.probe import baseline_upper, learn_baseline, probe_passes

HEALTHY, DEGRADED, OPEN, HALF_OPEN, RECOVERING, NO_DATA = (
    "healthy", "degraded", "open", "half_open", "recovering", "no_data")
#: States whose channels' events enter the 24 h baselines (SPEC §4.2; no_data: new or idle channels).
LEARNING_STATES = frozenset((HEALTHY, NO_DATA))

_EPS = 1e-9
#: Causes whose probe failures keep their cause (and schedule) when the channel re-opens.
_PROBED = ("credential", "quota_exhausted")
#: SPEC §4.1: the reason code an ``open`` caused by each error class carries (the route's panic floor,
#: SPEC §4.2, reads ``credential_invalid`` / ``quota_exhausted`` as hard faults: keep these codes).
CLASS_REASON: dict[str, str] = {"credential": "credential_invalid", "quota_exhausted": "quota_exhausted",
                                "rate_limited": "rate_limited"}


@dataclass
class ChannelMachine:
    """State of one channel's circuit breaker.

    ``weight`` in [0, 1]; ``entered_ms`` event time of the last state change;
    ``last_step_ms`` time of the last ramp step; ``penalty`` >= 0 decays with
    ``penalty_half_life_ms`` (SPEC §4 "penalties decay with a half-life").
    ``left_open_ms``: when the channel last went ``open`` → ``half_open``.
    ``base_requests`` / ``base_failures``: the decayed pre-incident baseline
    counts (judged requests, failures; :func:`~pipeline.policy.probe.learn_baseline`)
    as of ``base_ms`` (0: nothing learned yet).
    """

    state: str = NO_DATA
    weight: float = 1.0
    entered_ms: int = 0
    last_step_ms: int = 0
    penalty: float = 0.0
    penalty_ms: int = 0
    reasons: list[str] = field(default_factory=list)
    left_open_ms: int = 0
    base_requests: float = 0.0
    base_failures: float = 0.0
    base_ms: int = 0
    #: What opened the circuit: "" (the §4 detectors) or an error class (module docstring); kept through the
    #: probe and the ramp, cleared in ``healthy``.
    cause: str = ""
    #: This ``open``'s cooldown (ms; 0: ``cfg.open_cooldown_ms``, as in a snapshot from before backoff).
    cooldown_ms: int = 0
    #: Re-opens since the channel was last ``healthy`` (the attempt of the cause's backoff schedule).
    reopens: int = 0

    def next_probe_ms(self, cfg: PolicyConfig) -> int | None:
        """While ``open``: the event time (ms) its cooldown ends and the half-open probe starts; else None."""
        return self.entered_ms + (self.cooldown_ms or cfg.open_cooldown_ms) if self.state == OPEN else None

    def held_cause(self) -> str:
        """The cause a new trip keeps: ``credential`` / ``quota_exhausted`` stay until a full recovery (their
        probe schedule goes on); "" otherwise (a detector trip after a rate-limit cooldown is a breakage)."""
        return self.cause if self.cause in _PROBED else ""

    @property
    def judged_since_ms(self) -> int | None:
        """Start of the traffic the detectors judge: the time the channel left ``open`` while it is
        ``half_open`` or ``recovering`` (failures of the outage still inside a window do not count),
        else None (the full windows)."""
        return self.left_open_ms if self.state in (HALF_OPEN, RECOVERING) else None

    def learn(self, now_ms: int, requests: float, failures: float, cfg: PolicyConfig) -> None:
        """Add one round's judged ``requests`` and ``failures`` to the pre-incident baseline.

        Only in ``healthy``/``degraded`` (call it after :meth:`step`, so the
        round that opened the circuit is not learned); a no-op otherwise,
        which freezes the baseline through an incident. Time constant:
        ``cfg.baseline_window_ms`` (SPEC §4.3: 24 h).
        """
        if self.state not in (HEALTHY, DEGRADED):
            return
        self.base_requests, self.base_failures = learn_baseline(
            self.base_requests, self.base_failures, self.base_ms, now_ms, requests, failures,
            cfg.baseline_window_ms)
        self.base_ms = int(now_ms)

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

    def trip(self, now_ms: int, reasons: list[str], cfg: PolicyConfig | None = None, cause: str = "",
             cooldown_ms: int | None = None) -> bool:
        """Open the circuit now (hard signal). Returns True if the state changed.

        In ``open`` the cooldown keeps running from the first trip, except when an error class of
        the probe schedule (``credential``, ``quota_exhausted``) arrives while the circuit is open for
        another cause: then it opens anew with that cause (returns True: the reasons changed).
        ``cfg``: the schedules (None: the cooldown is ``cfg.open_cooldown_ms`` at the next step, as
        before backoff existed); ``cause``: "" or the error class; ``cooldown_ms``: this cooldown
        when the provider said it (``Retry-After``), else the cause's schedule at the attempt
        :attr:`reopens`.
        """
        hard = cause in ("credential", "quota_exhausted")
        if self.state == OPEN and not (hard and self.cause != cause):
            self.reasons = sorted(set(self.reasons) | set(reasons))
            return False
        if cause != self.cause:
            self.reopens = 0  # another schedule: its own series
        elif self.state in (OPEN, HALF_OPEN, RECOVERING):
            self.reopens += 1  # SPEC §4.2: a re-open after a failed probe backs off
        self.cause = cause
        if cause in CLASS_REASON and CLASS_REASON[cause] not in reasons:
            reasons = [CLASS_REASON[cause], *reasons]
        if cooldown_ms is not None:
            self.cooldown_ms = int(cooldown_ms)
        elif cfg is not None:
            self.cooldown_ms = cfg.backoff(cause).delay_ms(self.reopens, seed=now_ms)
        else:
            self.cooldown_ms = 0
        self._enter(OPEN, now_ms, 0.0)
        self.reasons = list(reasons)
        return True

    def readmit(self, now_ms: int, cfg: PolicyConfig) -> bool:
        """``open`` (cause "": the §4 detectors) -> ``half_open`` now, before the cooldown ends: its own traffic
        shows it serves again (SPEC §4.2 re-admission on evidence, :mod:`pipeline.policy.readmit`; the caller
        decides when). The probe then runs as after a cooldown. Returns True when the state changed."""
        if self.state != OPEN or self.cause:
            return False
        self._enter(HALF_OPEN, now_ms, cfg.half_open_weight)
        self.left_open_ms = int(now_ms)
        return True

    def probe_answered(self, now_ms: int, cfg: PolicyConfig) -> bool:
        """``open`` (cause "": the §4 detectors) whose cooldown ended at ``now_ms``, and whose own traffic
        already answers the probe's question "is it back?" with "no" (the caller decides when: SPEC §4.2
        probe on evidence, :mod:`pipeline.policy.readmit`): count it as a failed probe without going
        ``half_open``. It stays ``open`` (reason ``consecutive_failures``, the evidence), the re-open
        attempt :attr:`reopens` grows and the next cooldown is the backoff's next one from ``now_ms``, as
        after a failed probe. Returns True when it did (False: not open, another cause, or the cooldown
        still runs)."""
        due = self.next_probe_ms(cfg)
        if due is None or self.cause or now_ms < due:
            return False
        self.reopens += 1
        self.cooldown_ms = cfg.backoff("").delay_ms(self.reopens, seed=now_ms)
        self._enter(OPEN, now_ms, 0.0)
        self.reasons = ["consecutive_failures"]
        return True

    def step(self, now_ms: int, hard: list[str], soft: list[str], probe_requests: float,
             probe_failures: float, last_event_ms: int | None, cfg: PolicyConfig,
             th: Thresholds) -> bool:
        """One evaluation round at event time ``now_ms``.

        ``hard`` / ``soft``: reason codes that fired this round;
        ``probe_requests`` / ``probe_failures``: judged requests and failures
        since the channel left ``open`` (used in ``half_open``: the probe,
        judged by :func:`~pipeline.policy.probe.probe_passes` against
        ``th.half_open_max_error_rate`` and the frozen baseline);
        ``last_event_ms``: the channel's newest event time (None: never);
        ``th``: the channel's thresholds (``half_open_max_error_rate``).
        Returns True when the state changed (weights move every round anyway).
        """
        self.add_penalty(0.0, now_ms, cfg)
        before = self.state
        if hard:
            changed = self.trip(now_ms, hard, cfg, self.held_cause())
            return changed
        rate_limited = self.cause == "rate_limited"
        if self.state == OPEN:
            self.reasons = [r for r in self.reasons if r != "no_data"]
            if now_ms - self.entered_ms >= (self.cooldown_ms or cfg.open_cooldown_ms):
                self._enter(HALF_OPEN, now_ms, cfg.half_open_weight)
                self.left_open_ms = int(now_ms)
        elif self.state == HALF_OPEN:
            observe = cfg.rate_limit_half_open_ms if rate_limited else cfg.half_open_observe_ms
            if now_ms - self.entered_ms >= observe and probe_requests > 0:
                z = z_for(cfg.probe_confidence)
                upper = baseline_upper(self.base_requests, self.base_failures, z, th.baseline_min_requests)
                if probe_passes(probe_failures, probe_requests, th.half_open_max_error_rate, upper, z):
                    self._enter(RECOVERING, now_ms, cfg.ramp_small_step)
                    self.reasons = []
                else:
                    self.trip(now_ms, ["error_rate"], cfg, self.held_cause())
        elif self.state == RECOVERING:
            self.reasons = list(soft)
            interval = cfg.rate_limit_ramp_interval_ms if rate_limited else cfg.ramp_interval_ms
            if not soft and now_ms - self.last_step_ms >= interval and self.weight < 1.0 - _EPS:
                step = cfg.ramp_small_step if self.weight < cfg.ramp_small_until - _EPS else cfg.ramp_large_step
                self.weight = round(min(1.0, self.weight + step), 4)
                self.last_step_ms = now_ms
            # healthy once at full weight and the judged traffic covers a whole window (a quick rate-limit
            # ramp must not hand the full windows, still holding the 429s, to the detectors)
            if not soft and self.weight >= 1.0 - _EPS and now_ms - self.left_open_ms >= cfg.window_ms:
                self._enter(HEALTHY, now_ms, 1.0)
                self.penalty = 0.0  # the ramp already paid for the incident
                self.cause, self.reopens, self.cooldown_ms = "", 0, 0  # a full recovery resets the backoff
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
