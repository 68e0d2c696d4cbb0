"""Calibrating the prefill cost model on real hardware.

    for each (cached c, new u) on the grid:
        compute the KV of a c-token prefix once
        time a forward pass of u new tokens over that prefix (warm-ups, then repeats),
        cropping the cache back to c after each pass, as a prefix-cache hit reuses it
    time one-token decode steps at a few context lengths
    fit prefill_ms(u, c) to the medians (relative least squares, coefficients >= 0)
    report the error on held-out grid points the fit never saw

``grid`` (the forms and the held-out rule) needs nothing, so options are checked before
anything heavy loads; ``fit`` needs numpy; ``measure`` needs torch and transformers
(``psgate[calibrate]``). Only ``psgate calibrate`` imports them, never replay or ``sim``.
Of psgate, calibration uses the engines' cost model (what it fits), the workloads and errors.
"""
