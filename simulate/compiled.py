"""Compiled fast path for the token-budget engine baselines (vLLM-like, SGLang-like) on many groups.

The event engine (:mod:`simulate.engine` with :mod:`simulate.baselines`) spends 20-30 us of Python
per event; the baselines need an event per distinct finish, per block exhaustion and, for the
SGLang-like model, per admission as its reservation ratio decays. :func:`engine_many` runs the
same decisions as the engine, event for event, compiled with Numba and spread over groups on
every thread (``numba.set_num_threads`` caps them). Its results equal the engine's (the tests
check steps, peak KV, preemptions, recomputed and decoded tokens, most live rows on random
groups); the engine stays the reference and the only path with timelines.

Without Numba installed the same functions run as plain Python (correct, slow). The first call
compiles (a few seconds; cached on disk afterwards where the package directory is writable).
"""

from __future__ import annotations

import math

import numpy as np

from lengthsched import InvalidArgument
from lengthsched.errors import check_int
from lengthsched.runtime import POLICIES, SGLangLike, SimulationError, VLLMLike
from lengthsched.runtime.timing import DEFAULT_PREFILL_CHUNK, default_cost, prompt_prefill_seconds

try:  # numba is in the `simulate` extra; without it the kernels run as Python
    from numba import njit, prange
    HAVE_NUMBA = True
except ImportError:  # pragma: no cover - exercised where numba is absent
    HAVE_NUMBA = False
    prange = range

    def njit(*args, **kwargs):
        if args and callable(args[0]):
            return args[0]
        return lambda f: f

__all__ = ["COMPILED_POLICIES", "HAVE_NUMBA", "engine_many"]

COMPILED_POLICIES = tuple(n for n, spec in POLICIES.items() if spec.compiled)  # vllm, sglang

# Per-group outputs, in this column order; "events" counts the rows of the step log (runs of steps).
_FIELDS = ("steps", "peak_kv", "preemptions", "recomputed_tokens", "decoded_tokens", "max_live", "events")
_OK, _OVER_BUDGET, _STUCK = 0, 1, 2


@njit(cache=True)
def _remove(order, nlive, job):
    """Drop ``job`` from the admission-ordered live list; returns the new count."""
    k = 0
    while order[k] != job:
        k += 1
    for i in range(k, nlive - 1):
        order[i] = order[i + 1]
    return nlive - 1


@njit(cache=True)
def _blocks(order, nlive, tail, origin, at, b):
    """KV blocks live sequences hold at the end of step ``at`` (ceil((tail + age) / b) each)."""
    total = 0
    for i in range(nlive):
        j = order[i]
        total += (tail[j] + at - origin[j] + b - 1) // b
    return total


@njit(cache=True)
def _finish(order, nlive, length, origin, run_start, t, counters):
    """Remove the sequences that finish at step ``t``; returns the new live count and the sum of
    their origins (Engine._advance)."""
    freed = 0
    i = 0
    while i < nlive:
        j = order[i]
        if origin[j] + length[j] == t:
            counters[4] += t - run_start[j] + 1  # decoded tokens
            freed += origin[j]
            nlive = _remove(order, nlive, j)
        else:
            i += 1
    return nlive, freed


@njit(cache=True)
def _state(n):
    """Per-completion arrays: tokens done before the current run, origin (t - age), first step of
    the current run, the live list in admission order, and the waiting queue as a stack (its front
    is its end; preempted completions are pushed back on the front)."""
    waiting = np.empty(n, dtype=np.int64)
    for i in range(n):
        waiting[i] = n - 1 - i
    return (np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.int64),
            np.empty(n, dtype=np.int64), waiting)


@njit(cache=True)
def _admit(job, t, done, origin, run_start, order, nlive, counters):
    """Start or resume ``job`` at step t + 1 (Engine.admit); returns the new live count."""
    origin[job] = t - done[job]
    counters[3] += done[job]  # recomputed tokens
    run_start[job] = t + 1
    order[nlive] = job
    nlive += 1
    counters[5] = max(counters[5], nlive)
    return nlive


@njit(cache=True)
def _preempt(job, t, done, origin, run_start, counters):
    """Drop ``job``'s KV, keeping its tokens (Engine.preempt); the caller removes it from the list."""
    done[job] = t - origin[job]
    counters[4] += t - run_start[job] + 1
    counters[2] += 1


@njit(cache=True)
def _log_run(log, counters, t, t_next, order, nlive, origin, ctx, pf, pfc):
    """Record the run of steps t + 1 .. t_next (Engine.advance's StepLog row) when ``log`` has room
    (the first pass only counts them)."""
    k = counters[6]
    if k < log.shape[0]:
        ages = 0  # tokens the rows attend besides their prompts at step t + 1 (their earlier ones)
        for i in range(nlive):
            ages += t - origin[order[i]]
        log[k, 0] = t_next - t
        log[k, 1] = nlive
        log[k, 2] = ages + nlive * ctx
        log[k, 3] = pf
        log[k, 4] = pfc
    counters[6] = k + 1


@njit(cache=True)
def _next_finish(order, nlive, length, origin):
    best = -1
    for i in range(nlive):
        j = order[i]
        f = origin[j] + length[j]
        if best < 0 or f < best:
            best = f
    return best


@njit(cache=True)
def _vllm_group(length, tail_len, ctx, budget, total_blocks, b, cap, chunk, counters, log):
    """One group under the vLLM-like policy (lengthsched.runtime.baselines.VLLMLike); fills
    ``counters`` (steps, peak KV tokens, preemptions, recomputed, decoded, most live, log rows),
    writes the step log into ``log`` when it has room, and returns a status. ``ctx``: prompt
    tokens each row attends; ``chunk``: most tokens prefilled in a step (0: no limit)."""
    n = length.shape[0]
    tail = np.full(n, tail_len, dtype=np.int64)
    done, origin, run_start, order, waiting = _state(n)
    res = np.zeros(b, dtype=np.int64)
    wtop, nlive, t = n, 0, 0
    while True:
        # decide (VLLMLike.decide)
        nxt = t + 1
        used = _blocks(order, nlive, tail, origin, nxt, b)
        while used > total_blocks:  # preempt the newest
            job = order[nlive - 1]
            _preempt(job, t, done, origin, run_start, counters)
            nlive -= 1
            waiting[wtop] = job
            wtop += 1
            used = _blocks(order, nlive, tail, origin, nxt, b)
        pf, pfc, blocked = 0, 0, False
        while wtop > 0 and nlive < cap:
            job = waiting[wtop - 1]
            need = (tail[job] + done[job] + 1 + b - 1) // b
            if used + need > total_blocks:
                break
            p = tail[job] + done[job]  # Engine.can_prefill
            if p > 0 and chunk > 0 and pf > 0 and pf + p > chunk:
                blocked = True
                break
            wtop -= 1
            used += need
            pf += p
            pfc += p * (ctx - tail[job]) + p * (p + 1) // 2
            nlive = _admit(job, t, done, origin, run_start, order, nlive, counters)
        if nlive == 0:
            counters[0] = t
            return _STUCK if wtop > 0 else _OK
        # wakeup (VLLMLike.wakeup): the last step before the blocks run out
        free = total_blocks - _blocks(order, nlive, tail, origin, t, b)
        rounds = free // nlive
        extra = free - rounds * nlive
        res[:] = 0
        for i in range(nlive):
            j = order[i]
            res[(tail[j] - origin[j]) % b] += 1
        wake = -1
        for s in range(1, b + 1):
            count = res[(-(t + s - 1)) % b]
            if count:
                if extra < count:
                    wake = t + max(1, rounds * b + s - 1)
                    break
                extra -= count
        t_next = _next_finish(order, nlive, length, origin)
        if wake >= 0 and wake < t_next:
            t_next = wake
        if blocked:  # admissions wait for the next step's prefill budget
            t_next = t + 1
        # advance
        _log_run(log, counters, t, t_next, order, nlive, origin, ctx, pf, pfc)
        t = t_next
        kv = b * _blocks(order, nlive, tail, origin, t, b)
        counters[1] = max(counters[1], kv)
        if kv > budget:
            counters[0] = t
            return _OVER_BUDGET
        nlive, _ = _finish(order, nlive, length, origin, run_start, t, counters)


@njit(cache=True)
def _admission_delay(used, left, n, need, horizon, start_ratio, lmax, rmin, decay, budget):
    """SGLangLike.admission_delay, the same float operations in the same order; -1 for None."""
    fixed = used + need + (lmax - need)
    rest = left
    if start_ratio > rmin:
        last_decay = int((start_ratio - rmin) / decay)
    else:
        last_decay = 0
    best = -1
    if last_decay >= 1:
        a = decay * n
        bb = n * (1 - start_ratio) - decay * rest
        c = fixed + start_ratio * rest - budget
        disc = bb * bb - 4 * a * c
        if disc >= 0:
            low = (-bb - math.sqrt(disc)) / (2 * a)
            high = (-bb + math.sqrt(disc)) / (2 * a)
            d = max(1, int(math.ceil(low)))
            if d <= min(high, float(last_decay)):
                best = d
    if best < 0:
        d = last_decay + 1
        if fixed + n * d + max(rmin, start_ratio - decay * d) * (rest - n * d) <= budget:
            best = d
    if best >= 0:
        while best > 1 and (fixed + n * (best - 1)
                            + max(rmin, start_ratio - decay * (best - 1)) * (rest - n * (best - 1))) <= budget:
            best -= 1
        while best <= horizon and (fixed + n * best
                                   + max(rmin, start_ratio - decay * best) * (rest - n * best)) > budget:
            best += 1
    if best >= 0 and best <= horizon:
        return best
    return -1


@njit(cache=True)
def _sglang_group(length, ctx, budget, lmax, cap, chunk, init_ratio, rmin, decay, retract_steps, clip, counters,
                  log):
    """One group under the SGLang-like policy (lengthsched.runtime.baselines.SGLangLike); token-granular
    KV; arguments and outputs as :func:`_vllm_group`."""
    n = length.shape[0]
    done, origin, run_start, order, waiting = _state(n)
    keys = np.empty(n, dtype=np.int64)
    wtop, nlive, t, sum_origin = n, 0, 0, 0
    ratio0, t0 = init_ratio, 0
    max_new = min(lmax, budget - 2 - ctx)  # SGLangLike._max_new
    linear = lmax - 1 <= clip and lmax <= budget - 2 - ctx  # SGLangLike._linear
    while True:
        # decide (SGLangLike.decide)
        nxt = t + 1
        used = nlive * nxt - sum_origin
        if used > budget:
            for i in range(nlive):  # by progress: (age, job) ascending
                j = order[i]
                keys[i] = (t - origin[j]) * n + j
            by_progress = np.sort(keys[:nlive])
            k = 0
            while k < by_progress.shape[0] and used > budget:
                job = by_progress[k] % n
                k += 1
                _preempt(job, t, done, origin, run_start, counters)
                sum_origin -= origin[job]
                nlive = _remove(order, nlive, job)
                waiting[wtop] = job
                wtop += 1
                used = nlive * nxt - sum_origin
            if nlive > 0:
                ratio0 = min(1.0, (nlive * t - sum_origin + retract_steps * nlive) / (nlive * lmax))
                t0 = t
        ratio = max(rmin, ratio0 - decay * (t - t0))
        if linear:
            reserved = ratio * (nlive * (lmax - 1) - (nlive * t - sum_origin))
        else:  # each running request's remaining max_new_tokens clipped (SGLangLike._remaining)
            left_clipped = 0
            for i in range(nlive):
                left_clipped += max(min(max_new - (t - origin[order[i]]), clip) - 1, 0)
            reserved = ratio * left_clipped
        pf, pfc, blocked = 0, 0, False
        while wtop > 0 and nlive < cap:
            job = waiting[wtop - 1]
            need = done[job] + 1
            hold = max(min(max_new - done[job], clip) - 1, 0)  # the new one's remaining max_new_tokens, whole
            if used + need + reserved + hold > budget:
                break
            p = done[job]  # Engine.can_prefill (no prompt tail: token-granular KV)
            if p > 0 and chunk > 0 and pf > 0 and pf + p > chunk:
                blocked = True
                break
            pf += p
            pfc += p * ctx + p * (p + 1) // 2
            used += need
            reserved += hold
            wtop -= 1
            nlive = _admit(job, t, done, origin, run_start, order, nlive, counters)
            sum_origin += origin[job]
        if nlive == 0:
            counters[0] = t
            return _STUCK if wtop > 0 else _OK
        # wakeup (SGLangLike.wakeup)
        kv_now = nlive * t - sum_origin
        overflow = t + max(1, (budget - kv_now) // nlive)
        wake = overflow
        nf = _next_finish(order, nlive, length, origin)
        if wtop > 0 and nlive < cap and not linear:  # clipped reservations: decide every step
            wake = min(overflow, t + 1)
        elif wtop > 0 and nlive < cap:
            horizon = min(overflow, nf) - t
            if horizon >= 1:  # ``ratio`` is still the ratio at step t: nothing changed it since decide
                delay = _admission_delay(nlive * (t + 1) - sum_origin, nlive * (lmax - 1) - kv_now, nlive,
                                         done[waiting[wtop - 1]] + 1, horizon, ratio, lmax, rmin, decay, budget)
                if delay >= 0:
                    wake = t + delay
        t_next = min(nf, wake)
        if blocked:
            t_next = t + 1
        # advance
        _log_run(log, counters, t, t_next, order, nlive, origin, ctx, pf, pfc)
        t = t_next
        kv = nlive * t - sum_origin
        counters[1] = max(counters[1], kv)
        if kv > budget:
            counters[0] = t
            return _OVER_BUDGET
        nlive, freed = _finish(order, nlive, length, origin, run_start, t, counters)
        sum_origin -= freed


@njit(cache=True, parallel=True)
def _vllm_many(lengths, tails, ctx, budget, total_blocks, b, cap, chunk, out, status, logs, offsets):
    for g in prange(lengths.shape[0]):
        status[g] = _vllm_group(lengths[g], tails[g], ctx[g], budget, total_blocks, b, cap, chunk, out[g],
                                logs[offsets[g]:offsets[g + 1]])


@njit(cache=True, parallel=True)
def _sglang_many(lengths, ctx, budget, lmax, cap, chunk, init_ratio, rmin, decay, retract_steps, clip, out, status,
                 logs, offsets):
    for g in prange(lengths.shape[0]):
        status[g] = _sglang_group(lengths[g], ctx[g], budget, lmax, cap, chunk, init_ratio, rmin, decay,
                                  retract_steps, clip, out[g], logs[offsets[g]:offsets[g + 1]])


def engine_many(lengths, policy: str, *, budget_tokens: int, max_new_tokens: int, prompt_lens=None,
                slots: int | None = None, cost=None, prefill_chunk: int | None = DEFAULT_PREFILL_CHUNK,
                seconds: bool = True) -> dict[str, np.ndarray]:
    """Simulate B groups of G completions under an engine baseline, as ``run_group`` would one by one.

    ``lengths``: (B, G) true lengths in tokens; ``policy``: "vllm" or "sglang"; ``budget_tokens``:
    KV tokens beyond the shared prompt; ``prompt_lens``: (B,) prompt tokens per group (vLLM copies
    each prompt's partial last block into every sequence; every decode row reads its prompt);
    ``slots``: most sequences decoding at once (default: no cap); ``prefill_chunk``: most tokens
    prefilled in one step (None: no limit). Returns arrays of length B: ``steps`` (decode steps),
    ``peak_kv`` (tokens, block rounded for vLLM), ``preemptions``, ``recomputed_tokens``,
    ``decoded_tokens``, ``max_live``, ``events`` (runs of steps in the step log) and, with
    ``seconds``, ``seconds``: the modelled seconds under ``cost`` (a ``lengthsched.cost.StepCost``;
    default Qwen3-1.7B on the H100 preset), equal to ``run_group``'s. Seconds take a second pass that
    writes every group's step log (the first one counts its rows). Raises what ``run_group`` raises
    for the same inputs.
    """
    if policy not in COMPILED_POLICIES:
        raise InvalidArgument("policy", policy, "one of " + ", ".join(COMPILED_POLICIES))
    arr = np.asarray(lengths)
    if arr.ndim != 2 or arr.shape[0] < 1 or arr.shape[1] < 1 or not np.issubdtype(arr.dtype, np.integer):
        raise InvalidArgument("lengths", lengths, "a non-empty (groups, G) array of integer lengths in tokens")
    arr = np.ascontiguousarray(arr, dtype=np.int64)
    if arr.min() < 1:
        raise InvalidArgument("lengths", lengths, "lengths >= 1 token")
    lmax = check_int("max_new_tokens", max_new_tokens, minimum=1)
    budget = check_int("budget_tokens", budget_tokens, minimum=1)
    longest = int(arr.max())
    if longest > lmax:
        raise InvalidArgument("lengths", lengths, f"lengths <= max_new_tokens={lmax} (one has {longest})")
    if longest > budget:
        raise InvalidArgument("budget_tokens", budget, f"at least the longest completion ({longest} tokens)")
    batch, size = arr.shape
    cap = size if slots is None else check_int("slots", slots, minimum=1)
    chunk = 0 if prefill_chunk is None else check_int("prefill_chunk", prefill_chunk, minimum=1)
    prompts = np.zeros(batch, dtype=np.int64) if prompt_lens is None else np.asarray(prompt_lens, dtype=np.int64)
    if prompts.shape != (batch,) or (prompts < 0).any():
        raise InvalidArgument("prompt_lens", prompt_lens, f"{batch} prompt lengths >= 0, one per group")
    if policy == "vllm":
        b = VLLMLike.block_size
        tails = prompts % b
        blocks = budget // b
        need = int((-(-(tails[:, None] + arr) // b)).max())
        if need > blocks:
            raise InvalidArgument("budget_tokens", budget,
                                  f"at least {need * b} for policy 'vllm' (the longest completion "
                                  f"plus its prompt's partial block, in blocks of 16)")

        def run(logs, offsets):
            _vllm_many(arr, tails, prompts, budget, blocks, b, cap, chunk, out, status, logs, offsets)
    else:
        p = SGLangLike
        decay = (p.init_ratio - p.min_ratio) / p.decay_steps

        def run(logs, offsets):
            _sglang_many(arr, prompts, budget, lmax, cap, chunk, p.init_ratio, p.min_ratio, decay, p.retract_steps,
                         p.clip_tokens,
                         out, status, logs, offsets)

    out = np.zeros((batch, len(_FIELDS)), dtype=np.int64)
    status = np.zeros(batch, dtype=np.int64)
    run(np.zeros((0, 5), dtype=np.int64), np.zeros(batch + 1, dtype=np.int64))  # counts the step log's rows
    bad = np.flatnonzero(status)
    if bad.size:
        g = int(bad[0])
        why = "KV above the budget" if status[g] == _OVER_BUDGET else "nothing live and nothing admitted"
        raise SimulationError(f"{policy}: {why} at step {int(out[g, 0])} in group {g} "
                              f"(budget_tokens={budget}, max_new_tokens={lmax})")
    result = {name: out[:, i].copy() for i, name in enumerate(_FIELDS)}
    if seconds:
        offsets = np.concatenate(([0], np.cumsum(result["events"])))
        logs = np.zeros((int(offsets[-1]), 5), dtype=np.int64)
        out[:] = 0
        run(logs, offsets)
        cost = default_cost() if cost is None else cost
        priced = np.asarray(cost.segment_seconds(*logs.T), dtype=np.float64)
        result["seconds"] = np.add.reduceat(priced, offsets[:-1]) + prompt_prefill_seconds(cost, prompts, prefill_chunk)
    return result
