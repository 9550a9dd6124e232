"""Detector contract battery (every registered signal, from its declaration) and the specific SPEC §4 cases."""

from __future__ import annotations

import dataclasses
import warnings

import msgspec
import numpy as np
import pytest
from scipy.stats import binomtest, norm

from pipeline.contracts import RequestEvent
from pipeline.signals import ADVISORY_DETECTORS, HARD_DETECTORS, SIGNALS, SOFT_DETECTORS, ErrorRate, LatencyRatio, MissingFields, Signal
from pipeline.signals.base import ThresholdArrays
from pipeline.stats import exact_lower, safe_ratio, wilson_bounds, z_for
from pipeline.signals.consecutive_failures import ConsecutiveFailures
from pipeline.engine import Engine
from pipeline.ingest.structure import resolve_onto
from pipeline.policy.defaults import FREE_TIER, PAID_TIER, Thresholds, threshold_arrays
from pipeline.state.snapshot import decode_snapshot, export_channel, import_channel
from pipeline.windows.extension import WindowSpec
from pipeline.windows.view import WindowView

ALL = HARD_DETECTORS + SOFT_DETECTORS + ADVISORY_DETECTORS
IDS = [d.reason for d in ALL]
SIG_IDS = [s.name for s in SIGNALS]
#: Every feature a detector may read: the WindowView fields, the sums of the counters signals add and
#: the features of the signals' own windows (all of them in ``WindowView.extra``).
COUNTER_FIELDS = [f"{c.name}_{w}" for s in SIGNALS for c in s.counters for w in ("5m", "1m")] + [
    k for s in SIGNALS if s.windows is not None for k in s.windows(WindowSpec()).features(np.zeros(0, np.int64), 0, None)]
VIEW_FIELDS = [f.name for f in dataclasses.fields(WindowView) if f.name not in ("now_ms", "extra")] + COUNTER_FIELDS


def _replace(v: WindowView, fields: dict) -> WindowView:
    """``v`` with ``fields`` replaced (counter sums go to ``extra``)."""
    extra = {**v.extra, **{k: x for k, x in fields.items() if k in COUNTER_FIELDS}}
    return dataclasses.replace(v, extra=extra, **{k: x for k, x in fields.items() if k not in COUNTER_FIELDS})


def view(c: int = 1, **fields) -> WindowView:
    """A WindowView of C channels: zeros / NaN P95s unless given (scalars broadcast)."""
    base = {f: np.zeros(c) for f in VIEW_FIELDS}
    base["p95_ms"] = np.full(c, np.nan)
    base["base_p95_ms"] = np.full(c, np.nan)
    for k, v in fields.items():
        base[k] = np.broadcast_to(np.asarray(v, dtype=np.float64), (c,)).copy()
    return _replace(WindowView(now_ms=1_000_000, **{k: base[k] for k in VIEW_FIELDS if k not in COUNTER_FIELDS}),
                    {k: base[k] for k in COUNTER_FIELDS})


def th(c: int = 1, tier: Thresholds = PAID_TIER) -> ThresholdArrays:
    return threshold_arrays([tier] * c)


def busy_view(c: int) -> WindowView:
    """Plenty of clean traffic on every channel (nothing should fire)."""
    return view(c, judged_1m=600, judged_5m=3_000, ok_5m=3_000, checked_5m=3_000, p95_ms=200.0,
                n_latency_5m=3_000, base_p95_ms=200.0, base_n=50_000, base_hours=24)


def _check_shapes(f, c):
    assert f.fired.shape == (c,) and f.fired.dtype == bool
    assert f.metrics, "a finding carries its numbers"
    for k, v in f.metrics.items():
        assert isinstance(v, np.ndarray) and v.shape == (c,), k
        assert v.dtype == np.float64, k


# --- contract battery: every registered signal, from its own declaration --------------------

def _sig_view(c: int, fields: dict, base: WindowView | None = None, on: int | None = None) -> WindowView:
    """``fields`` on top of ``base`` (default: an empty view) for every channel, or only channel ``on``."""
    v = base if base is not None else view(c)
    return _replace(v, {k: np.where(np.arange(c) == on, val, getattr(v, k)) if on is not None
                                     else np.broadcast_to(np.asarray(val, np.float64), (c,)).copy()
                        for k, val in fields.items()})


def _check_declared(sig, f, c):
    _check_shapes(f, c)
    assert f.reason == sig.name and f.reason in sig.reasons
    assert tuple(f.metrics) == sig.metrics, "metrics are exactly the declared names, in order"


class _Recorder:
    """A WindowView stand-in that records the features a detector reads."""

    def __init__(self, v: WindowView):
        self._v, self.read = v, set()

    def __getattr__(self, name):
        self.read.add(name)
        return getattr(self._v, name)


def test_registry_lists_every_signal_once():
    assert [s.name for s in SIGNALS] == IDS
    assert all(isinstance(s, Signal) for s in SIGNALS)
    fields = {f.name for f in dataclasses.fields(Thresholds)}
    assert fields == {n for s in SIGNALS for n in s.param_names()} | {"half_open_max_error_rate"}
    assert PAID_TIER.signal("error_rate") == SIGNALS[1].params()
    assert FREE_TIER.signal("error_rate").error_rate_trip == 0.0035


@pytest.mark.parametrize("sig", SIGNALS, ids=SIG_IDS)
def test_signal_declaration_is_consistent(sig):
    params = sig.params()  # defaults are valid
    assert dataclasses.is_dataclass(params)
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(params, sig.param_names()[0], 1)
    for k in sig.features:
        assert hasattr(busy_view(1), k), f"{k} is not a WindowView feature"
    rec = _Recorder(busy_view(2))
    f = sig.detector.detect(rec, th(2), np.zeros(2, bool))
    _check_declared(sig, f, 2)
    assert rec.read <= set(sig.features), f"reads undeclared features {sorted(rec.read - set(sig.features))}"
    assert sig.rule and sig.default


@pytest.mark.parametrize("sig", SIGNALS, ids=SIG_IDS)
def test_signal_params_reject_bad_values_naming_the_key(sig):
    for name in sig.param_names():
        kind = sig.params.__dataclass_fields__[name].type
        bad = {"float": -1.0, "int": 0, "bool": 2}[kind if isinstance(kind, str) else kind.__name__]
        with pytest.raises(ValueError, match=name):
            sig.params(**{name: bad})


@pytest.mark.parametrize("sig", SIGNALS, ids=SIG_IDS)
@pytest.mark.parametrize("c", [0, 1, 5])
def test_empty_window_does_not_fire(sig, c):
    f = sig.detector.detect(view(c), th(c), np.zeros(c, bool))
    _check_declared(sig, f, c)
    assert not f.fired.any()


@pytest.mark.parametrize("sig", SIGNALS, ids=SIG_IDS)
def test_clean_busy_window_does_not_fire(sig):
    f = sig.detector.detect(busy_view(4), th(4), np.zeros(4, bool))
    _check_declared(sig, f, 4)
    assert not f.fired.any()


@pytest.mark.parametrize("sig", SIGNALS, ids=SIG_IDS)
def test_thin_data_does_not_fire(sig):
    assert sig.examples.thin, "every signal declares at least one thin-data case"
    for fields in sig.examples.thin:
        f = sig.detector.detect(_sig_view(3, fields), th(3), np.zeros(3, bool))
        _check_declared(sig, f, 3)
        assert not f.fired.any(), fields


@pytest.mark.parametrize("sig", SIGNALS, ids=SIG_IDS)
def test_all_failures(sig):
    """Every request of the window failed: hard signals fire, soft ones have nothing to judge."""
    c = 3
    v = _sig_view(c, dict(judged_1m=600, failures_1m=600, judged_5m=3_000, failures_5m=3_000, run=100,
                          base_p95_ms=200.0, base_n=50_000, base_hours=24))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        f = sig.detector.detect(v, th(c), np.zeros(c, bool))
    _check_declared(sig, f, c)
    assert f.fired.tolist() == [sig.examples.all_failures_fires] * c
    assert sig.examples.all_failures_fires == (sig.kind == "hard")


@pytest.mark.parametrize("sig", SIGNALS, ids=SIG_IDS)
def test_nan_inputs_do_not_fire_nor_raise(sig):
    c = 3
    all_nan = view(c, **{f: np.nan for f in VIEW_FIELDS})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        f = sig.detector.detect(all_nan, th(c), np.zeros(c, bool))
    _check_declared(sig, f, c)
    assert not f.fired.any()
    # NaN in one channel does not disturb the others, even with firing evidence on them
    mixed = _sig_view(c, sig.examples.firing, busy_view(c))
    mixed = _replace(mixed, {k: np.where(np.arange(c) == 1, np.nan, getattr(mixed, k)) for k in VIEW_FIELDS})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        f = sig.detector.detect(mixed, th(c), np.zeros(c, bool))
    assert f.fired.tolist() == [True, False, True]


@pytest.mark.parametrize("sig", SIGNALS, ids=SIG_IDS)
def test_fires_per_channel_only_where_evidence_is(sig):
    """Channel 1 of 3 has the signal's firing example; 0 and 2 are clean."""
    f = sig.detector.detect(_sig_view(3, sig.examples.firing, busy_view(3), on=1), th(3), np.zeros(3, bool))
    _check_declared(sig, f, 3)
    assert f.fired.tolist() == [False, True, False]


# --- the battery on a real engine: late events and a restart from snapshots ------------------

H = 3_600_000
T0 = 1_750_000_000_000 - 1_750_000_000_000 % H


#: Status mix of the healthy hours (0.1 % failures: under every tier's error line) and of the last 30 min.
HEALTHY_MIX, FAULT_MIX = [0.998, 0.001, 0.0005, 0.0005], [0.95, 0.02, 0.01, 0.02]


def _traffic(t_from: int, t_to: int, seed: int) -> list[RequestEvent]:
    """Two channels at ~2 req/s: healthy until the last 30 min, then a fault: failures on both, missing fields
    on "b", and a slow and 50 % dearer last 15 min on "b".

    The healthy hours come first, as in real traffic: the 24 h baselines learn from healthy time only (SPEC
    §4.2, issue #33 part 5), so a stream failing from its first minute (as this one did before) leaves them
    thin (channel "b", open or half_open throughout, had 51 baseline latency samples) and the latency and
    cost signals nothing to compare with."""
    rng = np.random.default_rng(seed)
    ts = np.sort(rng.integers(t_from, t_to, (t_to - t_from) // 250))
    tokens = np.random.default_rng(seed + 1).integers(20, 600, ts.shape[0])  # own stream: the rest is unchanged
    fault_ms = t_to - 30 * 60_000
    out = []
    for i, t in enumerate(ts.tolist()):
        ch = "a" if i % 2 else "b"
        st = str(rng.choice(["ok", "error", "timeout", "cancelled"], p=FAULT_MIX if t >= fault_ms else HEALTHY_MIX))
        slow = 3.0 if ch == "b" and t >= t_to - 15 * 60_000 else 1.0
        out.append(RequestEvent(event_id=f"t{seed}-{i}", ts_ms=t, channel=ch, route="chat", status=st,
                                latency_ms=float(rng.lognormal(5.3, 0.3)) * slow, tier="free" if ch == "b" else "paid",
                                missing_fields=(["x"] if i % 9 == 0 and t >= fault_ms else [])
                                if st == "ok" and i % 2 == 0 else None,
                                output_tokens=int(tokens[i]) if st == "ok" else None,
                                cost_usd=(1e-4 + 2e-6 * float(tokens[i])) * (1.5 if slow > 1 else 1.0)
                                if st == "ok" else None))
    return out


def _fed(events: list[RequestEvent]) -> Engine:
    resolve_onto(events)  # what ingest does: the engine reads the structure flags off the events
    eng = Engine()
    for k in range(0, len(events), 500):
        eng.process(events[k:k + 500], fields=eng.read_fields(events[k:k + 500]))
    ok = [e for e in events if e.status == "ok"][::3]
    rng = np.random.default_rng(3)
    eng.add_quality_scores([e.channel for e in ok], [e.ts_ms for e in ok],
                           np.clip(rng.normal(0.8, 0.1, len(ok)) - [0.3 * (e.channel == "b" and e.ts_ms > T0 + 2 * H)
                                                                     for e in ok], 0, 1).tolist(), "v1")
    return eng


@pytest.fixture(scope="module")
def warm():
    events = _traffic(T0, T0 + 2 * H + 30 * 60_000, 1)
    return events, _fed(events)


def _finding(eng: Engine, sig, now_ms: int):
    v = eng.store.view(now_ms)
    th_all = eng.thresholds()
    active = eng.active.get(sig.name, np.zeros(eng.store.n_channels, bool))
    return {k: v.feature(k) for k in sig.features}, sig.detector.detect(v, th_all, active)


def _same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_array_equal(np.asarray(a[k]), np.asarray(b[k]), err_msg=k)


@pytest.mark.parametrize("sig", SIGNALS, ids=SIG_IDS)
def test_late_events_change_nothing(sig, warm):
    events, _ = warm
    now = events[-1].ts_ms + 1
    eng = _fed(events)
    feats, f = _finding(eng, sig, now)
    late = [msgspec.structs.replace(e, event_id="late" + e.event_id, status="timeout", latency_ms=60_000.0,
                                ts_ms=e.ts_ms - 130_000) for e in events[-300:]]
    r = eng.process(late, low_watermark_ms=0, fields=eng.read_fields(late))
    assert len(r.late) == 300 and r.accepted == [] and eng.late_count == 300
    feats2, f2 = _finding(eng, sig, now)
    _same(feats, feats2)
    assert f2.fired.tolist() == f.fired.tolist()
    _same(f.metrics, f2.metrics)


@pytest.mark.parametrize("sig", SIGNALS, ids=SIG_IDS)
def test_restart_from_snapshots_restores_the_same_finding(sig, warm):
    events, eng = warm
    now = events[-1].ts_ms + 1
    fresh = Engine()
    for i in range(eng.store.n_channels):
        import_channel(fresh, decode_snapshot(export_channel(eng, i)))
    assert fresh.store.names == eng.store.names
    feats, f = _finding(eng, sig, now)
    feats2, f2 = _finding(fresh, sig, now)
    _same(feats, feats2)
    assert f2.fired.tolist() == f.fired.tolist()
    _same(f.metrics, f2.metrics)


def test_battery_engine_traffic_exercises_the_signals(warm):
    """The warm engine's state is not trivial: the restart test compares real numbers."""
    events, eng = warm
    v = eng.store.view(events[-1].ts_ms + 1)
    assert (v.judged_5m > 100).all() and (v.failures_5m > 0).all() and (v.checked_5m > 50).any()
    assert (v.base_hours == 2).all() and (v.quality_n_5m > 20).all() and (v.base_quality_n > 100).all()
    assert eng.store.names == ["b", "a"]
    fired = {s.name: _finding(eng, s, events[-1].ts_ms + 1)[1].fired.tolist() for s in SIGNALS}
    assert fired == {"consecutive_failures": [False, False], "error_rate": [True, True],
                     "latency_p95_ratio": [True, False], "missing_fields": [True, False], "quality": [True, False],
                     "slow_stream": [False, False], "quota": [False, False],
                     "cost": [True, False]}


def test_hard_and_soft_sets():
    assert [d.reason for d in HARD_DETECTORS] == ["consecutive_failures", "error_rate"]
    assert [d.reason for d in SOFT_DETECTORS] == ["latency_p95_ratio", "missing_fields", "quality", "slow_stream", "quota"]


# --- consecutive failures ----------------------------------------------------------

@pytest.mark.parametrize("run,fired", [(0, False), (4, False), (5, True), (100, True)])
def test_consecutive_threshold(run, fired):
    f = ConsecutiveFailures().detect(view(1, run=run), th(1), np.zeros(1, bool))
    assert f.fired.tolist() == [fired]
    assert f.metrics["consecutive_failures"].tolist() == [float(run)]
    assert ConsecutiveFailures.trips(np.array([run]), np.array([5.0])).tolist() == [fired]


# --- error rate ----------------------------------------------------------------------

def _err(judged, failures, tier=PAID_TIER, window="both"):
    kw = {}
    if window in ("1m", "both"):
        kw.update(judged_1m=judged, failures_1m=failures)
    if window in ("5m", "both"):
        kw.update(judged_5m=judged, failures_5m=failures)
    return ErrorRate().detect(view(1, **kw), th(1, tier), np.zeros(1, bool))


def test_one_failure_in_twenty_does_not_trip_paid():
    assert not _err(20, 1).fired[0]
    # not even with the sample minimums lowered: the exact lower bound (5e-8 at 1e-6) is under 0.5 %
    loose = dataclasses.replace(PAID_TIER, error_min_requests=1, error_min_failures=1)
    assert not _err(20, 1, loose).fired[0]
    assert _err(20, 1, loose).metrics["error_rate_lower_5m"][0] == pytest.approx(1 - (1 - 1e-6) ** (1 / 20))


@pytest.mark.parametrize("window", ["1m", "5m", "both"])
def test_thirty_in_six_hundred_trips(window):
    f = _err(600, 30, window=window)
    assert f.fired[0]
    if window != "1m":
        assert f.metrics["error_rate_5m"][0] == pytest.approx(0.05)
        assert f.metrics["requests_5m"][0] == 600


def test_metrics_values():
    f = _err(600, 30)
    assert f.metrics["error_rate_1m"][0] == pytest.approx(0.05)
    assert f.metrics["error_rate_trip"][0] == 0.005
    lo = exact_lower(np.array([30.0]), np.array([600.0]), ErrorRate().alpha)
    assert f.metrics["error_rate_lower_5m"][0] == pytest.approx(lo[0])
    assert ErrorRate().alpha == pytest.approx(1e-6)


def test_free_line_is_lower_than_paid():
    assert PAID_TIER.error_rate_trip == 0.005 and FREE_TIER.error_rate_trip == 0.0035
    n, k = 100_000, 550  # 0.55 %: exact lower bound (1e-6) between 0.35 % and 0.5 %
    ci = binomtest(k, n).proportion_ci(confidence_level=1 - 2e-6, method="exact")
    assert 0.0035 < ci.low < 0.005
    assert _err(n, k, FREE_TIER).fired[0]
    assert not _err(n, k, PAID_TIER).fired[0]
    # per-channel arrays: same counts, free and paid channels side by side
    both = ErrorRate().detect(view(2, judged_5m=n, failures_5m=k),
                              threshold_arrays([FREE_TIER, PAID_TIER]), np.zeros(2, bool))
    assert both.fired.tolist() == [True, False]


def test_cancelled_not_counted():
    """judged excludes neutral outcomes at the store; 30 failures in 30 judged trips regardless of cancels."""
    assert _err(30, 30).fired[0]
    assert not _err(30, 0).fired[0]


@pytest.mark.parametrize("conf", [0.95, 0.99, 0.9999])
def test_wilson_matches_scipy(conf):
    z = z_for(conf)
    assert z == pytest.approx(norm.ppf(conf))
    rng = np.random.default_rng(int(conf * 1e4))
    ns = np.r_[1, 2, 5, 20, 30, 600, rng.integers(1, 100_000, 60)].astype(float)
    ks = np.array([rng.integers(0, n + 1) for n in ns.astype(int)], dtype=float)
    ks[:4] = [0, 2, 5, 1]
    lo, hi = wilson_bounds(ks, ns, z)
    for k, n, l, h in zip(ks, ns, lo, hi):
        ci = binomtest(int(k), int(n)).proportion_ci(confidence_level=1 - 2 * (1 - conf), method="wilson")
        assert l == pytest.approx(ci.low, abs=1e-12, rel=1e-9)
        assert h == pytest.approx(ci.high, abs=1e-12, rel=1e-9)


def test_wilson_nan_for_empty_and_z_validation():
    lo, hi = wilson_bounds(np.array([0.0, 1.0]), np.array([0.0, 4.0]), 2.0)
    assert np.isnan(lo[0]) and np.isnan(hi[0]) and 0 < lo[1] < 0.25 < hi[1] < 1
    for bad in (0.5, 1.0, 0.2):
        with pytest.raises(ValueError):
            z_for(bad)
    assert safe_ratio(np.array([1.0, 1.0, 1.0]), np.array([0.0, np.nan, 4.0])).tolist()[2] == 0.25


# --- latency ratio ----------------------------------------------------------------------

def _lat(ratio, active, base=100.0, n=1_000, base_n=10_000, hours=24, lower=None, lower_30s=None, n_30s=0):
    """Latency finding; the 5 min lower bound ratio defaults to the point ratio."""
    v = view(1, p95_ms=ratio * base, n_latency_5m=n, base_p95_ms=base, base_n=base_n, base_hours=hours,
             p95_lower_ms=(ratio if lower is None else lower) * base,
             p95_lower_30s_ms=np.nan if lower_30s is None else lower_30s * base, n_latency_30s=n_30s)
    return LatencyRatio().detect(v, th(1), np.array([active]))


def test_latency_trips_on_the_lower_bound_not_the_point_estimate():
    """Issue #19: a thin window's P95 of 3x whose 99 % lower bound is 1.5x does not trip; either window's
    bound at 1.8x does (the last 30 s needs its own 50 samples); clearing stays on the point ratio."""
    assert not _lat(3.0, False, lower=1.5).fired[0]
    assert _lat(1.3, False, lower=1.0, lower_30s=1.8, n_30s=120).fired[0]
    assert not _lat(1.3, False, lower=1.0, lower_30s=3.0, n_30s=49).fired[0]
    f = _lat(1.3, True, lower=1.0)
    assert f.fired[0] and f.metrics["latency_p95_lower_ratio"][0] == pytest.approx(1.0)


def test_latency_hysteresis_sequence():
    active = False
    seq = []
    for r in (1.0, 1.79, 1.8, 1.5, 1.21, 1.2, 1.5, 1.79, 1.8):
        f = _lat(r, active)
        active = bool(f.fired[0])
        seq.append(active)
        assert f.metrics["latency_p95_ratio"][0] == pytest.approx(r)
    assert seq == [False, False, True, True, True, False, False, False, True]


def test_latency_thin_data_keeps_previous_finding():
    assert _lat(1.0, True, n=10).fired[0]  # no evidence: stays active
    assert not _lat(3.0, False, n=10).fired[0]
    assert not _lat(3.0, False, base_n=100).fired[0]
    assert not _lat(3.0, False, hours=0).fired[0]
    assert _lat(3.0, False, hours=1).fired[0]


def test_latency_metrics():
    f = _lat(2.0, False, base=150.0)
    assert f.metrics["p95_ms"][0] == 300.0 and f.metrics["baseline_p95_ms"][0] == 150.0
    assert f.metrics["latency_samples_5m"][0] == 1_000 and f.metrics["baseline_samples"][0] == 10_000


# --- missing fields ----------------------------------------------------------------------

def _miss(checked, missing, active):
    return MissingFields().detect(view(1, checked_5m=checked, missing_5m=missing), th(1), np.array([active]))


def test_missing_three_percent_of_1500_fires():
    f = _miss(1_500, 45, False)
    assert f.fired[0]
    assert f.metrics["missing_rate_5m"][0] == pytest.approx(0.03)
    assert f.metrics["checked_5m"][0] == 1_500


def test_missing_hysteresis():
    assert not _miss(1_500, 6, True).fired[0]  # 0.4 % <= 0.5 %: clears
    assert _miss(1_500, 12, True).fired[0]  # 0.8 %: stays
    assert not _miss(1_500, 12, False).fired[0]  # 0.8 % does not trip
    assert not _miss(1_500, 16, False).fired[0]  # 1.07 %: lower bound still under 1 %
    assert _miss(10, 0, True).fired[0]  # too few checked to clear


def test_missing_needs_min_checked():
    assert not _miss(49, 49, False).fired[0]
    assert _miss(50, 50, False).fired[0]
