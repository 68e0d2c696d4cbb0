"""What one scheduler step computes: each scheduled request classified once, for every
engine that models or observes steps.

    for each request scheduled in a step, in order (n new tokens, `before` computed):
        decode   if n == 1, it has sampled at least one token and n is its last token
                 -> num_decodes += 1, num_decode_context_tokens += before
        prefill  otherwise (a prompt chunk, or a resumed request's recompute)
                 -> num_prefill_tokens += n, num_context_tokens += before
    a resumed request recomputes what it had computed when preempted, less what it hits

The step scheduler (``sched.py``), vllm-sched (from vLLM's own ``SchedulerOutput``) and
the real-engine observer (around vLLM's ``schedule()``) all tally through
:class:`StepTally`, so the cost model's inputs cannot drift between them. The step
scheduler's two per-step loops live here too: its pass over the running requests
(:func:`schedule_running`) and update_from_output's common case (:func:`computed_until`).
This module is written in Cython's pure-Python mode: ``pip install`` compiles it
(``step_work.pxd`` declares the C fields and signatures), and without a compiler it runs
as plain Python.
"""

try:
    import cython
except ImportError:
    from psgate import cython_shadow as cython

from psgate.engines.step_cost import StepWork


@cython.cclass
class StepTally:
    """The cost model's inputs of one step, tallied request by request."""

    def __init__(self):
        self.num_prefill_tokens = 0
        self.num_context_tokens = 0
        self.num_decodes = 0
        self.num_decode_context_tokens = 0

    def add(self, num_new: cython.longlong, num_before: cython.longlong,
            num_tokens: cython.longlong, num_output: cython.longlong) -> cython.bint:
        """Counts one scheduled request: ``num_new`` tokens after ``num_before`` computed,
        of ``num_tokens``, having sampled ``num_output``. True where it is a decode."""
        if num_new == 1 and num_output >= 1 and num_before == num_tokens - 1:
            self.num_decodes += 1
            self.num_decode_context_tokens += num_before
            return True
        self.num_prefill_tokens += num_new
        self.num_context_tokens += num_before
        return False

    def work(self) -> StepWork:
        return StepWork(self.num_prefill_tokens, self.num_context_tokens, self.num_decodes,
                        self.num_decode_context_tokens)


def recomputed_tokens(num_lost: cython.longlong, num_hit: cython.longlong) -> cython.longlong:
    """What a resumed request computes again: the tokens it had computed when preempted
    (``num_lost``), less those its new lookup hits (never below zero)."""
    return num_lost - num_hit if num_lost > num_hit else 0


def computed_until(scheduled: list, num_new: list, i: cython.Py_ssize_t) -> cython.Py_ssize_t:
    """update_from_output's common case, from ``scheduled[i]`` on: each request's
    ``num_new[j]`` tokens computed, and a token sampled where they caught up (its output
    and its sequence one token longer). Stops at the first request that samples its first
    token or its last now (the engine times and finishes it); returns that index, or
    ``len(scheduled)``."""
    num: cython.Py_ssize_t = len(scheduled)
    computed: cython.longlong
    out: cython.longlong
    while i < num:
        r = scheduled[i]
        computed = r.num_computed + cython.cast(cython.longlong, num_new[i])
        if computed >= r.num_tokens:
            out = r.num_output + 1
            if (out == 1 and r.first_token_ns < 0) or out >= r.max_out:
                return i
            r.num_computed = computed
            r.num_output = out
            r.num_tokens = r.num_tokens + 1
        else:
            r.num_computed = computed
        i += 1
    return num


def schedule_running(eng, allocate, running: list, budget: cython.longlong,
                     thr: cython.longlong, fast: cython.bint, scheduled: list, num_new: list,
                     work: StepTally) -> tuple:
    """The step's pass over the running requests, in order: a decode whose slot is already
    there (``fast``: the engine's ``decode_fast_path``) is scheduled at once; any other
    request gets its (chunked, at most ``thr``) tokens through ``allocate(r, n, None)``,
    preempting from the back of the queue (``eng.preempt``) until they fit. Every request
    scheduled here is appended with its tokens and counted in ``work``. Returns (budget
    left, whether any was preempted)."""
    bs: cython.longlong = eng.bs
    i: cython.Py_ssize_t = 0
    before: cython.longlong
    n: cython.longlong
    preempted: cython.bint = False
    ok: cython.bint = False
    while i < len(running) and budget > 0:
        r = running[i]
        before = r.num_computed
        n = r.num_tokens - before
        if (n == 1 and fast and before // bs < len(r.blocks)    # allocate_slots's fast path
                and (before + 1) // bs <= r.num_cached_blocks):
            scheduled.append(r)              # a decode, the common case
            num_new.append(1)
            budget -= 1
            i += 1
            work.add(1, before, r.num_tokens, r.num_output)
            continue
        if 0 < thr < n:
            n = thr
        if n > budget:
            n = budget
        if n <= 0:
            i += 1
            continue
        while True:
            ok = allocate(r, n, None)
            if ok:
                break
            victim = running.pop()
            eng.preempt(victim, r)
            preempted = True
            if victim is r:
                break
        if not ok:
            break
        scheduled.append(r)
        num_new.append(n)
        budget -= n
        i += 1
        work.add(n, before, r.num_tokens, r.num_output)
    return budget, preempted
