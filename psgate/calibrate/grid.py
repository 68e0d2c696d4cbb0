"""The calibration grid's pure parts: the request fit's forms, the steps to time and the
held-out rules.

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


def step_grid(cached: list[int], uncached: list[int], decodes: list[int],
              decode_context: list[int]) -> list[tuple[int, int, int, int]]:
    """The batched steps to time, as (P, C, D, x): P new prompt tokens of one request over C
    cached ones, and D decoding requests each attending to x tokens (so K = D * x).

    Three families, in this order: every prefill alone (the cached x uncached grid,
    row-major: one request's chunk, what the per-request model describes), every decode
    batch alone (decodes x decode_context), and mixed steps, which pair prefill point i
    with decode batch i mod (number of decode batches): as many mixed steps as prefill
    points, each prefill size and each decode batch met at least once when there are more
    prefill points than decode batches, without the full four-way product."""
    prefills = [(u, c, 0, 0) for c in cached for u in uncached]
    batches = [(0, 0, d, x) for d in decodes for x in decode_context]
    mixed = [(u, c, d, x) for i, (u, c, _, _) in enumerate(prefills)
             for (_, _, d, x) in [batches[i % len(batches)]]]
    return prefills + batches + mixed


def step_holdout_mask(points: list[tuple[int, int, int, int]]) -> list[bool]:
    """One mixed step in three is held out (the second, fifth, ...): the step model's claim
    is that a mixed batch costs what its parts add up to, and those points test it on
    batches the fit never saw. Steps of one kind only are always fitted; they pin the
    coefficients."""
    mask, k = [], 0
    for p, _, d, _ in points:
        if p and d:
            mask.append(k % 3 == 1)
            k += 1
        else:
            mask.append(False)
    return mask
