"""pipeline.windows.runs.RunTracker: consecutive-failure runs over requests, not time."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.windows.runs import RunTracker

F, S, N = 1, 0, -1  # failure, success, neutral


def _upd(t: RunTracker, ch, out):
    g, m = t.update(np.asarray(ch, dtype=np.int64), np.asarray(out, dtype=np.int8))
    return g.tolist(), m.tolist()


class Reference:
    """Brute force: one Python loop per event."""

    def __init__(self, window: int):
        self.window = window
        self.trailing: dict[int, int] = {}

    def update(self, ch, out):
        best: dict[int, int] = {}
        for c, o in zip(ch, out):
            if o < 0:
                continue
            r = self.trailing.get(c, 0)
            r = min(r + 1, self.window) if o == 1 else 0
            self.trailing[c] = r
            best[c] = max(best.get(c, 0), r)
        keys = sorted(best)
        return keys, [best[k] for k in keys]


def test_run_across_batches():
    t = RunTracker()
    assert _upd(t, [0, 0], [S, F]) == ([0], [1])
    assert _upd(t, [0, 0], [F, F]) == ([0], [3])
    assert _upd(t, [0], [F]) == ([0], [4])
    assert _upd(t, [0, 0, 0], [F, S, F]) == ([0], [5])
    assert int(t.trailing[0]) == 1


def test_run_across_quiet_gaps_is_not_reset_by_time():
    """Failures hours apart still add up: nothing resets on a timer, only a success does."""
    t = RunTracker()
    for k in range(1, 8):
        assert _upd(t, [3], [F]) == ([3], [k])
        assert _upd(t, [], []) == ([], [])  # empty batches (quiet gaps)
    assert int(t.trailing[3]) == 7


def test_neutral_outcomes_ignored():
    t = RunTracker()
    assert _upd(t, [0] * 7, [F, N, F, N, N, F, N]) == ([0], [3])
    assert _upd(t, [0, 0], [N, N]) == ([], [])  # only neutrals: channel not reported
    assert int(t.trailing[0]) == 3
    assert _upd(t, [0, 0], [N, F]) == ([0], [4])


def test_success_resets_and_max_is_within_batch():
    t = RunTracker()
    assert _upd(t, [0] * 6, [F, F, F, S, F, S]) == ([0], [3])
    assert int(t.trailing[0]) == 0
    # carried run counts toward the batch max only while unbroken
    _upd(t, [0, 0], [F, F])
    assert _upd(t, [0, 0], [S, F]) == ([0], [1])


def test_cap_at_window():
    t = RunTracker()  # default window 100
    assert t.window == 100
    assert _upd(t, [0] * 150, [F] * 150) == ([0], [100])
    assert int(t.trailing[0]) == 100
    assert _upd(t, [0] * 10, [F] * 10) == ([0], [100])
    assert _upd(t, [0, 0], [S, F]) == ([0], [1])


def test_small_window():
    t = RunTracker(window=3)
    assert _upd(t, [1] * 5, [F] * 5) == ([1], [3])
    with pytest.raises(ValueError):
        RunTracker(window=0)


def test_channels_interleaved_are_independent():
    t = RunTracker()
    ch = [0, 1, 0, 2, 1, 0, 1, 2]
    out = [F, F, F, S, S, F, F, F]
    assert _upd(t, ch, out) == ([0, 1, 2], [3, 1, 1])
    assert t.trailing[:3].tolist() == [3, 1, 1]


def test_capacity_grows():
    t = RunTracker(capacity=2)
    t.ensure_capacity(37)
    assert t.trailing.shape[0] >= 37
    assert _upd(t, [36, 36], [F, F]) == ([36], [2])
    t.reset(36)
    assert int(t.trailing[36]) == 0


def test_snapshot_roundtrip():
    t = RunTracker()
    _upd(t, [0, 1, 1], [F, F, F])
    u = RunTracker()
    u.load(t.state())
    assert _upd(u, [1], [F]) == ([1], [3])


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("window", [1, 5, 100])
def test_random_against_brute_force(seed, window):
    rng = np.random.default_rng(seed)
    n_ch = int(rng.integers(1, 12))
    t = RunTracker(window=window, capacity=n_ch)
    ref = Reference(window)
    p_fail = rng.uniform(0.3, 0.98)
    for _ in range(40):
        n = int(rng.integers(0, 300))
        ch = rng.integers(0, n_ch, n)
        out = rng.choice([F, S, N], n, p=[p_fail * 0.9, (1 - p_fail) * 0.9, 0.1])
        got = _upd(t, ch, out)
        exp = ref.update(ch.tolist(), out.tolist())
        assert got == exp
        assert t.trailing[:n_ch].tolist() == [ref.trailing.get(c, 0) for c in range(n_ch)]


@pytest.mark.parametrize("seed", range(10))
def test_few_failures_path_equals_per_event_path(seed):
    """Batches where at most 1 in 8 judged events failed follow only the failing channels: runs, largest
    runs, threshold crossings (thresholds 0..8) and trailing runs equal the per-event path's exactly."""
    rng = np.random.default_rng(500 + seed)
    n_ch = int(rng.choice([3, 300, 1200]))
    fast = RunTracker(window=int(rng.choice([5, 100])), capacity=n_ch)
    slow = RunTracker(window=fast.window, capacity=n_ch)
    for _ in range(30):
        n = int(rng.choice([33, 500, 4000]))
        ch = rng.integers(0, n_ch, n)
        p_fail = float(rng.choice([0.0, 0.002, 0.05, 0.12]))
        out = rng.choice([F, S, N], n, p=[p_fail, 0.95 - p_fail, 0.05]).astype(np.int8)
        if rng.random() < 0.3:  # a burst on one channel: runs that reach the thresholds
            hot = rng.integers(0, n, 12)
            ch[hot], out[hot] = ch[hot[0]], F
        th = rng.integers(0, 9, n_ch) if rng.random() < 0.8 else None
        g1, m1 = fast.update(ch, out, th)
        c1 = fast.crossed_at.tolist()
        g2, m2 = slow._update_small(ch, out, [] if th is None else [th])
        c2 = slow.crossed_at[0].tolist() if th is not None else []
        assert (g1.tolist(), m1.tolist(), c1) == (g2.tolist(), m2.tolist(), c2)
        assert m1.dtype == m2.dtype == np.int32 and g1.dtype == np.int64
        assert fast.trailing.tolist() == slow.trailing.tolist()


@pytest.mark.parametrize("seed", range(8))
def test_early_threshold_crossings(seed):
    """A second threshold per channel (``early``, the engine's suspicion run) gives, on every path, the
    first event whose run reached it, exactly as an event-by-event count does; the first threshold's
    crossings are the same with or without it."""
    rng = np.random.default_rng(700 + seed)
    n_ch = int(rng.choice([2, 40, 500]))
    t, plain = RunTracker(capacity=n_ch), RunTracker(capacity=n_ch)
    runs = [0] * n_ch
    for _ in range(25):
        n = int(rng.choice([5, 32, 33, 600, 3000]))
        ch = rng.integers(0, n_ch, n)
        p_fail = float(rng.choice([0.002, 0.05, 0.4]))
        out = rng.choice([F, S, N], n, p=[p_fail, 0.95 - p_fail, 0.05]).astype(np.int8)
        th, early = np.full(n_ch, 5), rng.integers(1, 5, n_ch)
        first: dict[int, int] = {}
        for i, (c, o) in enumerate(zip(ch.tolist(), out.tolist())):
            if o >= 0:
                runs[c] = runs[c] + 1 if o == F else 0
                if runs[c] >= early[c] and c not in first:
                    first[c] = i
        g, _ = t.update(ch, out, th, early)
        assert t.crossed_early.tolist() == [first.get(c, -1) for c in g.tolist()]
        plain.update(ch, out, th)
        assert t.crossed_at.tolist() == plain.crossed_at.tolist()
