"""Fitting the cost model's prefill function to measured medians.

Least squares on relative error (each row weighted by 1/measured), because a 2 ms
miss on a 10 ms point matters as much as 20 ms on a 100 ms one. Coefficients are
constrained to be >= 0, which makes the fitted time monotone in both uncached and
cached tokens; with at most five terms the constrained optimum is found exactly by
solving every subset of terms and keeping the best feasible one.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from psgate.calibrate.grid import FORMS

# Term name -> (coefficient field in CostModel, feature of (u, c)).
TERMS = {
    "fixed": ("fixed_ms", lambda u, c: np.ones_like(u)),
    "uncached": ("per_uncached_token_ms", lambda u, c: u),
    "cached": ("per_cached_token_ms", lambda u, c: c),
    "uncached^2": ("per_uncached_token_sq_ms", lambda u, c: u * u),
    "uncached*cached": ("per_uncached_cached_token_ms", lambda u, c: u * c),
}


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
    y = np.asarray(median_ms, dtype=np.float64)
    if len(y) < len(FORMS[form]) or np.any(y <= 0):
        raise ValueError("need at least one positive measurement per fitted term")
    names = FORMS[form]
    # Rows scaled by 1/y (relative error); columns scaled to unit max for conditioning.
    X = np.stack([TERMS[t][1](u, c) for t in names], axis=1) / y[:, None]
    scale = np.abs(X).max(axis=0)
    scale[scale == 0] = 1.0
    Xs = X / scale
    target = np.ones_like(y)
    best, best_sse = None, np.inf
    for k in range(1, len(names) + 1):
        for subset in itertools.combinations(range(len(names)), k):
            cols = list(subset)
            beta, *_ = np.linalg.lstsq(Xs[:, cols], target, rcond=None)
            if np.any(beta < 0):
                continue
            sse = float(np.sum((Xs[:, cols] @ beta - target) ** 2))
            if sse < best_sse - 1e-15:
                full = np.zeros(len(names))
                full[cols] = beta
                best, best_sse = full, sse
    if best is None:  # cannot happen: a single positive column always fits with beta > 0
        raise ValueError("no nonnegative fit exists")
    coef = best / scale
    coefficients = {name: 0.0 for name, _ in TERMS.values()}
    for t, v in zip(names, coef):
        coefficients[TERMS[t][0]] = float(v)
    return Fit(form, coefficients)


def relative_errors(fit: Fit, uncached, cached, median_ms) -> np.ndarray:
    y = np.asarray(median_ms, dtype=np.float64)
    return np.abs(fit.predict(uncached, cached) - y) / y
