"""Head maths: logistic fit ordering, ROC-AUC (Mann-Whitney), Platt step."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.quality.head import LogisticHead, fit_logistic, fit_platt, roc_auc


def test_fit_on_tiny_separable_set_orders_correctly():
    X = np.array([[-2.0, 0.1], [-1.0, -0.3], [-0.5, 0.2], [0.5, 0.0], [1.0, 0.4], [2.0, -0.1]])
    y = np.array([0, 0, 0, 1, 1, 1])
    h = fit_logistic(X, y, l2=0.05)
    p = h.predict_proba(X)
    assert np.all((p >= 0) & (p <= 1))
    assert p[y == 1].min() > p[y == 0].max()
    assert roc_auc(y, p) == 1.0
    # The separating feature carries the weight, with the right sign.
    assert h.coef[0] > 0 and abs(h.coef[0]) > abs(h.coef[1])
    # Monotone along the separating direction.
    grid = np.column_stack([np.linspace(-3, 3, 13), np.zeros(13)])
    assert np.all(np.diff(h.predict_proba(grid)) > 0)


def test_stronger_l2_shrinks_weights_and_warm_start_agrees():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(200, 5))
    y = (X[:, 0] + 0.5 * rng.normal(size=200) > 0).astype(int)
    weak = fit_logistic(X, y, l2=1e-3)
    strong = fit_logistic(X, y, l2=1.0)
    assert np.linalg.norm(strong.coef) < np.linalg.norm(weak.coef)
    warm = fit_logistic(X, y, l2=1e-3, init=strong)
    np.testing.assert_allclose(warm.coef, weak.coef, atol=1e-3)


def test_gradient_matches_finite_differences():
    """The optimum has zero gradient: perturbing coefficients only raises the loss."""
    rng = np.random.default_rng(1)
    X = rng.normal(size=(60, 3))
    y = (X @ np.array([1.0, -1.0, 0.5]) + rng.normal(size=60) > 0).astype(int)
    l2 = 0.1
    h = fit_logistic(X, y, l2=l2, tol=1e-10)
    Z = (X - h.mean) / h.scale

    def loss(coef, b):
        m = (2 * y - 1) * (Z @ coef + b)
        return np.mean(np.logaddexp(0, -m)) + 0.5 * l2 * coef @ coef

    base = loss(h.coef, h.intercept)
    for i in range(3):
        for eps in (1e-3, -1e-3):
            c = h.coef.copy()
            c[i] += eps
            assert loss(c, h.intercept) >= base - 1e-10


def test_roc_auc_matches_hand_computed_values():
    # pos scores {0.35, 0.8}, neg {0.1, 0.4}: pairs won 0.35>0.1, 0.8>0.1, 0.8>0.4 -> 3/4
    assert roc_auc([0, 0, 1, 1], [0.1, 0.4, 0.35, 0.8]) == pytest.approx(0.75)
    # ties count one half: pos {0.5, 0.9}, neg {0.5, 0.2}: 0.5~0.5 (0.5) + 1 + 1 + 1 -> 3.5/4
    assert roc_auc([1, 0, 1, 0], [0.5, 0.5, 0.9, 0.2]) == pytest.approx(0.875)
    assert roc_auc([0, 1], [0.9, 0.1]) == 0.0
    assert roc_auc([0, 0, 1], [0.2, 0.2, 0.2]) == pytest.approx(0.5)
    with pytest.raises(ValueError):
        roc_auc([1, 1], [0.1, 0.2])


def test_roc_auc_equals_pairwise_definition_on_random_data():
    rng = np.random.default_rng(2)
    y = rng.integers(0, 2, 300)
    s = np.round(rng.normal(size=300) + y, 1)  # rounding makes ties
    pos, neg = s[y == 1], s[y == 0]
    pairwise = ((pos[:, None] > neg[None, :]).sum() + 0.5 * (pos[:, None] == neg[None, :]).sum()) / (
        len(pos) * len(neg)
    )
    assert roc_auc(y, s) == pytest.approx(pairwise)


def test_platt_is_monotone_and_round_trips_arrays():
    z = np.linspace(-3, 3, 50)
    y = (z + np.random.default_rng(3).normal(size=50) > 0).astype(int)
    a, b = fit_platt(z, y)
    assert a > 0
    h = fit_logistic(z[:, None], y, l2=0.1)
    h.calib_a, h.calib_b = a, b
    again = LogisticHead.from_arrays(h.to_arrays("x__"), "x__")
    np.testing.assert_allclose(again.predict_proba(z[:, None]), h.predict_proba(z[:, None]))


def test_bad_inputs_are_clear_errors():
    with pytest.raises(ValueError):
        fit_logistic(np.zeros((3, 2)), np.array([1, 1, 1]))
    with pytest.raises(ValueError):
        fit_logistic(np.zeros((3, 2)), np.array([0, 1]))
    h = fit_logistic(np.array([[0.0], [1.0]]), np.array([0, 1]), l2=1.0)
    with pytest.raises(ValueError):
        h.predict_proba(np.zeros((2, 3)))
    assert h.predict_proba(np.array([[np.nan]]))[0] == 0.5
