"""Calibrating the cost models on real hardware.

    for each step on the grid (a prefill chunk of P new tokens over C cached ones alone,
    D decodes over their contexts alone, or both in one batch):
        time one forward pass over the flattened batch (warm-ups, then interleaved repeats),
        each request attending to its own cached keys and values only, as in a vLLM step
    fit step_ms(P, C, D, K) to the medians (relative least squares, coefficients >= 0)
    fit the per-request prefill_ms(u, c) to the steps of one prefill chunk alone
    report each fit's error on held-out points it never saw

``from_receipt`` fits the step model to a real engine's own timed steps instead (a lockstep
receipt of ``--engine vllm``): nothing is measured, and the per-request model is derived.
``grid`` (the forms, the step grid and the held-out rules) needs nothing, so options are
checked before anything heavy loads; ``fit`` needs numpy; ``measure`` needs torch and
transformers (``psgate[calibrate]``). Only ``psgate calibrate`` imports them, never replay or
``sim``. Of psgate, calibration uses the engines' cost models (what it fits), the workloads
and errors.
"""
