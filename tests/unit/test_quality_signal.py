"""SPEC §4.5 quality signal without the model: windows, the Welch test, the engine hook,
snapshots, the sampler and the caches (fake scores, no torch)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import jsonschema
import msgspec
import numpy as np
import pytest
from scipy.stats import t as student_t
from scipy.stats import ttest_ind, ttest_ind_from_stats

from pipeline.contracts import RequestEvent
from pipeline.signals import QualityDrop
from pipeline.signals.quality import QualityScoreWindows
from pipeline.engine import Engine
from pipeline.engine.replay import replay
from pipeline.policy.defaults import PAID_TIER, Thresholds, threshold_arrays
from pipeline.quality.cache import CachedScorer, CachingEmbedder, pair_key
from pipeline.quality.sampler import QualitySampler, SamplerConfig, safe_text
from pipeline.state.snapshot import ChannelSnapshot, decode_snapshot, export_channel, import_channel
from pipeline.windows.quality import QualityWindows, moments
from pipeline.windows.store import WindowStore

T0 = 1_780_002_000_000 - 1_780_002_000_000 % 3_600_000  # a whole hour
SCHEMA = json.loads((Path(__file__).parents[2] / "schemas" / "quality_score.v1.json").read_text())


# --- windows ---------------------------------------------------------------------------------

def test_moments_match_numpy():
    rng = np.random.default_rng(1)
    x = rng.random(57)
    n, m, v = moments(np.array([[len(x), x.sum(), (x * x).sum()], [1, 0.5, 0.25], [0, 0, 0]]))
    assert n.tolist() == [57, 1, 0]
    assert m[0] == pytest.approx(x.mean()) and v[0] == pytest.approx(x.var(ddof=1))
    assert m[1] == 0.5 and np.isnan(v[1]) and np.isnan(m[2]) and np.isnan(v[2])


def test_quality_windows_short_and_baseline():
    q = QualityWindows()
    q.ensure_capacity(2)
    rng = np.random.default_rng(2)
    base = rng.random(300) * 0.2 + 0.7  # hour 0
    ts = T0 + np.sort(rng.integers(0, 3_600_000, 300))
    q.add(np.zeros(300, int), ts, base, "v1")
    now = T0 + 3_600_000 + 900_000  # 15 min into hour 1
    recent = np.full(12, 0.3)
    q.add(np.zeros(12, int), now - 100_000 + np.arange(12) * 5_000, recent, "v1")
    hi = -(-now // 10_000)
    n, m, v = moments(q.window(np.array([0, 1]), np.array([hi - 30, hi - 30]), hi))
    assert n.tolist() == [12, 0] and m[0] == pytest.approx(0.3)
    sums, hours = q.baseline(np.array([0, 1]), now, 24)
    bn, bm, bv = moments(sums)
    assert bn[0] == 300 and bm[0] == pytest.approx(base.mean(), rel=1e-5)
    assert bv[0] == pytest.approx(base.var(ddof=1), rel=1e-3)
    assert hours.tolist() == [1.0, 0.0]
    # the current hour is not in the baseline; the next hour's baseline holds both hours
    sums2, hours2 = q.baseline(np.array([0]), now + 3_600_000, 24)
    assert sums2[0, 0] == 312 and hours2[0] == 2


def test_quality_windows_version_change_resets_channel_only():
    q = QualityWindows()
    q.ensure_capacity(2)
    q.add(np.array([0, 1]), np.array([T0, T0]), np.array([0.9, 0.9]), "v1")
    _, reset = q.add(np.array([0]), np.array([T0 + 1000]), np.array([0.1]), "v2")
    assert reset == [0]
    sums, _ = q.baseline(np.array([0, 1]), T0 + 3_600_000, 24)
    assert sums[:, 0].tolist() == [1.0, 1.0] and sums[0, 1] == pytest.approx(0.1)
    assert q.version == ["v2", "v1"]


def test_window_follows_the_newest_scored_slot_when_scoring_lags():
    q = QualityWindows()
    q.ensure_capacity(3)
    hour1 = T0 + 3_600_000
    ts = hour1 + np.arange(0, 600_000, 2_000)  # 10 min of scores from hour 1 on, one per 2 s
    q.add(np.zeros(len(ts), int), ts, np.where(ts >= hour1 + 300_000, 0.2, 0.9), "v1")  # the last 5 min bad
    q.add(np.ones(len(ts), int), ts, np.full(len(ts), 0.9), "v1")
    q.add(np.full(5, 2), T0 + np.arange(5) * 1_000, np.full(5, 0.9), "v1")  # channel 2: only old scores
    rows = np.array([0, 1, 2])
    live = q.aggregates(rows, hour1 + 600_000)
    assert live["quality_n_5m"].tolist() == [150, 150, 0]
    assert live["quality_mean_5m"][0] == pytest.approx(0.2) and live["quality_lag_ms"][0] == 0
    lagging = q.aggregates(rows, hour1 + 780_000)  # 3 min later, nothing new scored yet
    assert lagging["quality_n_5m"].tolist() == [150, 150, 0]  # same 5 scored minutes, not a thinned window
    assert lagging["quality_mean_5m"][0] == pytest.approx(0.2)
    assert lagging["quality_lag_ms"].tolist()[:2] == [180_000, 180_000]
    # the baseline ends before the window's hour (hour 1; hour 0 held no scores of channels 0 and 1)
    assert lagging["base_quality_hours"].tolist() == [0, 0, 0]
    stale = q.aggregates(rows, hour1 + 600_000 + 600_001 + 10_000)
    assert stale["quality_n_5m"].tolist() == [0, 0, 0]
    since = q.aggregates(rows, hour1 + 600_000, since_ms=np.full(3, hour1 + 540_000))
    assert since["quality_n_5m"].tolist() == [30, 30, 0]
    q.ensure_capacity(4)
    assert np.isnan(q.aggregates(np.array([3]), T0)["quality_lag_ms"][0])  # no scores at all


def test_store_state_roundtrip_and_old_state_without_quality():
    st = WindowStore(windows=(QualityScoreWindows,))
    st.channel_index("a", "r", "paid")
    st.extensions["quality"].add_scores(np.array([0]), np.array([T0 + 5]), np.array([0.25]), "v1")
    state = st.state()
    fresh = WindowStore(windows=(QualityScoreWindows,))
    fresh.load(state)
    assert fresh.extensions["quality"].scores.version[0] == "v1"
    assert fresh.view(T0 + 60_000).quality_n_5m.tolist() == [1.0]
    old = {**state, "extensions": {}}  # a state saved before the quality windows existed
    fresh2 = WindowStore(windows=(QualityScoreWindows,))
    fresh2.load(old)
    assert fresh2.view(T0 + 60_000).quality_n_5m.tolist() == [0.0]


# --- the detector ------------------------------------------------------------------------------

def qview(c=1, **kw):
    from pipeline.windows.view import WindowView

    base = {f.name: np.zeros(c) for f in dataclasses.fields(WindowView) if f.name not in ("now_ms", "extra")}
    extra = {"p95_ms": np.full(c, np.nan), "base_p95_ms": np.full(c, np.nan), "quality_lag_ms": np.zeros(c)}
    defaults = dict(quality_n_5m=150, quality_mean_5m=0.8, quality_var_5m=0.06, base_quality_n=5_000,
                    base_quality_mean=0.8, base_quality_var=0.06, base_quality_hours=24)
    defaults.update(kw)
    for k, v in defaults.items():
        extra[k] = np.broadcast_to(np.asarray(v, dtype=np.float64), (c,)).copy()
    return WindowView(now_ms=0, **base, extra=extra)


def th(c=1, t: Thresholds = PAID_TIER):
    return threshold_arrays([t] * c)


def test_welch_matches_scipy():
    rng = np.random.default_rng(3)
    a, b = rng.random(40) * 0.5 + 0.3, rng.random(900) * 0.4 + 0.5
    v = qview(quality_n_5m=len(a), quality_mean_5m=a.mean(), quality_var_5m=a.var(ddof=1),
              base_quality_n=len(b), base_quality_mean=b.mean(), base_quality_var=b.var(ddof=1))
    drop, t, df = QualityDrop().welch(v)
    ref = ttest_ind(b, a, equal_var=False, alternative="greater")
    assert drop[0] == pytest.approx(b.mean() - a.mean())
    assert t[0] == pytest.approx(ref.statistic) and student_t.sf(t[0], df[0]) == pytest.approx(ref.pvalue)
    ref2 = ttest_ind_from_stats(b.mean(), b.std(ddof=1), len(b), a.mean(), a.std(ddof=1), len(a), equal_var=False)
    assert t[0] == pytest.approx(ref2.statistic)


@pytest.mark.parametrize("mean5,n5,fired", [
    (0.70, 150, True),    # drop 0.10 (the effect-size line), t = 4.9 > t_160(0.99999) = 4.4
    (0.72, 150, False),   # drop 0.08: too small an effect (and t = 3.9)
    (0.55, 150, True),    # drop 0.25
    (0.55, 19, False),    # too few samples
    (0.60, 20, False),    # drop 0.20 with 20 samples: t = 3.6 < t_19(0.99999) = 5.6
    (0.40, 20, True),     # drop 0.40 with 20 samples: t = 7.3
])
def test_trip_needs_effect_size_and_significance(mean5, n5, fired):
    f = QualityDrop().detect(qview(quality_mean_5m=mean5, quality_n_5m=n5), th(), np.zeros(1, bool))
    assert bool(f.fired[0]) == fired
    assert f.metrics["quality_score_5m"][0] == pytest.approx(mean5)
    assert f.metrics["quality_baseline"][0] == pytest.approx(0.8)
    assert f.metrics["quality_samples_5m"][0] == n5


def test_hysteresis_and_evidence_rules():
    d = QualityDrop()
    seq, active = [], False
    for m in (0.8, 0.72, 0.6, 0.68, 0.74, 0.76, 0.72, 0.69):
        active = bool(d.detect(qview(quality_mean_5m=m), th(), np.array([active])).fired[0])
        seq.append(active)
    # trips at drop 0.2, stays while drop > 0.05, clears at 0.04, needs 0.10 again
    assert seq == [False, False, True, True, True, False, False, True]
    # thin window while active: kept; empty window or no baseline: dropped
    assert d.detect(qview(quality_mean_5m=0.8, quality_n_5m=5), th(), np.array([True])).fired[0]
    assert not d.detect(qview(quality_n_5m=0, quality_mean_5m=np.nan), th(), np.array([True])).fired[0]
    assert not d.detect(qview(quality_mean_5m=0.3, base_quality_n=0), th(), np.array([True])).fired[0]
    assert not d.detect(qview(quality_mean_5m=0.3, base_quality_hours=0), th(), np.array([False])).fired[0]


def test_zero_variance_and_per_channel_thresholds():
    d = QualityDrop()
    f = d.detect(qview(quality_mean_5m=0.0, quality_var_5m=0.0, base_quality_var=0.0), th(), np.zeros(1, bool))
    assert f.fired[0] and np.isinf(f.metrics["quality_t"][0])
    strict = dataclasses.replace(PAID_TIER, quality_min_drop=0.3, quality_clear_drop=0.1)
    both = d.detect(qview(2, quality_mean_5m=0.6), threshold_arrays([PAID_TIER, strict]), np.zeros(2, bool))
    assert both.fired.tolist() == [True, False]


def test_threshold_validation():
    with pytest.raises(ValueError):
        Thresholds(quality_min_drop=0.05, quality_clear_drop=0.05)
    with pytest.raises(ValueError):
        Thresholds(quality_min_samples=0)


# --- engine hook + replay ----------------------------------------------------------------------

def _events(hours: float, channels=("a/x@paid", "b/y@paid"), every_ms=1_000, bad_from_s=None, bad_channel=None):
    n = int(hours * 3_600_000 // every_ms)
    for k in range(n):
        for j, ch in enumerate(channels):
            t = T0 + k * every_ms + j * 7
            bad = bad_from_s is not None and ch == bad_channel and (t - T0) / 1000 >= bad_from_s
            yield {"event_id": f"{ch}-{k}", "ts_ms": t, "channel": ch, "route": "r", "status": "ok",
                   "latency_ms": 100.0, "tier": "paid", "prompt_text": f"q{k % 7}",
                   "response_text": ("bad" if bad else "good") + f" {k % 11}"}


class FakeScorer:
    """Scores by text: 'good ...' ~0.8, 'bad ...' ~0.35 (deterministic spread)."""

    version = "fake-1"

    def __init__(self):
        self.calls = 0

    def score(self, prompts, responses):
        self.calls += 1
        out = []
        for r in responses:
            k = int(r.split()[-1])
            out.append((0.8 if r.startswith("good") else 0.35) + (k - 5) * 0.03)
        return np.array(out)


def test_engine_add_quality_scores_counts_drops():
    eng, _ = replay(list(_events(0.01)))
    assert eng.add_quality_scores(["a/x@paid", "nope", "b/y@paid"], [T0 + 1, T0 + 1, T0 + 2], [1.5, 0.5, np.nan],
                                  "v1") == 1
    assert eng.quality.dropped == {"unknown_channel": 1, "not_finite": 1}
    assert eng.store.extensions["quality"].scores.short.counts[0, :, 1].sum() == pytest.approx(1.0)  # clipped to 1
    assert eng.add_quality_scores(["a/x@paid"], [T0 - 3_600_000], [0.5], "v1") == 0
    assert eng.quality.dropped["too_old"] == 1
    eng.add_quality_scores(["a/x@paid"], [T0 + 3], [0.5], "v2")
    assert eng.quality.resets == 1
    with pytest.raises(ValueError):
        eng.add_quality_scores(["a/x@paid"], [], [0.5])


def test_replay_with_scorer_detects_drop_on_one_channel_only():
    scorer = FakeScorer()
    sampler = QualitySampler(SamplerConfig(interval_ms=2_000, burst=1))
    eng, verdicts = replay(_events(2.25, bad_from_s=7200, bad_channel="a/x@paid"), scorer=scorer, sampler=sampler)
    assert sampler.counters["sampled"] > 0 and sampler.counters["throttled"] > 0
    assert eng.quality.added == sampler.counters["sampled"]
    a = [v for v in verdicts if v.channel == "a/x@paid"]
    b = [v for v in verdicts if v.channel == "b/y@paid"]
    first = next(v for v in a if "quality" in v.reasons)
    delay = (first.ts_ms - T0) / 1000 - 7200
    assert 0 < delay <= 120
    assert first.state == "degraded"
    assert first.metrics["quality_score_5m"] < first.metrics["quality_baseline"] - 0.1
    assert first.metrics["quality_baseline"] == pytest.approx(0.8, abs=0.02)
    assert not [v for v in a if "quality" in v.reasons and v.ts_ms < T0 + 7_200_000]
    assert not [v for v in b if v.state != "healthy"]
    # one sample per 2 s of event time per channel at most: <= 150 per 5 min window
    assert max(v.metrics["quality_samples_5m"] for v in b) <= 151


def test_engine_and_replay_stay_free_of_torch():
    import subprocess
    import sys

    code = ("import sys; from pipeline.engine.replay import replay; from pipeline.quality.sampler import QualitySampler; "
            "import pipeline.stream.quality_agent; "
            "print(sorted(m for m in ('torch', 'sentence_transformers') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).parents[2])
    assert out.stdout.strip() == "[]"


# --- snapshots -----------------------------------------------------------------------------------

def test_snapshot_carries_quality_windows_and_version():
    eng, _ = replay(_events(1.2), scorer=FakeScorer())
    view = eng.store.view(T0 + int(1.2 * 3_600_000))
    fresh = Engine()
    raw = export_channel(eng, 0)
    import_channel(fresh, decode_snapshot(raw))
    v2 = fresh.store.view(T0 + int(1.2 * 3_600_000))
    assert fresh.store.extensions["quality"].scores.version[0] == "fake-1"
    for f in ("quality_n_5m", "quality_mean_5m", "base_quality_n", "base_quality_mean", "base_quality_hours"):
        assert getattr(v2, f)[0] == pytest.approx(getattr(view, f)[0]), f
    # a snapshot written before the quality rings existed: loads with empty ones
    snap = decode_snapshot(raw)
    old = msgspec.msgpack.encode({k: getattr(snap, k) for k in ChannelSnapshot.__struct_fields__
                                  if not k.startswith("quality")})
    fresh2 = Engine()
    import_channel(fresh2, decode_snapshot(old))
    assert fresh2.store.view(T0 + int(1.2 * 3_600_000)).base_quality_n[0] == 0
    assert fresh2.store.extensions["quality"].scores.version[0] is None


# --- sampler ---------------------------------------------------------------------------------------

def ev(ts, ch="c", status="ok", text="an answer", prompt="q", expected=None, eid=None):
    return msgspec.convert({"event_id": eid or f"{ch}-{ts}", "ts_ms": ts, "channel": ch, "route": "r",
                            "status": status, "latency_ms": 1.0, "response_text": text, "prompt_text": prompt,
                            "expected_fields": expected}, RequestEvent)


def test_sampler_token_bucket_on_event_time():
    s = QualitySampler(SamplerConfig(interval_ms=2_000, burst=1))
    picks = s.offer([ev(T0 + i * 500) for i in range(40)])  # 20 s of event time at 2 req/s
    assert [p.ts_ms - T0 for p in picks] == list(range(0, 20_000, 2_000))
    assert s.counters["sampled"] == 10 and s.counters["throttled"] == 30
    # per channel; out-of-order events refill nothing
    picks = s.offer([ev(T0 + 30_000, ch="d"), ev(T0 + 29_000), ev(T0 + 20_500), ev(T0 + 30_500, ch="d")])
    assert [(p.channel, p.ts_ms - T0) for p in picks] == [("d", 30_000), ("c", 29_000)]
    burst = QualitySampler(SamplerConfig(interval_ms=1_000, burst=3))
    got = burst.offer([ev(T0 + 60_000 + i) for i in range(5)])
    assert len(got) == 3


def test_sampler_skips_and_counts():
    s = QualitySampler(SamplerConfig(interval_ms=1))
    out = s.offer([ev(T0, status="error"), ev(T0 + 1, text=None), ev(T0 + 2, expected=["a"], text='{"a": 1}'),
                   ev(T0 + 3, text="fine", prompt=None), ev(T0 + 4, text="  ")])
    assert [(p.response, p.prompt) for p in out] == [("fine", None), ("  ", "q")]
    assert out[1].reasons == ("empty_text",)
    c = s.counters
    assert (c["not_ok"], c["no_text"], c["structured"], c["sampled"], c["empty_text"]) == (1, 1, 1, 2, 1)
    assert QualitySampler(SamplerConfig(include_structured=True)).offer([ev(T0, expected=["a"])])


def test_safe_text_makes_publishable_text():
    big = "x" * 1_000_000 + "\ud800"
    text, why = safe_text(big, 16_384)
    assert len(text) == 16_384 and why == ["truncated"]
    text, why = safe_text("a\ud800b\udfff", 100)
    assert text == "a\ufffdb\ufffd" and why == ["invalid_utf8"]
    msgspec.json.encode(text)  # valid UTF-8 now
    assert safe_text(b"caf\xe9", 10) == ("caf\ufffd", ["invalid_utf8"])
    assert safe_text("中文回答", 10) == ("中文回答", [])
    for bad in (dict(interval_ms=0), dict(burst=0), dict(max_text_chars=0)):
        with pytest.raises(ValueError):
            SamplerConfig(**bad)


# --- caches ------------------------------------------------------------------------------------------

class CountingScorer(FakeScorer):
    def __init__(self):
        super().__init__()
        self.rows = 0

    def score(self, prompts, responses):
        self.rows += len(responses)
        return super().score(prompts, responses)


def test_cached_scorer_scores_each_pair_once():
    inner = CountingScorer()
    c = CachedScorer(inner, max_entries=3)
    a = c.score(["p", "p", None], ["good 5", "good 5", "bad 5"])
    assert inner.rows == 2 and a.tolist() == pytest.approx([0.8, 0.8, 0.35])
    b = c.score(["p"], ["good 5"])
    assert inner.rows == 2 and b[0] == pytest.approx(0.8)
    assert c.counters == {"cache_hit": 1, "cache_miss": 2}
    assert pair_key("v", "p", "r") != pair_key("v", "pr", "") != pair_key("w", "p", "r")
    assert pair_key("v", None, "\ud800") == pair_key("v", None, "\ud800")
    c.score(["1", "2", "3", "4"], ["good 1"] * 4)  # LRU bound
    assert len(c._lru) == 3


def test_caching_embedder():
    class Emb:
        dim, max_chars, info = 2, 10, "info"

        def __init__(self):
            self.seen = []

        def encode_clean(self, texts, batch_size=32):
            self.seen += list(texts)
            return np.array([[len(t), 1.0] for t in texts], dtype=np.float32)

    inner = Emb()
    e = CachingEmbedder(inner)
    assert e.info == "info" and e.dim == 2
    out = e.encode_clean(["ab", "abc", "ab"])
    assert out[:, 0].tolist() == [2, 3, 2] and inner.seen == ["ab", "abc"]
    e.encode_clean(["abc", "x"])
    assert inner.seen == ["ab", "abc", "x"] and (e.hits, e.misses) == (1, 3)


def test_quality_score_message_matches_schema():
    from pipeline.stream.quality_agent import QualityScore

    jsonschema.Draft202012Validator.check_schema(SCHEMA)
    msg = QualityScore(event_id="e1", ts_ms=T0, channel="c", route="r", score=0.25, model_version="v1",
                       scored_at_ms=T0 + 5)
    doc = json.loads(msgspec.json.encode(msg))
    jsonschema.validate(doc, SCHEMA)
    assert set(doc) == set(SCHEMA["required"]) == set(SCHEMA["properties"])
