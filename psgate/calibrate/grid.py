"""The calibration grid's pure parts: the fit's forms and the held-out rule.

No numpy here, so options are checked (exit 2) before anything heavy is imported.
"""

from __future__ import annotations

import itertools

FORMS = {
    "linear": ("fixed", "uncached", "cached"),
    "attention": ("fixed", "uncached", "cached", "uncached^2", "uncached*cached"),
}


def holdout_mask(cached: list[int], uncached: list[int]) -> list[bool]:
    """Which points of a cached x uncached grid (row-major) are held out: (i, j) with
    (i * n_u + j + i) % 4 == 2, a diagonal pattern that holds out about one point in four
    and a different column in each row, skipping the grid's four corners so the fit spans
    the whole range (on a grid too small for the pattern, the inner point nearest the
    middle). Deterministic, and independent of the timings."""
    n_c, n_u = len(cached), len(uncached)
    corners = {(0, 0), (0, n_u - 1), (n_c - 1, 0), (n_c - 1, n_u - 1)}
    cells = list(itertools.product(range(n_c), range(n_u)))
    mask = [(i * n_u + j + i) % 4 == 2 and (i, j) not in corners for i, j in cells]
    if not any(mask):   # a small grid: hold out the inner point nearest the middle
        inner = [k for k, cell in enumerate(cells) if cell not in corners]
        if inner:
            mid = ((n_c - 1) / 2, (n_u - 1) / 2)
            k = min(inner, key=lambda k: (abs(cells[k][0] - mid[0]) + abs(cells[k][1] - mid[1]), k))
            mask[k] = True
    return mask
