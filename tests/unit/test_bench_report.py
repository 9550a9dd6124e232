"""The benchmark's report maths and JSON keys (pipeline.tools.bench.report)."""

from __future__ import annotations

import json

import pytest

from pipeline.tools.bench import report


def _stages() -> dict:
    rss = {"peak_rss_mb": 400.0}
    return {
        "ceiling": {"batched": {"events_per_s": 400_000.0}, "single": {"events_per_s": 150_000.0}},
        "bare_faust_batched": {"events_per_s": 500_000.0},
        "bare_faust_single": {"events_per_s": 5_000.0},
        "pipeline_faust_batched": {"events_per_s": 100_000.0, "reset_s": 0.31, "restored_channels": 1000, **rss},
        "pipeline_faust_single": {"events_per_s": 4_500.0, "peak_rss_mb": 450.0},
        "pipeline_aiokafka_batched": {"events_per_s": 120_000.0, "reset_s": 0.24, **rss},
        "pipeline_aiokafka_single": {"events_per_s": 6_000.0, **rss},
        "workers_2": {"events_per_s": 180_000.0, "per_worker": [{"peak_rss_mb": 420.0}, {"peak_rss_mb": 480.0}]},
        "paced": {"delays_ms": [float(x) for x in range(1, 101)], "rate_events_per_s": 50_000.0, "peak_rss_mb": 300.0},
        "warm": {"hours": [{"rss_mb": 500.0 + (h > 0) * 10} for h in range(24)], "events": 600_000},
        "profile": {"us_per_event": {"batched": {"sink_rows": 2.0, "sink_insert_wall": 3.0}}},
    }


def test_required_keys_and_ratios():
    doc = report.build(_stages(), {"events": 1}, {"cpus": 2})
    assert doc["batched"]["events_per_s"] == 100_000.0
    assert doc["batched"]["ratio_to_ceiling"] == 0.25
    assert doc["single"]["events_per_s"] == 4_500.0
    assert doc["single"]["ratio_to_bare_faust"] == 0.9
    assert doc["verdict_delay_p99_ms"] == 99.0
    assert doc["peak_rss_mb"] == 480.0  # the largest pipeline worker, including each of the two workers
    assert doc["workers"]["scaling"] == 1.5
    assert doc["sink"]["rows_per_s_capacity"] == 200_000.0
    assert doc["replay_24h"]["rss_growth_second_12h_mb"] == 0.0
    assert doc["single"]["ratio_to_bare_faust_by_round"] is None  # one run per stage: no rounds to pair
    assert doc["restore_at_assignment_s"] == {"faust_worker": 0.31, "aiokafka_driver": 0.24, "restored_channels": 1000}
    json.dumps(doc)  # serialisable as is


def test_ratios_round_by_round_pair_the_runs_of_each_round():
    stages = _stages()
    stages["ceiling"]["batched"]["runs_events_per_s"] = [400_000.0, 500_000.0, 300_000.0]
    stages["bare_faust_single"]["runs_events_per_s"] = [5_000.0, 4_000.0, 6_000.0]
    stages["pipeline_faust_batched"]["runs_events_per_s"] = [100_000.0, 100_000.0, 90_000.0]
    stages["pipeline_faust_single"]["runs_events_per_s"] = [4_500.0, 4_000.0, 4_200.0]
    stages["pipeline_faust_batched"]["runs_peak_rss_mb"] = [400.0, 520.0, 410.0]
    doc = report.build(stages, {}, {})
    assert doc["peak_rss_mb"] == 520.0  # the largest of any run, not only the median run's
    assert doc["batched"]["ratio_to_ceiling_by_round"] == [0.25, 0.2, 0.3]
    assert doc["single"]["ratio_to_bare_faust_by_round"] == [0.9, 1.0, 0.7]
    assert ("faust worker, round by round (stages interleaved): batched ÷ ceiling 0.25, 0.20, 0.30; "
            "single ÷ bare faust 0.90, 1.00, 0.70") in report.table(doc)


def test_targets_are_checked():
    t = report.build(_stages(), {}, {})["targets"]
    assert t["batched_events_per_s"]["met"] is False
    assert t["batched_ratio_to_ceiling"] == {"target": ">= 0.25", "value": 0.25, "met": True}  # at the line
    stages = _stages()
    stages["pipeline_faust_batched"]["events_per_s"] = 99_000.0  # 0.2475 of the ceiling: under the line
    assert report.build(stages, {}, {})["targets"]["batched_ratio_to_ceiling"]["met"] is False
    assert t["single_ratio_to_bare_faust"]["met"] is True
    assert t["verdict_delay_p99_ms"]["met"] is True
    assert t["peak_rss_mb"]["met"] is True
    assert t["sink_rows_per_s"]["met"] is True


def test_missing_stages_give_none_not_errors():
    doc = report.build({"ceiling": {"error": "boom"}}, {}, {})
    assert doc["batched"]["events_per_s"] is None and doc["batched"]["ratio_to_ceiling"] is None
    assert doc["verdict_delay_p99_ms"] is None and doc["peak_rss_mb"] is None
    assert doc["targets"]["batched_events_per_s"]["met"] is None
    assert "not measured" in report.table(doc)


def test_table_mentions_every_stage_and_target():
    text = report.table(report.build(_stages(), {}, {}))
    for needle in ("ceiling", "bare faust", "faust worker", "aiokafka driver", "2 aiokafka workers", "p99 99 ms",
                   "batched_ratio_to_ceiling", "NOT met",
                   "restore at assignment (1,000 channels; state topic read + restore, before the first batch, "
                   "outside the rates above): faust worker 0.31 s, aiokafka driver 0.24 s"):
        assert needle in text


@pytest.mark.parametrize("values,q,expected", [([3, 1, 2], 0, 1), ([3, 1, 2], 100, 3), ([1.0] * 10 + [9.0], 99, 9.0)])
def test_percentile_nearest_rank(values, q, expected):
    assert report.percentile(values, q) == expected


def test_percentile_rejects_bad_q():
    with pytest.raises(ValueError):
        report.percentile([1], 101)


def test_verdict_delay_uses_first_send_past_the_verdict_time():
    sent = [(1_000, 10.0), (900, 10.1), (2_000, 11.0), (3_000, 12.0)]
    received = [(1_500, 11.25), (2_000, 11.5), (500, 10.5), (9_000, 20.0)]
    # 1,500 and 2,000 first became possible at 11.0 s; 500 at 10.0 s; 9,000 was never sent past.
    assert report.verdict_delays(received, sent) == [250.0, 500.0, 500.0]
    assert report.verdict_delays(received, sent, after_ts_ms=1_000) == [250.0, 500.0]


def test_the_2_worker_scaling_is_reported_beside_what_the_machine_allows():
    """Issue #34 part 3: on 2 CPUs a worker (with its sink process) that used 1.6 cores leaves room for ×1.25
    at most; ×1.5 measured on 8 CPUs is 75 % of the ×2 there."""
    stages = _stages()
    stages["pipeline_aiokafka_batched"].update(cpu_s=16.0, seconds=10.0)
    stages["workers_2"]["events_per_s"] = 144_000.0
    w = report.build(stages, {}, {"cpus": 2})["workers"]
    assert (w["scaling"], w["scaling_limit"], w["scaling_of_limit"], w["cpus"]) == (1.2, 1.25, 0.96, 2)
    assert "(×1.20; at most ×1.25 on these 2 CPUs" in report.table(report.build(stages, {}, {"cpus": 2}))
    stages["workers_2"]["events_per_s"] = 180_000.0
    w = report.build(stages, {}, {"cpus": 8})["workers"]
    assert (w["scaling"], w["scaling_limit"], w["scaling_of_limit"]) == (1.5, 2.0, 0.75)


def test_replay_growth_is_not_moved_by_the_sinks_merge_cycle() -> None:
    """The replay's growth figure compares the floors of six hourly samples 12 h apart: the chDB sink's
    merges (RSS up by ~100 MB for a few hours, then back, docs/THROUGHPUT.md) no longer decide it by where
    one sample falls (the last less the middle sample read +85 and +80 MB on the first two series); a
    lifted floor (a leak) still shows."""
    from pipeline.tools.bench.report import replay_growth_mb

    saw = [520.0, 600.0, 590.0, 570.0, 545.0, 525.0]  # one cycle, as replay_memory read on day 2
    assert replay_growth_mb([500.0] * 36 + [505.0] * 11 + [585.0]) == 5.0
    assert replay_growth_mb(saw * 8) == 0.0
    assert replay_growth_mb((saw[3:] + saw[:3]) * 8) == 0.0  # another phase, the same figure
    assert replay_growth_mb(saw * 6 + [x + 30.0 for x in saw * 2]) == 30.0  # the floor lifted by 30 MB
    assert replay_growth_mb([1.0, 2.0, 3.0]) is None and replay_growth_mb([1.0, 2.0, 3.0, 5.0]) == 2.0
