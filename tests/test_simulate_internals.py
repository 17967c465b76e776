"""The closed forms inside the policies against brute force: growth-aware earliest start, SGLang's
admission under a decaying ratio, the engine's O(block) KV accounting."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from lengthsched.runtime.baselines import SGLangLike
from lengthsched.runtime.engine import Engine
from lengthsched.runtime.policies import GrowthAware, Problem


def brute_delay(ages, remaining, start, left, budget):
    if start + left > budget:
        return None
    horizon = max(remaining, default=0)
    for d in range(horizon + 1):
        ok = True
        for u in range(d + 1, d + left + 1):
            live = sum(a + u for a, r in zip(ages, remaining) if r >= u)
            if live + start + u - d > budget:
                ok = False
                break
        if ok:
            return d
    return None


@given(live=st.lists(st.tuples(st.integers(0, 40), st.integers(1, 40)), max_size=6),
       start=st.integers(0, 10), left=st.integers(1, 40), budget=st.integers(20, 200))
def test_growth_aware_delay_matches_brute_force(live, start, left, budget):
    ages = [a for a, _ in live]
    remaining = [r for _, r in live]
    policy = GrowthAware(Problem(lengths=np.ones(len(live) + 1, dtype=np.int64), max_new_tokens=100,
                                 budget_tokens=budget))
    policy.total = [a + r for a, r in live] + [start + left]
    job = len(live)
    eng = SimpleNamespace(running={j: None for j in range(len(live))}, age=lambda j: ages[j],
                          done=[0] * len(live) + [start])
    assert policy.delay(eng, job) == brute_delay(ages, remaining, start, left, budget)


@given(used=st.integers(0, 3000), n=st.integers(1, 20), need=st.integers(1, 200), horizon=st.integers(1, 2000),
       ratio=st.floats(0.1, 1.0), spare=st.integers(0, 5000))
def test_sglang_admission_delay_matches_brute_force(used, n, need, horizon, ratio, spare):
    lmax = 1024
    policy = SGLangLike(Problem(lengths=np.ones(4, dtype=np.int64), max_new_tokens=lmax, budget_tokens=8192))
    left = n * (lmax - 1) - spare // 2

    def total(d):
        r = max(policy.min_ratio, ratio - policy.decay * d)
        return used + need + (lmax - need) + n * d + r * (left - n * d)  # the head's whole, the live ones' ratio

    expected = next((d for d in range(1, horizon + 1) if total(d) <= policy.budget), None)
    got = policy.admission_delay(used, left, n, need, horizon, ratio)
    assert got == expected


@given(tails=st.lists(st.integers(0, 15), min_size=1, max_size=8), ages=st.lists(st.integers(0, 70), min_size=8,
                                                                                    max_size=8),
       t=st.integers(70, 200), ahead=st.integers(0, 40))
def test_block_accounting_matches_direct_sum(tails, ages, t, ahead):
    eng = Engine([500] * len(tails), tails=tails, block_size=16)
    eng.t = t
    for job, age in zip(range(len(tails)), ages):
        eng.done[job] = age
        eng.admit(job)
    at = t + ahead
    direct = sum(math.ceil((tail + age + ahead) / 16) for tail, age in zip(tails, ages))
    assert eng.blocks(at) == direct
    assert eng.kv_tokens(at) == 16 * direct
    needs = dict(eng.first_block_needs())
    for tail, age in zip(tails, ages):
        first = next(s for s in range(1, 17) if math.ceil((tail + age + s) / 16) > math.ceil((tail + age) / 16))
        assert first in needs
    assert sum(needs.values()) == len(tails)
