"""Snapshots keyed by feature name (issue #15 item 2): old snapshots restore, new features start empty."""

from __future__ import annotations

import dataclasses
import json
import zlib
from pathlib import Path

import lz4.block
import msgspec
import numpy as np
import pytest

from pipeline.contracts import RequestEvent
from pipeline.signals import SIGNALS, Examples, Finding, Signal
from pipeline.engine import Engine
from pipeline.state.channel_state import MAX_SAVED_ROUTE
from pipeline.state.snapshot import (COMPRESSED_MARK, SNAPSHOT_VERSION, SnapshotError, decode_snapshot,
                                     export_channel, import_channel)
from pipeline.signals.latency_p95_ratio import LatencyWindows
from pipeline.windows.features import Counter, V1_COUNTER_NAMES
from pipeline.windows.store import WindowStore

DATA = Path(__file__).parents[1] / "data"
HOUR = 3_600_000
T0 = 1_750_000_000_000 - 1_750_000_000_000 % HOUR


# --- a version-1 snapshot written by main's code (tests/data/make_snapshot_v1.py) -------------

def _restored_v1() -> Engine:
    eng = Engine()
    snap = decode_snapshot((DATA / "snapshot_v1.msgpack").read_bytes())
    assert snap.version == 1 and snap.short_counts and not snap.counters
    import_channel(eng, snap)
    return eng


def _check_against_v1_expectation(eng: Engine) -> None:
    want = json.loads((DATA / "snapshot_v1_expected.json").read_text())
    view = eng.store.view(want["now_ms"])
    for k, v in want.items():
        if k in ("now_ms", "machine", "seq", "next_eval_ms"):
            continue
        np.testing.assert_array_equal(np.asarray(getattr(view, k), np.float64), np.asarray(v, np.float64), err_msg=k)
    machine = vars(eng.machines[0])
    assert {k: str(v) if not isinstance(v, (int, float, type(None))) else v
            for k, v in machine.items() if k in want["machine"]} == {
        k: v if not isinstance(v, list) else str(v) for k, v in want["machine"].items()}
    # Fields added to the machine since version 1 (the probe's pre-incident baseline, issue #18) start at
    # their defaults.
    fresh = vars(type(eng.machines[0])())
    assert {k: v for k, v in machine.items() if k not in want["machine"]} == {
        k: v for k, v in fresh.items() if k not in want["machine"]}
    assert eng.seq[0] == want["seq"] and int(eng.next_eval[0]) == want["next_eval_ms"]


def test_version_1_snapshot_restores_exactly():
    eng = _restored_v1()
    assert eng.store.names == ["snap/model@free"] and eng.store.tiers == ["free"]
    _check_against_v1_expectation(eng)
    assert eng.state.dropped_state == {}


def test_version_1_snapshot_rewritten_as_current_version_restores_the_same():
    raw = export_channel(_restored_v1(), 0)
    snap = decode_snapshot(raw)
    assert snap.version == SNAPSHOT_VERSION == 3 and set(snap.counters) == set(V1_COUNTER_NAMES)
    assert raw[:1] == COMPRESSED_MARK
    eng = Engine()
    import_channel(eng, snap)
    _check_against_v1_expectation(eng)


def test_version_2_snapshot_written_by_main_restores_exactly():
    """A record as main f2b7a5d wrote it (per-array zlib; tests/data/make_snapshot_v2.py) restores the
    same state, and so does its rewrite as version 3."""
    raw = (DATA / "snapshot_v2.msgpack").read_bytes()
    snap = decode_snapshot(raw)
    assert snap.version == 2 and raw[:1] != COMPRESSED_MARK
    eng = Engine()
    import_channel(eng, snap)
    _check_against_v1_expectation(eng)
    again = Engine()
    import_channel(again, decode_snapshot(export_channel(eng, 0)))
    _check_against_v1_expectation(again)


def test_records_written_before_the_round_counts_and_route_shares_restore_them_empty():
    """Version 1 and 2 records (and version 3 ones written before 2026-12-02) have neither the judged
    requests since the last round nor the route's shares: they restore as 0 and none (the route's next
    round then starts without a growth bound, as before), and a rewrite carries them from then on."""
    for raw in ((DATA / "snapshot_v1.msgpack").read_bytes(), (DATA / "snapshot_v2.msgpack").read_bytes()):
        snap = decode_snapshot(raw)
        assert snap.judged_since_eval == 0.0 and snap.route_shares is None
        eng = Engine()
        i = import_channel(eng, snap)
        assert eng.judged_since_eval[i] == 0.0 and eng.routes.export_route_shares(i) is None
    eng = _restored_v1()
    eng.judged_since_eval[0] = 7.0
    # the route's first round: its one channel is open (weight 0), and as the route's last channel the
    # panic floor keeps it in service (SPEC §4.2, issue #33: share 1.0, weight 0.5 published)
    share = eng.routes.after_round(np.array([0]), T0)[0]
    snap = decode_snapshot(export_channel(eng, 0))
    assert snap.judged_since_eval == 7.0 and eng.machines[0].weight == 0.0 and share == 1.0
    assert eng.routes.panic_weight == {0: 0.5}
    assert (snap.route_shares.version, snap.route_shares.shares) == (1, {"snap/model@free": 1.0})
    assert (snap.route_shares.round_ms, snap.route_shares.round_start) == (T0, None)


def test_corrupt_route_shares_are_snapshot_errors():
    snap = decode_snapshot(export_channel(_restored_v1(), 0))
    for wire in ({"version": 0, "shares": {}, "round_ms": 0}, {"version": 1, "shares": {"a": 1.5}, "round_ms": 0},
                 {"version": 1, "shares": {"a": float("nan")}, "round_ms": 0},
                 {"version": 1, "shares": {f"c{k}": 0.0 for k in range(MAX_SAVED_ROUTE + 1)}, "round_ms": 0}):
        record = msgspec.structs.asdict(snap) | {"route_shares": wire}
        with pytest.raises(SnapshotError):
            decode_snapshot(msgspec.msgpack.encode(record))


def test_a_version_3_record_without_compression_restores_too():
    """Plain msgpack of a version-3 record (arrays raw), as a test or tool may write it, is read as well."""
    snap = decode_snapshot(export_channel(_restored_v1(), 0))
    eng = Engine()
    import_channel(eng, decode_snapshot(msgspec.msgpack.encode(snap)))
    _check_against_v1_expectation(eng)


@pytest.mark.parametrize("cut", [b"\xc1", b"\xc1\xff\xff\xff\x7f", b"\xc1\x10\x00\x00\x00junk"])
def test_corrupt_compressed_records_are_snapshot_errors(cut):
    """A truncated, oversized or undecodable compressed record: :class:`SnapshotError`, never a crash or a
    huge allocation."""
    with pytest.raises(SnapshotError):
        decode_snapshot(cut)
    raw = export_channel(_restored_v1(), 0)
    with pytest.raises(SnapshotError):
        decode_snapshot(raw[:-20])


def test_unknown_version_and_bad_counter_are_snapshot_errors():
    raw = export_channel(_restored_v1(), 0)
    snap = decode_snapshot(raw)

    with pytest.raises(SnapshotError, match="version 9"):
        decode_snapshot(msgspec.msgpack.encode(msgspec.structs.replace(snap, version=9)))
    short = msgspec.structs.replace(snap, counters={**snap.counters, "judged": zlib.compress(b"\x00" * 20)})
    with pytest.raises(SnapshotError, match="corrupt or mismatched"):
        import_channel(Engine(), short)


# --- a new signal with a new window feature, registered after the snapshot was taken ------------

@dataclasses.dataclass(frozen=True)
class SlowParams:
    """Test signal parameters (no policy fields: it is not in the registry)."""

    slow_share_trip: float = 0.9


class SlowRequests:
    """Soft test signal: share of requests slower than 1 s over 5 min above 90 %."""

    reason = "test_over_1s"

    def detect(self, view, th, active) -> Finding:
        share = np.where(view.judged_5m > 0, view.over_1s_5m / np.maximum(view.judged_5m, 1), np.nan)
        return Finding(self.reason, np.nan_to_num(share) > SlowParams().slow_share_trip, {"slow_share_5m": share})


SLOW = Signal(name="test_over_1s", kind="soft", params=SlowParams, detector=SlowRequests(),
              features=("over_1s_5m", "judged_5m"), metrics=("slow_share_5m",),
              examples=Examples(firing={"over_1s_5m": 600, "judged_5m": 600}, thin=({},)),
              rule="test only", default="90 %",
              counters=(Counter("over_1s", lambda c: c.latency_ms > 1_000.0, "requests slower than 1 s"),))


def _events(t_from: int, t_to: int, seed: int) -> list[RequestEvent]:
    rng = np.random.default_rng(seed)
    ts = np.sort(rng.integers(t_from, t_to, (t_to - t_from) // 400))
    return [RequestEvent(event_id=f"s{seed}-{i}", ts_ms=t, channel=f"c{i % 3}", route="chat",
                         status=str(rng.choice(["ok", "error"], p=[0.97, 0.03])),
                         latency_ms=float(rng.lognormal(6.0, 0.5)), tier="paid")
            for i, t in enumerate(ts.tolist())]


def _feed(eng: Engine, events: list[RequestEvent]) -> list:
    out = []
    for k in range(0, len(events), 500):
        out.extend(eng.process(events[k:k + 500], fields=eng.read_fields(events[k:k + 500])).verdicts)
    return out


def test_new_signal_with_new_feature_restores_baselines_and_changes_nothing():
    day, after = _events(T0, T0 + 3 * HOUR, 1), _events(T0 + 3 * HOUR, T0 + 3 * HOUR + 20 * 60_000, 2)
    old = Engine()
    _feed(old, day)
    blobs = [export_channel(old, i) for i in range(old.store.n_channels)]
    new = Engine(signals=SIGNALS + (SLOW,))
    assert [c.name for c in new.store.counters][-1] == "over_1s"
    for b in blobs:
        import_channel(new, decode_snapshot(b))
    assert new.state.dropped_state == {}
    now = day[-1].ts_ms + 1
    v_old, v_new = old.store.view(now), new.store.view(now)
    for f in dataclasses.fields(v_old):
        if f.name != "extra":  # every existing feature, the 24 h baselines included, is intact
            np.testing.assert_array_equal(getattr(v_old, f.name), getattr(v_new, f.name), err_msg=f.name)
    # the complete hours before now; since baselines learn from healthy time only (SPEC §4.2, issue #33
    # part 5) they hold only the healthy minutes: these channels (3 % errors) spend much of the day open or
    # recovering, c1 the most (495 / 2,916 / 3,001 samples, was > 1,000 each); the equality above is the test
    assert (v_old.base_hours == 2).all() and (v_old.base_n > 400).all()
    assert v_new.over_1s_5m.tolist() == [0.0] * 3 and v_new.feature("over_1s_1m").tolist() == [0.0] * 3
    assert [vars(m) for m in new.machines] == [vars(m) for m in old.machines] and new.seq == old.seq
    # the restart changes no state: the same events afterwards give the same verdicts
    verdicts_old, verdicts_new = _feed(old, after), _feed(new, after)
    assert len(verdicts_old) == len(verdicts_new) > 100
    for a, b in zip(verdicts_old, verdicts_new):
        # route shares are in no snapshot (a restored worker recomputes them from the weights): the same value,
        # up to the last bit of the float sum
        b_metrics = {k: v for k, v in b.metrics.items() if k not in ("slow_share_5m", "route_share")}
        a_metrics = {k: v for k, v in a.metrics.items() if k != "route_share"}
        assert (a.channel, a.state, a.weight, a.reasons, a.ts_ms, a.seq, a_metrics) == \
            (b.channel, b.state, b.weight, b.reasons, b.ts_ms, b.seq, b_metrics)
        if "route_share" in a.metrics:
            assert b.metrics["route_share"] == pytest.approx(a.metrics["route_share"], rel=1e-12)
        else:
            assert "route_share" not in b.metrics
        # a round's verdict carries the new signal's numbers; a pre-trip or a re-admission between rounds
        # (SPEC §4.2: a share move only, metrics route_share/max_share) does not
        if "route_share" in b.metrics and set(b.metrics) - {"route_share", "max_share"}:
            assert b.metrics["slow_share_5m"] is not None
    # the new counter fills from events after the restart, exactly
    end = after[-1].ts_ms + 1
    lo = (-(-end // 10_000) - 30) * 10_000  # the 5 min window: whole 10 s slots
    want = [sum(1 for e in after if e.channel == c and e.ts_ms >= lo and e.latency_ms > 1_000.0) for c in new.store.names]
    assert new.store.view(end).over_1s_5m.tolist() == want and min(want) > 0


def test_snapshot_with_a_feature_the_engine_lacks_drops_it_and_counts_it():
    new = Engine(signals=SIGNALS + (SLOW,))
    _feed(new, _events(T0, T0 + HOUR, 3))
    old = Engine()
    for i in range(new.store.n_channels):
        import_channel(old, decode_snapshot(export_channel(new, i)))
    assert old.state.dropped_state == {"over_1s": 3, "test_over_1s": 3}
    now = T0 + HOUR
    np.testing.assert_array_equal(old.store.view(now).judged_5m, new.store.view(now).judged_5m)


def test_store_state_loads_counters_by_name():
    eng = Engine()
    _feed(eng, _events(T0, T0 + HOUR, 5))
    state = eng.store.state()
    wider = WindowStore(counters=SLOW.counters, windows=(LatencyWindows,))
    wider.load(state)
    now = T0 + HOUR
    a, b = eng.store.view(now), wider.view(now)
    for name in ("judged_5m", "failures_1m", "ok_5m", "rate_limited_5m", "base_p95_ms"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)
    assert b.over_1s_5m.tolist() == [0.0] * 3
    legacy = {k: v for k, v in state.items() if k != "counters"}  # a state saved before counters had names
    again = WindowStore()
    again.load(legacy)
    np.testing.assert_array_equal(again.view(now).judged_5m, a.judged_5m)


# --- version-3 records written by main c047104, before every signal's windows were one mechanism --------

def test_version_3_records_of_the_built_in_windows_restore_and_are_written_back_byte_for_byte():
    """Records main c047104 wrote (tests/data/make_snapshot_v3_main.py: latency histograms, failure run and
    quality rings then built into the store) restore every view feature exactly, and today's code writes
    the same channels back as the same record (the state machine's issue #32 fields added at their defaults,
    every other part byte for byte): workers of either version read each other's snapshots during
    a rolling upgrade. Checked to fail on a layout change: writing the latency rows under ``extensions``
    leaves ``short_hist`` empty, which main's reader refuses (and the byte comparison fails)."""
    raws = msgspec.msgpack.decode((DATA / "snapshot_v3_main.msgpack").read_bytes())
    want = json.loads((DATA / "snapshot_v3_main_expected.json").read_text())
    eng = Engine()
    rows = [import_channel(eng, decode_snapshot(raw)) for raw in raws]
    assert eng.store.names == want["names"] and rows == [0, 1] and eng.state.dropped_state == {}
    # Written back (before a view: the CUSUMs advance in a view): the same record, every part but the state
    # machine byte for byte; the machine gains the fields the error classes added (issue #32: the open's
    # ``cause``, its ``cooldown_ms``, the re-open count ``reopens``) at their defaults, which is what a
    # record without them restores to; main's reader ignores the unknown keys (msgspec's default).
    added = {"cause": "", "cooldown_ms": 0, "reopens": 0}
    for raw, i in zip(raws, rows):
        old, new = (msgspec.msgpack.decode(lz4.block.decompress(b[1:])) for b in (raw, export_channel(eng, i)))
        assert new.keys() == old.keys()
        assert {k: v for k, v in new.items() if k != "machine"} == {k: v for k, v in old.items() if k != "machine"}
        assert not added.keys() & old["machine"].keys() and new["machine"] == {**old["machine"], **added}
        assert decode_snapshot(export_channel(eng, i)) == decode_snapshot(raw)
    view = eng.store.view(want["now_ms"])
    assert {f for f in want["features"]} <= set(view.extra) | set(view.__dataclass_fields__)
    for name, values in want["features"].items():
        np.testing.assert_array_equal(np.asarray(view.feature(name), np.float64),
                                      np.array([np.nan if v is None else v for v in values]), err_msg=name)
    assert view.run.tolist() == [0.0, 6.0] and view.base_n.tolist() == [5760.0, 5754.0]
