"""pipeline.policy.routes.bounded_shares: normalised, immediate cuts, bounded growth."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.policy.routes import MIN_GROWTH_ABS, bounded_shares


def bs(w, prev=None, g=1.5):
    return bounded_shares(np.array(w, dtype=float), None if prev is None else np.array(prev, dtype=float), g)


def test_first_round_is_plain_normalisation():
    assert bs([1.0, 0.5, 0.5]).tolist() == [0.5, 0.25, 0.25]
    assert bs([0.0, 0.0]).tolist() == [0.0, 0.0]
    assert bs([1.0, 1.0], prev=[0.0, 0.0]).tolist() == [0.5, 0.5]
    assert bs([2.0, -1.0, 1.0]).tolist() == [0.5, 0.0, 0.5]  # clipped to [0, 1]


def test_decrease_to_zero_is_immediate():
    s = bs([0.0, 1.0, 1.0], prev=[0.6, 0.2, 0.2])
    assert s[0] == 0.0 and s.sum() == pytest.approx(1.0)
    np.testing.assert_allclose(s, [0.0, 0.5, 0.5])


def test_decrease_immediate_when_others_can_absorb():
    np.testing.assert_allclose(bs([0.5, 1.0], prev=[0.5, 0.5]), [1 / 3, 2 / 3])
    np.testing.assert_allclose(bs([0.2, 1.0, 1.0], prev=[1 / 3] * 3), [0.2 / 2.2, 1 / 2.2, 1 / 2.2])


def test_growth_bounded_by_factor_when_others_absorb():
    # channel 1's target is 2/3, but it may grow only 0.1 -> 0.15; channel 2 absorbs the rest
    s = bs([0.0, 1.0, 0.5], prev=[0.3, 0.1, 0.6])
    np.testing.assert_allclose(s, [0.0, 0.15, 0.85])


def test_growth_floor_lets_idle_channel_start():
    s = bs([1.0, 1.0, 1.0], prev=[0.5, 0.5, 0.0])
    np.testing.assert_allclose(s, [0.475, 0.475, MIN_GROWTH_ABS])
    assert MIN_GROWTH_ABS == 0.05


def test_cap_lifted_when_nobody_can_absorb():
    # caps would be [0, .3, .3, .3] (sum .9 < 1): the traffic has to go somewhere
    np.testing.assert_allclose(bs([0.0, 1.0, 1.0, 1.0], prev=[0.4, 0.2, 0.2, 0.2]), [0, 1 / 3, 1 / 3, 1 / 3])
    np.testing.assert_allclose(bs([0.0, 1.0], prev=[0.9, 0.1]), [0.0, 1.0])


def test_gradual_shift_converges():
    prev = np.array([0.3, 0.1, 0.6])
    w = np.array([0.0, 1.0, 0.3])
    history = []
    for _ in range(10):
        s = bounded_shares(w, prev, 1.5)
        cap = np.where(w > 0, np.maximum(prev * 1.5, prev + 0.05), 0.0)
        assert cap.sum() >= 1.0 and np.all(s <= cap + 1e-9)
        history.append(s)
        prev = s
    np.testing.assert_allclose(history[-1], [0.0, 1 / 1.3, 0.3 / 1.3], atol=1e-9)
    assert history[0][1] == pytest.approx(0.15) and history[1][1] == pytest.approx(0.225)


def test_max_growth_validated():
    with pytest.raises(ValueError):
        bs([1.0, 1.0], prev=[0.5, 0.5], g=0.9)


@pytest.mark.parametrize("seed", range(300))
def test_random_properties(seed):
    rng = np.random.default_rng(seed)
    k = int(rng.integers(1, 9))
    w = rng.random(k) * (rng.random(k) > 0.25)
    prev = rng.dirichlet(np.ones(k)) * (rng.random(k) > 0.2)
    if prev.sum() > 0:
        prev = prev / prev.sum()
    g = float(rng.choice([1.0, 1.2, 1.5, 3.0]))
    s = bounded_shares(w, prev, g)
    assert s.shape == (k,)
    if w.sum() == 0:
        assert s.tolist() == [0.0] * k
        return
    target = w / w.sum()
    assert s.sum() == pytest.approx(1.0, abs=1e-9)
    assert np.all(s >= 0)
    assert np.all(s[w == 0] == 0)  # a channel without weight loses its traffic at once
    if prev.sum() <= 0:
        np.testing.assert_allclose(s, target)
        return
    cap = np.where(w > 0, np.maximum(prev * g, prev + MIN_GROWTH_ABS), 0.0)
    if cap.sum() >= 1.0:
        assert np.all(s <= cap + 1e-9)  # growth bounded
        # nobody above its target unless someone else is held below theirs by the cap
        if np.all(target <= cap + 1e-12):
            np.testing.assert_allclose(s, target, atol=1e-9)
    else:
        np.testing.assert_allclose(s, target, atol=1e-12)  # cap lifted
