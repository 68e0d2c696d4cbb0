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
scheduler's per-step work lives here too: its pass over the running requests
(:func:`schedule_running`), vLLM's ``allocate_slots`` for one request
(:func:`allocate_slots`) and update_from_output's common case (:func:`computed_until`).
This module is written in Cython's pure-Python mode: ``pip install`` compiles it
(``step_work.pxd`` declares the C fields and signatures), and without a compiler it runs
as plain Python.
"""

try:
    import cython
except ImportError:
    from psgate import cython_shadow as cython

from psgate.engines.step_cost import StepWork
from psgate.trace.keys import KEY_SHIFT, OUTPUT_KEY_BIT

if not cython.compiled:     # compiled, step_work.pxd cimports them
    from psgate.engines.pool_work import cache_blocks, check_batch, get_new_blocks, take_hits
    from psgate.flat import ints

# A step request's states (vLLM's RequestStatus, as far as the scheduler tells them apart).
WAITING = 1
RUNNING = 2
PREEMPTED = 3


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


def allocate_slots(eng, r, num_new_tokens: cython.longlong, hits) -> cython.bint:
    """vLLM's ``KVCacheManager.allocate_slots`` for ``num_new_tokens`` more tokens of the
    step engine ``eng``'s request ``r``; ``hits`` is the lookup of a request scheduled from
    the waiting queue, None for a running one. False, with nothing changed, when the
    blocks are not there. Otherwise one allocation batch: the hits taken, the new blocks
    allocated (evicting), the blocks filled now cached, the batch checked and recorded.

        a waiting or preempted request: its whole sequence must fit beside the hits'
            candidates and the watermark (scheduler_reserve_full_isl)
        num_new = blocks for computed + hits + new tokens, less the blocks held
        num_new + hits that are candidates + watermark must fit in free + candidates
    """
    running: cython.int = RUNNING
    bs: cython.longlong = eng.bs
    blocks: list = r.blocks
    num_computed: cython.longlong = r.num_computed
    num_tokens: cython.longlong = r.num_tokens
    status: cython.int = r.status
    need_slot: cython.longlong
    if hits is None:        # running: most steps are a decode that needs nothing new
        need_slot = num_computed + num_new_tokens
        if ((need_slot + bs - 1) // bs <= len(blocks)
                and min(need_slot, num_tokens) // bs <= r.num_cached_blocks):
            return True
        hits = []
    num_hits: cython.Py_ssize_t = len(hits)
    num_blocks: cython.Py_ssize_t = len(eng.ref)
    ref: cython.p_int = ints(eng.ref)
    evictable: cython.longlong = 0
    i: cython.Py_ssize_t
    b: cython.Py_ssize_t
    for i in range(num_hits):
        b = hits[i]
        if not 0 <= b < num_blocks:
            raise IndexError(f"hit block {b} is outside the pool of {num_blocks}")
        if ref[b] == 0:
            evictable += 1
    num_free: cython.longlong = len(eng.free) + eng.policy.num_candidates
    watermark: cython.longlong = 0
    if status != running and eng.running:
        watermark = eng.watermark_blocks
    num_held: cython.longlong = len(blocks) + num_hits
    num_new: cython.longlong
    if status != running:
        num_new = (num_tokens + bs - 1) // bs - num_held
        if max(num_new, 0) + evictable + watermark > num_free:
            return False
    need_slot = num_computed + num_hits * bs + num_new_tokens
    num_new = max((need_slot + bs - 1) // bs - num_held, 0)
    if num_new + evictable + watermark > num_free:
        return False
    num_full: cython.longlong = min(need_slot, num_tokens) // bs
    if not (num_hits or num_new or num_full > r.num_cached_blocks):
        return True         # nothing to take, allocate or cache: no batch at all
    now = eng.now
    preq = r.preq
    open_batch(eng, preq)
    if num_hits:
        take_hits(eng, r, hits)
        blocks.extend(hits)
        r.num_cached_blocks = num_hits
    new: list = []
    if num_new:
        new = get_new_blocks(eng, r, num_new)
        blocks.extend(new)
    cached_now: list = []
    recompute: cython.longlong = 0
    num_cached: cython.longlong = r.num_cached_blocks
    if num_full > num_cached:
        preq.num_new_full_blocks = num_full - num_cached
        recompute = cache_blocks(eng, blocks, r.chain, num_cached, num_full, r.ns, bs,
                                 cached_now, eng.on_cached_fn, preq)
        r.num_cached_blocks = num_full
    note = close_batch(eng, r, recompute)
    check_allocation(eng, r, hits, new, cached_now)
    if eng.records:
        eng.recorder.admission(now, preq, num_hits, len(new), preq.num_new_full_blocks, note)
    if num_hits and eng.records_hits:
        eng.record_hits(r, hits)
    return True


# An allocation batch's steps, as the step engine's methods (StepSimEngine binds these;
# the hybrid engine's allocate_slots calls them too).

def open_batch(eng, preq) -> cython.void:
    """An allocation batch begins: nothing cached by it yet; the policy's on_admit."""
    preq.num_new_full_blocks = 0
    if eng.on_admit_fn is not None:
        eng.on_admit_fn(preq, eng.now)


def close_batch(eng, r, recompute: cython.longlong):
    """An allocation batch ends: the policy's end_admit note for the ledger row, and
    trace content the request computes again at its first scheduling."""
    preq = r.preq
    note = eng.end_admit_fn(preq, eng.now) if eng.end_admit_fn is not None else None
    if r.status == PREEMPTED:
        # A resumed request's lookup: the ledger marks it, as a request's first row
        # needs no mark, so that explain knows its hits are a new lookup.
        note = {**(note or {}), "resumed": True}
    if recompute and not r.started:
        r.outcome.recompute_tokens += recompute
    return note


def check_allocation(eng, r, hits, new, cached_now) -> cython.void:
    """check_batch, with the keys a step request's hits must hold: its chain's trace
    hashes in its namespace, and past them its own output blocks."""
    shift: cython.int = KEY_SHIFT
    out_bit: cython.longlong = OUTPUT_KEY_BIT
    evb: list = r.chain
    num_chain: cython.Py_ssize_t = len(evb)
    num_hits: cython.Py_ssize_t = len(hits)
    base: cython.longlong = cython.cast(cython.longlong, r.ns) << shift
    index: cython.longlong = -1
    pos: cython.Py_ssize_t
    h: cython.longlong
    keys: list = []
    for pos in range(num_hits):
        if pos < num_chain:
            h = evb[pos]
            keys.append(base | h)
        else:                       # trace.keys.output_key
            if index < 0:
                index = r.preq.index
            keys.append(out_bit | (index << 24) | pos)
    check_batch(eng, r, keys, hits, (r.num_tokens - 1) // eng.bs, new, cached_now,
                r.preq.num_new_full_blocks)
