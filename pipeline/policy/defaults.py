"""Every default number of the detection policy, with its SPEC section.

:class:`PolicyConfig` is frozen; :func:`load_policy` reads overrides per tier
and per channel from a TOML file (``[tier.free]``, ``[channel."name"]``
tables, each optionally split into one sub-table per signal, e.g.
``[tier.free.error_rate]``) and the SPEC §4.1 error-class patterns per provider
(``[error_classes.<provider>]``). Unknown keys and out-of-range values are
errors, never ignored. :data:`Thresholds` is generated from the signal
registry (:mod:`pipeline.signals.registry`).
"""

from __future__ import annotations

import dataclasses
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Sequence

from pipeline.ingest.error_class import Classifier, default_classifier
from pipeline.policy.backoff import Backoff
from pipeline.policy.route_wide import TABLE, RouteWideConfig
from pipeline.signals.base import ThresholdArrays
from pipeline.signals.registry import SIGNALS


def _thresholds_post_init(self: Any) -> None:
    if not 0.0 < self.half_open_max_error_rate < 1.0:
        raise ValueError(f"half_open_max_error_rate must be in (0, 1), got {self.half_open_max_error_rate}")
    # each signal's own class validates its fields (errors name the key)
    by_signal = {s.name: s.params(**{n: getattr(self, n) for n in s.param_names()}) for s in SIGNALS}
    object.__setattr__(self, "_by_signal", by_signal)


def _thresholds_signal(self: Any, name: str) -> Any:
    """The typed parameters of signal ``name`` (e.g. ``ErrorRateParams``); ``KeyError`` if not registered."""
    return self._by_signal[name]


def _threshold_fields() -> list[tuple[str, Any, Any]]:
    out = []
    for s in SIGNALS:
        for f in dataclasses.fields(s.params):
            out.append((f.name, f.type, field(default=f.default, metadata={"signal": s.name})))
    #: SPEC §4 half_open → recovering if the probe error rate stayed below this (a fraction in (0, 1)).
    out.append(("half_open_max_error_rate", float, field(default=0.003, metadata={"signal": None})))
    return out


#: Per-tier / per-channel detector thresholds: the fields of every registered signal's
#: ``params`` class (:mod:`pipeline.signals.registry`; their docs give unit, range and SPEC
#: source) plus ``half_open_max_error_rate`` (the state machine's). Frozen; validated on
#: construction by each signal's class (``ValueError`` naming the key). ``signal(name)``
#: returns one signal's typed parameters. Generated from the registry, so a new signal's
#: parameters need no edit here.
if TYPE_CHECKING:  # its fields are known at run time only: to mypy, any object
    Thresholds = Any
else:
    Thresholds = dataclasses.make_dataclass(
        "Thresholds", _threshold_fields(), frozen=True,
        namespace={"__post_init__": _thresholds_post_init, "signal": _thresholds_signal,
                   "__doc__": "Detector thresholds of one tier or channel: every registered signal's parameters "
                              "(see the module's ``Thresholds`` comment)."})
    Thresholds.__module__ = __name__  # pickling and reprs find it here

#: Field name → the signal that declares it (None: the state machine's ``half_open_max_error_rate``).
PARAM_SIGNAL: dict[str, str | None] = {f.name: f.metadata["signal"] for f in dataclasses.fields(Thresholds)}


def threshold_arrays(per_channel: Sequence[Any]) -> ThresholdArrays:
    """One :class:`Thresholds` per channel (C of them) as per-field float64 arrays (C,), every field
    named (also for C = 0), for the detectors' ``th`` argument."""
    return ThresholdArrays.build(per_channel, tuple(PARAM_SIGNAL))


def _tier_defaults(tier: str) -> Any:
    return Thresholds(**{k: v for s in SIGNALS for k, v in s.tier_defaults.get(tier, {}).items()})


#: SPEC §4.1: free channels have a lower baseline error rate, so their line is 0.35 %.
#: (``tier_defaults`` of the error-rate signal.)
FREE_TIER = _tier_defaults("free")
PAID_TIER = _tier_defaults("paid")


@dataclass(frozen=True)
class PolicyConfig:
    """Timing, statistics and weight-shaping numbers (SPEC §4).

    Times are event-time milliseconds.
    """

    tiers: Mapping[str, Thresholds] = field(default_factory=lambda: {"free": FREE_TIER, "paid": PAID_TIER})
    channels: Mapping[str, Thresholds] = field(default_factory=dict)
    #: Tier assumed for events that carry none.
    default_tier: str = "paid"
    #: One-sided confidence of the Wilson lower bound used by the rate tests
    #: (z = 3.72): at this level a healthy channel at 60 % of its trip line
    #: trips on fewer than 1 in 10,000 windows (SPEC §4.1: "1 failure in 20
    #: requests at 3 a.m. does not trip").
    rate_confidence: float = 0.9999
    #: SPEC §4: re-evaluate every active channel at least every 30 s of event time.
    eval_interval_ms: int = 30_000
    #: SPEC §4.1 short windows.
    short_window_ms: int = 60_000
    window_ms: int = 300_000
    #: SPEC §4.3 rolling baseline.
    baseline_window_ms: int = 24 * 3_600_000
    #: SPEC §4: open → half_open cooldown, and the half-open observation time.
    open_cooldown_ms: int = 90_000
    half_open_observe_ms: int = 90_000
    half_open_weight: float = 0.05
    #: SPEC §4: "any failure run sends it back to open": run length that
    #: re-opens a channel while it is probing in ``half_open``.
    half_open_failure_run: int = 2
    #: SPEC §4 recovering ramp: +0.10 every 120 s up to 0.40, then +0.20 steps.
    ramp_interval_ms: int = 120_000
    ramp_small_step: float = 0.10
    ramp_small_until: float = 0.40
    ramp_large_step: float = 0.20
    #: SPEC §4: a degraded channel's weight falls by at most this per round.
    max_weight_cut_per_round: float = 0.15
    #: Floor of a degraded channel's weight (soft signals never take all traffic).
    degraded_floor_weight: float = 0.5
    #: Weight regained per round once the soft signals cleared.
    degraded_recovery_step: float = 0.15
    #: SPEC §4 penalties: half-life of the penalty score, cost of one failure,
    #: cost of a tripping run; the healthy weight is 1 - min(penalty, max_penalty).
    penalty_half_life_ms: int = 300_000
    penalty_per_failure: float = 0.002
    penalty_per_run: float = 0.3
    max_penalty: float = 0.3
    #: SPEC §4 bounded shifts: a channel's share of its route grows by at most
    #: this factor per round (unless nothing else can take the traffic).
    max_share_growth: float = 1.5
    #: SPEC §4: no events for this long (event time) → ``no_data``.
    no_data_after_ms: int = 300_000
    #: SPEC §4: ``no_data`` is published on the transition, then again every this long
    #: (event time) while the channel stays idle and in memory; 0: only on the transition.
    no_data_heartbeat_ms: int = 600_000
    #: Events older than the watermark minus this are late: counted and dead-lettered.
    allowed_lateness_ms: int = 120_000
    #: SPEC §4 half_open → recovering "or below the channel's own pre-incident
    #: baseline rate (an upper confidence bound)": one-sided confidence of the
    #: probe's lower and the baseline's upper Wilson bound
    #: (:func:`pipeline.policy.probe.probe_passes` gives the error rates).
    probe_confidence: float = 0.99
    #: SPEC §4.2 panic floor (Envoy's ``healthy_panic_threshold``, default 50 %): when a route's
    #: channels' weights sum to less than this share of its normal weight (1 per channel), its least
    #: bad channels without a hard fault keep ``route_panic_weight`` (:func:`~pipeline.policy.routes.
    #: panic_floor`); 0 turns it off. In [0, 1]; per route in ``route_panic_thresholds``.
    route_panic_threshold: float = 0.5
    #: Weight a channel kept by the panic floor gets, in (0, 1]: the degraded floor, so a kept channel
    #: weighs as a degraded one beside the others.
    route_panic_weight: float = 0.5
    #: route -> its own panic threshold (``[route."name"] panic_threshold`` in policy.toml).
    route_panic_thresholds: Mapping[str, float] = field(default_factory=dict)
    #: SPEC §4.2 route-wide events and peer-relative latency (``[route_wide]`` in policy.toml; its fields,
    #: ranges and sources: :class:`~pipeline.policy.route_wide.RouteWideConfig`).
    route_wide: RouteWideConfig = RouteWideConfig()
    #: route -> its own route-wide numbers (``[route."name".route_wide]``, over ``[route_wide]``).
    route_wide_routes: Mapping[str, RouteWideConfig] = field(default_factory=dict)
    #: SPEC §4.2 / issue #33 part 3: each re-open after a failed probe lengthens the cooldown,
    #: ``open_cooldown_ms × 2^k`` up to this (ms; SPEC: "90 s doubling to 15 min"), reset after a full recovery.
    reopen_backoff_max_ms: int = 900_000
    #: Most a backed-off cooldown is lengthened by its deterministic jitter (a fraction in [0, 1]; issue #33
    #: "with jitter"; 0.1 as linkerd2-proxy's default backoff jitter ratio is of the same order).
    backoff_jitter: float = 0.1
    #: SPEC §4.2 re-admission on evidence (:mod:`pipeline.policy.readmit`): an ``open`` channel (§4 detectors)
    #: whose route has a peer over its ``max_share`` goes ``half_open`` at once when its own traffic shows this
    #: many successes in a row (Higress re-adds a key on 1 successful check; 10: a channel failing half its
    #: requests shows such a run at a given request with probability 1e-3); 0 turns it off.
    readmit_success_run: int = 10
    #: Suspicion (:mod:`pipeline.engine.suspects`): a run of this many failures moves a channel's route share
    #: to its peers (``route_share`` 0, state and weight kept) until a success sent after it; 0 turns it
    #: off. Higress ai-proxy removes a key after 3 consecutive failures (``failureThreshold``); below the
    #: tier's ``consecutive_failures`` to have an effect.
    suspect_run: int = 3
    #: A suspicion neither ended by a fresh success nor confirmed by a trip ends at the channel's first verdict
    #: (a round at the latest) this long after it began (ms, >= 1): routers that follow its share send it
    #: nothing meanwhile. Higress health-checks a removed key every 5 s; Envoy ejects for 30 s at first.
    suspect_max_ms: int = 10_000
    #: SPEC §4.2 probe on evidence (:meth:`~pipeline.policy.state_machine.ChannelMachine.probe_answered`): an
    #: ``open`` channel (§4 detectors) whose own traffic still fails when its cooldown ends (a run of its
    #: ``consecutive_failures`` threshold, failures in the last round, no 429 among them) counts a failed probe
    #: without going ``half_open`` (the probe's answer is known; its requests would only fail); false: it probes.
    probe_on_evidence: bool = True
    #: SPEC §4.1 ``credential`` / ``quota_exhausted``: at most one probe per this long (ms; default 5 min),
    #: doubling up to ``hard_fault_probe_max_ms`` (default 30 min; issue #32).
    hard_fault_probe_ms: int = 300_000
    hard_fault_probe_max_ms: int = 1_800_000
    #: SPEC §4.1 ``rate_limited``: the cooldown when the 429 carries no ``retry_after_s`` (ms; default 30 s,
    #: Helicone's and LiteLLM's default cooldown), and the longest cooldown, whatever the provider says (5 min).
    rate_limit_cooldown_ms: int = 30_000
    rate_limit_max_ms: int = 300_000
    #: A 429 without ``retry_after_s`` starts the cooldown only as the ``rate_limit_trip_events``-th
    #: ``rate_limited``-class failure within ``rate_limit_trip_window_ms`` (3 in 10 s), so the odd 429 of a
    #: healthy pool (0.1 % of requests, ``pipeline.tools.simulate.channels``) does not take a channel out.
    rate_limit_trip_events: int = 3
    rate_limit_trip_window_ms: int = 10_000
    #: SPEC §4.1 "a short half-open" after a rate-limit cooldown, and the recovering ramp's step interval
    #: after it ("back to full weight within minutes": 0.10 → 1.00 in 5 steps of 30 s).
    rate_limit_half_open_ms: int = 20_000
    rate_limit_ramp_interval_ms: int = 30_000
    #: SPEC §4.1 ``caller``: advisory reason ``caller_errors`` while the channel saw at least this many
    #: caller-class failures in the last ``window_ms`` (5 min); never a trip.
    caller_errors_min: int = 5
    #: SPEC §4.1 error-class patterns per provider (``[error_classes.<provider>]`` in policy.toml):
    #: provider → class → case-insensitive regexes, tried before the built-in phrases
    #: (:meth:`pipeline.ingest.error_class.Classifier.from_table`); empty: the built-in phrases only.
    error_patterns: Mapping[str, Mapping[str, Sequence[str]]] = field(default_factory=dict)
    #: The classifier of ``error_patterns`` (built here, so every path holding this policy, worker
    #: decoder, replay, backtest, scorecard, classifies alike); not an argument.
    classifier: Classifier = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # ErrorTableError (a ValueError) names the key, e.g. error_classes.openai.credential[0]
        object.__setattr__(self, "classifier", Classifier.from_table(self.error_patterns) if self.error_patterns
                           else default_classifier())
        if not 0.5 < self.probe_confidence < 1.0:
            raise ValueError(f"probe_confidence must be in (0.5, 1), got {self.probe_confidence}")
        for where, v in [("route_panic_threshold", self.route_panic_threshold),
                         *((f'[route."{r}"] panic_threshold', t) for r, t in self.route_panic_thresholds.items())]:
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0.0 <= v <= 1.0:
                raise ValueError(f"{where} must be a number in [0, 1], got {v!r}")
        w = self.route_panic_weight
        if isinstance(w, bool) or not isinstance(w, (int, float)) or not 0.0 < w <= 1.0:
            raise ValueError(f"route_panic_weight must be a number in (0, 1], got {w!r}")
        for name in ("reopen_backoff_max_ms", "hard_fault_probe_ms", "hard_fault_probe_max_ms",
                     "rate_limit_cooldown_ms", "rate_limit_max_ms", "rate_limit_trip_events",
                     "rate_limit_trip_window_ms", "rate_limit_half_open_ms", "rate_limit_ramp_interval_ms",
                     "caller_errors_min", "suspect_max_ms"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {v!r}")
        for name in ("readmit_success_run", "suspect_run"):
            k = getattr(self, name)
            if isinstance(k, bool) or not isinstance(k, int) or k < 0:
                raise ValueError(f"{name} must be an integer >= 0, got {k!r}")
        if not isinstance(self.probe_on_evidence, bool):
            raise ValueError(f"probe_on_evidence must be true or false, got {self.probe_on_evidence!r}")
        if not 0.0 <= self.backoff_jitter <= 1.0:
            raise ValueError(f"backoff_jitter must be in [0, 1], got {self.backoff_jitter}")

    def panic_threshold(self, route: str) -> float:
        """The panic threshold of ``route`` (its own, else :attr:`route_panic_threshold`), in [0, 1]."""
        return float(self.route_panic_thresholds.get(route, self.route_panic_threshold))

    def route_wide_for(self, route: str) -> RouteWideConfig:
        """The route-wide numbers of ``route`` (its own table, else :attr:`route_wide`)."""
        return self.route_wide_routes.get(route, self.route_wide)

    def backoff(self, cause: str) -> Backoff:
        """The cooldown schedule of an ``open`` caused by ``cause`` (:mod:`pipeline.policy.backoff`):
        ``credential`` / ``quota_exhausted`` the probe schedule, ``rate_limited`` the 429 schedule, anything
        else (``""``: the §4 detectors) the re-open schedule starting at ``open_cooldown_ms``."""
        if cause in ("credential", "quota_exhausted"):
            return Backoff(self.hard_fault_probe_ms, self.hard_fault_probe_max_ms, 2.0, self.backoff_jitter)
        if cause == "rate_limited":
            return Backoff(self.rate_limit_cooldown_ms, self.rate_limit_max_ms, 2.0, self.backoff_jitter)
        return Backoff(self.open_cooldown_ms, max(self.open_cooldown_ms, self.reopen_backoff_max_ms), 2.0,
                       self.backoff_jitter)

    def thresholds(self, channel: str, tier: str | None) -> Thresholds:
        """Thresholds for a channel: the channel override, else its tier's."""
        if channel in self.channels:
            return self.channels[channel]
        return self.tiers.get(tier or self.default_tier, self.tiers[self.default_tier])


def _thresholds_from(base: Any, table: Mapping[str, Any], where: str) -> Any:
    """``base`` with the overrides of one ``[tier.X]`` / ``[channel."x"]`` table: flat keys and/or one
    sub-table per signal (``[tier.X.<signal>]``, only that signal's keys). Raises ``ValueError`` naming
    the table and key (unknown key or signal, a key given twice, a bad value)."""
    known = set(PARAM_SIGNAL)
    names = {s.name: s for s in SIGNALS}
    flat: dict[str, Any] = {}
    items: Iterable[tuple[str, Any]]
    for key, value in table.items():
        if isinstance(value, Mapping):
            if key not in names:
                raise ValueError(f"{where}: unknown signal table [{key}]; signals: {sorted(names)}")
            own = set(names[key].param_names())
            unknown = set(value) - own
            if unknown:
                raise ValueError(f"{where}.{key}: unknown keys {sorted(unknown)}; valid keys: {sorted(own)}")
            items = value.items()
        elif key not in known:
            raise ValueError(f"{where}: unknown keys {[key]}; valid keys: {sorted(known)}")
        else:
            items = [(key, value)]
        for k, v in items:
            if k in flat:
                raise ValueError(f"{where}: {k} is given twice")
            flat[k] = v
    try:
        return dataclasses.replace(base, **flat)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{where}: {exc}") from None


#: The top-level tables of a policy file (:func:`load_policy`); any other is refused.
TABLES: tuple[str, ...] = ("policy", "tier", "channel", "route", TABLE, "error_classes")


def load_policy(path: str | Path | None = None) -> PolicyConfig:
    """Load :class:`PolicyConfig` with overrides from a TOML file.

    File layout::

        [policy]                 # PolicyConfig fields (numbers)
        eval_interval_ms = 30000
        [tier.free]              # Thresholds fields, flat ...
        error_rate_trip = 0.0035
        [tier.free.latency_p95_ratio]   # ... or under their signal's name
        latency_ratio_trip = 2.0
        [channel."lepton/llama-70b@free"]
        consecutive_failures = 3
        [route."chat-70b"]       # SPEC §4.2 route protection
        panic_threshold = 0.3    # in [0, 1]; 0: no panic floor on this route
        [route_wide]             # SPEC §4.2 route-wide / peer_latency numbers (RouteWideConfig)
        peer_trip_ratio = 3.0
        [route."chat-8b".route_wide]   # ... per route, over [route_wide]
        peer_trip_ratio = 4.0
        [error_classes.openai]   # SPEC §4.1 patterns of one provider (provider_of the channel)
        credential = ["key (is )?deactivated"]   # class → regexes, before the built-in phrases

    An ``[error_classes.<provider>]`` key other than the five classes, a pattern that is
    not a non-empty string or does not compile (or nests quantifiers) raises
    :class:`~pipeline.ingest.error_class.ErrorTableError` (a ``ValueError``) naming
    ``error_classes.<provider>.<class>[i]``. A bad ``[route_wide]`` key or value raises ``ValueError`` naming
    ``route_wide.<key>`` (per route ``route."name".route_wide.<key>``) and its rule. A cooldown above 120 s needs ``allow_long_cooldown = true`` in ``[policy]``;
    the policy rules (:mod:`pipeline.policy.rules`) are checked last.

    Raises ``ValueError`` (unknown table or key, bad value, a broken rule:
    :class:`~pipeline.policy.rules.PolicyRuleError`) or ``OSError``.
    """
    from pipeline.policy.rules import check_policy

    base = PolicyConfig()
    if path is None:
        return base
    data = tomllib.loads(Path(path).read_text())
    unknown_t = set(data) - set(TABLES)
    if unknown_t:  # a misspelt table ([route-wide]) would otherwise be dropped without a word
        raise ValueError(f"unknown tables {sorted(unknown_t)}; valid tables: {list(TABLES)}")
    tiers = dict(base.tiers)
    for tier, table in data.get("tier", {}).items():
        tiers[tier] = _thresholds_from(tiers.get(tier, PAID_TIER), table, f"[tier.{tier}]")
    channels = {}
    for name, table in data.get("channel", {}).items():
        tier = table.pop("tier", None)
        channels[name] = _thresholds_from(tiers.get(tier or base.default_tier, PAID_TIER), table, f'[channel."{name}"]')
    top = dict(data.get("policy", {}))
    allow_long = top.pop("allow_long_cooldown", False)
    if not isinstance(allow_long, bool):
        raise ValueError(f"[policy]: allow_long_cooldown must be true or false, got {allow_long!r}")
    panic: dict[str, float] = {}
    wide = base.route_wide.with_table(data.get(TABLE, {}), TABLE)
    wide_routes: dict[str, RouteWideConfig] = {}
    for route, table in data.get("route", {}).items():
        if not isinstance(table, Mapping):
            raise ValueError(f'[route."{route}"] must be a table, got {table!r}')
        unknown_r = set(table) - {"panic_threshold", TABLE}
        if unknown_r:
            raise ValueError(f'[route."{route}"]: unknown keys {sorted(unknown_r)}; valid keys: '
                             f'["panic_threshold", "{TABLE}"]')
        if "panic_threshold" in table:
            panic[route] = table["panic_threshold"]
        if TABLE in table:
            wide_routes[route] = wide.with_table(table[TABLE], f'route."{route}".{TABLE}')
    if panic:
        top["route_panic_thresholds"] = panic
    known = {f.name for f in dataclasses.fields(PolicyConfig) if f.init} - {"tiers", "channels", "error_patterns",
                                                                          "route_wide", "route_wide_routes"}
    unknown = set(top) - known
    if unknown:
        raise ValueError(f"[policy]: unknown keys {sorted(unknown)}")
    # [error_classes.<provider>]: validated by PolicyConfig (Classifier.from_table names the key)
    patterns = data.get("error_classes", {})
    out = dataclasses.replace(base, tiers=tiers, channels=channels, error_patterns=patterns, route_wide=wide,
                              route_wide_routes=wide_routes, **top)
    check_policy(out, allow_long_cooldown=allow_long)
    return out
