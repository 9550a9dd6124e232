"""L2-regularised logistic regression head, fit with ``scipy.optimize``.

Features are standardised (mean/scale stored with the weights), then

    minimise  sum_i w_i * logloss(y_i, sigmoid(x_i . coef + b)) / sum_i w_i
              + l2 / 2 * ||coef||^2

with L-BFGS-B and the analytic gradient. The intercept is not penalised.
An optional Platt step (``calib_a * z + calib_b``) can be fit on
out-of-fold scores; it is monotone, so it never changes ROC-AUC.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from scipy import optimize
from scipy.special import expit, log_expit


@dataclass
class LogisticHead:
    """Weights of a fitted head; :meth:`predict_proba` gives P(good) in [0, 1]."""

    coef: np.ndarray
    intercept: float
    mean: np.ndarray
    scale: np.ndarray
    l2: float
    calib_a: float = 1.0
    calib_b: float = 0.0
    info: dict = field(default_factory=dict)

    @property
    def n_features(self) -> int:
        return int(self.coef.shape[0])

    def decision_function(self, X: np.ndarray) -> np.ndarray:
        X = np.asarray(X, dtype=np.float64)
        if X.ndim != 2 or X.shape[1] != self.n_features:
            raise ValueError(f"expected [n, {self.n_features}] features, got {X.shape}")
        z = ((X - self.mean) / self.scale) @ self.coef + self.intercept
        return self.calib_a * z + self.calib_b

    def predict_proba(self, X: np.ndarray) -> np.ndarray:
        """P(good answer) for each row, in [0, 1]; non-finite inputs give 0.5."""
        z = self.decision_function(X)
        p = expit(z)
        return np.where(np.isfinite(p), p, 0.5)

    def to_arrays(self, prefix: str = "") -> dict[str, np.ndarray]:
        return {
            f"{prefix}coef": self.coef,
            f"{prefix}intercept": np.array([self.intercept]),
            f"{prefix}mean": self.mean,
            f"{prefix}scale": self.scale,
            f"{prefix}l2": np.array([self.l2]),
            f"{prefix}calib": np.array([self.calib_a, self.calib_b]),
        }

    @classmethod
    def from_arrays(cls, z, prefix: str = "") -> "LogisticHead":
        calib = np.asarray(z[f"{prefix}calib"], dtype=np.float64)
        return cls(
            coef=np.asarray(z[f"{prefix}coef"], dtype=np.float64),
            intercept=float(z[f"{prefix}intercept"][0]),
            mean=np.asarray(z[f"{prefix}mean"], dtype=np.float64),
            scale=np.asarray(z[f"{prefix}scale"], dtype=np.float64),
            l2=float(z[f"{prefix}l2"][0]),
            calib_a=float(calib[0]),
            calib_b=float(calib[1]),
        )


def _standardise(X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    mean = X.mean(axis=0)
    scale = X.std(axis=0)
    scale = np.where(scale > 1e-8, scale, 1.0)
    return mean, scale


def fit_logistic(
    X: np.ndarray,
    y: np.ndarray,
    l2: float = 1e-2,
    sample_weight: np.ndarray | None = None,
    max_iter: int = 2000,
    tol: float = 1e-6,
    init: LogisticHead | None = None,
) -> LogisticHead:
    """Fit an L2-regularised logistic regression head.

    ``init`` warm-starts from another head fit on the same rows (an L2 path).

    >>> X = np.array([[0.0], [1.0], [2.0], [3.0]]); y = np.array([0, 0, 1, 1])
    >>> h = fit_logistic(X, y, l2=0.1)
    >>> bool(np.all(np.diff(h.predict_proba(X)) > 0))
    True
    """
    X = np.asarray(X, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64).ravel()
    if X.ndim != 2 or X.shape[0] != y.shape[0]:
        raise ValueError(f"X {X.shape} and y {y.shape} do not match")
    if not np.all((y == 0) | (y == 1)):
        raise ValueError("labels must be 0 or 1")
    if y.min() == y.max():
        raise ValueError("need both classes to fit a head")
    if l2 <= 0:
        raise ValueError("l2 must be > 0")
    n, d = X.shape
    w = np.ones(n) if sample_weight is None else np.asarray(sample_weight, dtype=np.float64)
    w = w / w.sum()
    mean, scale = _standardise(X)
    Z = (X - mean) / scale
    s = 2.0 * y - 1.0  # +-1

    def fun(theta: np.ndarray) -> tuple[float, np.ndarray]:
        coef, b = theta[:d], theta[d]
        m = s * (Z @ coef + b)
        loss = -np.dot(w, log_expit(m)) + 0.5 * l2 * np.dot(coef, coef)
        g = -w * s * expit(-m)
        grad = np.empty(d + 1)
        grad[:d] = Z.T @ g + l2 * coef
        grad[d] = g.sum()
        return float(loss), grad

    theta0 = np.zeros(d + 1)
    if init is not None and init.n_features == d:
        # Warm start (e.g. along an L2 path on the same rows): same standardisation.
        theta0[:d] = init.coef
        theta0[d] = init.intercept
    else:
        p0 = float(np.clip(np.dot(w, y), 1e-6, 1 - 1e-6))
        theta0[d] = np.log(p0 / (1 - p0))
    res = optimize.minimize(
        fun,
        theta0,
        jac=True,
        method="L-BFGS-B",
        options={"maxiter": max_iter, "gtol": tol, "ftol": 1e-12},
    )
    return LogisticHead(
        coef=res.x[:d].copy(),
        intercept=float(res.x[d]),
        mean=mean,
        scale=scale,
        l2=float(l2),
        info={"converged": bool(res.success), "iterations": int(res.nit), "loss": float(res.fun)},
    )


def fit_platt(z: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """Fit ``P = sigmoid(a z + b)`` to scores ``z`` (e.g. out-of-fold logits)."""
    z = np.asarray(z, dtype=np.float64)
    s = 2.0 * np.asarray(y, dtype=np.float64) - 1.0

    def fun(t: np.ndarray) -> tuple[float, np.ndarray]:
        m = s * (t[0] * z + t[1])
        g = -s * expit(-m)
        return float(-log_expit(m).mean()), np.array([np.mean(g * z), np.mean(g)])

    res = optimize.minimize(fun, np.array([1.0, 0.0]), jac=True, method="L-BFGS-B")
    return float(res.x[0]), float(res.x[1])


def roc_auc(y: np.ndarray, score: np.ndarray) -> float:
    """ROC-AUC in the Mann-Whitney form: P(score_pos > score_neg), ties count 1/2.

    >>> roc_auc(np.array([0, 0, 1, 1]), np.array([0.1, 0.4, 0.35, 0.8]))
    0.75
    """
    from scipy.stats import rankdata

    y = np.asarray(y).astype(bool).ravel()
    score = np.asarray(score, dtype=np.float64).ravel()
    n_pos = int(y.sum())
    n_neg = int((~y).sum())
    if n_pos == 0 or n_neg == 0:
        raise ValueError("ROC-AUC needs both positive and negative labels")
    ranks = rankdata(score)
    u = ranks[y].sum() - n_pos * (n_pos + 1) / 2.0
    return float(u / (n_pos * n_neg))
