"""Fitting the cost models to measured medians.

Least squares on relative error (each row weighted by 1/measured), because a 2 ms
miss on a 10 ms point matters as much as 20 ms on a 100 ms one. Coefficients are
constrained to be >= 0, which makes the fitted time monotone in every token count;
with at most five terms the constrained optimum (nonnegative least squares) is found
exactly by solving every subset of terms and keeping the best feasible one.

Two models are fitted from one calibration: the step model (psgate/engines/step_cost.py,
one forward pass over a batch) from every measured step, and the per-request prefill model
of the service replay (psgate/engines/cost.py) from the steps that hold one prefill chunk
and nothing else, which are exactly the single-request prefills it describes.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from psgate.calibrate.grid import FORMS
from psgate.engines.step_cost import STEP_COEFFICIENTS

# Term name -> (coefficient field in CostModel, feature of (u, c)).
TERMS = {
    "fixed": ("fixed_ms", lambda u, c: np.ones_like(u)),
    "uncached": ("per_uncached_token_ms", lambda u, c: u),
    "cached": ("per_cached_token_ms", lambda u, c: c),
    "uncached^2": ("per_uncached_token_sq_ms", lambda u, c: u * u),
    "uncached*cached": ("per_uncached_cached_token_ms", lambda u, c: u * c),
}


def nonnegative_relative_lstsq(X, y) -> np.ndarray:
    """argmin ||(X b - y) / y|| subject to b >= 0, exactly, for a handful of columns."""
    X = np.asarray(X, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    if X.ndim != 2 or len(y) != X.shape[0]:
        raise ValueError("one measurement per row of features")
    if len(y) < X.shape[1] or np.any(y <= 0):
        raise ValueError("need at least one positive measurement per fitted term")
    # Rows scaled by 1/y (relative error); columns scaled to unit max for conditioning.
    Xr = X / y[:, None]
    scale = np.abs(Xr).max(axis=0)
    scale[scale == 0] = 1.0
    Xs = Xr / scale
    target = np.ones_like(y)
    n = X.shape[1]
    best, best_sse = None, np.inf
    for k in range(1, n + 1):
        for subset in itertools.combinations(range(n), k):
            cols = list(subset)
            beta, *_ = np.linalg.lstsq(Xs[:, cols], target, rcond=None)
            if np.any(beta < 0):
                continue
            sse = float(np.sum((Xs[:, cols] @ beta - target) ** 2))
            if sse < best_sse - 1e-15:
                full = np.zeros(n)
                full[cols] = beta
                best, best_sse = full, sse
    if best is None:  # cannot happen: a nonzero column alone fits with a positive beta
        raise ValueError("no nonnegative fit exists")
    return best / scale


@dataclass(frozen=True)
class Fit:
    form: str
    coefficients: dict[str, float]   # CostModel field -> ms (every prefill field present)

    def predict(self, uncached, cached):
        u = np.asarray(uncached, dtype=np.float64)
        c = np.asarray(cached, dtype=np.float64)
        total = np.zeros(np.broadcast(u, c).shape)
        for term, (name, feature) in TERMS.items():
            total = total + self.coefficients[name] * feature(u, c)
        return total


def fit_prefill(uncached, cached, median_ms, form: str = "attention") -> Fit:
    """The nonnegative relative-least-squares fit of ``form`` to the points."""
    if form not in FORMS:
        raise ValueError(f"unknown form {form!r}; known: {', '.join(FORMS)}")
    u = np.asarray(uncached, dtype=np.float64)
    c = np.asarray(cached, dtype=np.float64)
    names = FORMS[form]
    X = np.stack([TERMS[t][1](u, c) for t in names], axis=1)
    coef = nonnegative_relative_lstsq(X, median_ms)
    coefficients = {name: 0.0 for name, _ in TERMS.values()}
    for t, v in zip(names, coef):
        coefficients[TERMS[t][0]] = float(v)
    return Fit(form, coefficients)


def relative_errors(fit, *columns) -> np.ndarray:
    """|predicted - measured| / measured; ``columns`` are the fit's inputs, then the medians."""
    y = np.asarray(columns[-1], dtype=np.float64)
    return np.abs(fit.predict(*columns[:-1]) - y) / y


@dataclass(frozen=True)
class StepFit:
    coefficients: dict[str, float]   # StepCostModel field -> ms, in STEP_COEFFICIENTS order

    def predict(self, prefill, context, decodes, decode_context):
        cols = step_features(prefill, context, decodes, decode_context)
        return cols @ np.array([self.coefficients[k] for k in STEP_COEFFICIENTS])


def step_features(prefill, context, decodes, decode_context) -> np.ndarray:
    """The step model's design matrix: one row per step, columns in STEP_COEFFICIENTS order
    (1, P, C, D, K)."""
    cols = [np.asarray(v, dtype=np.float64) for v in (prefill, context, decodes, decode_context)]
    return np.stack([np.ones_like(cols[0]), *cols], axis=1)


def fit_step(prefill, context, decodes, decode_context, median_ms) -> StepFit:
    """The nonnegative relative-least-squares fit of step_ms(P, C, D, K) to the points."""
    coef = nonnegative_relative_lstsq(step_features(prefill, context, decodes, decode_context),
                                      median_ms)
    return StepFit({k: float(v) for k, v in zip(STEP_COEFFICIENTS, coef)})
