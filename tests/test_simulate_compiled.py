"""The compiled engine baselines (simulate.compiled) equal the event engine, group for group."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lengthsched import InvalidArgument
from simulate import SimulationError, run_group
from simulate.compiled import COMPILED_POLICIES, engine_many

FIELDS = ("steps", "peak_kv", "preemptions", "recomputed_tokens", "decoded_tokens", "max_live")


def engine_row(lengths, policy, **kwargs):
    """What run_group measures, in engine_many's field order (or the exception type it raises)."""
    try:
        r = run_group(lengths, policy, **kwargs)
    except (InvalidArgument, SimulationError) as exc:
        return type(exc)
    return (r.steps, r.peak_kv_tokens, r.preemptions, r.recomputed_tokens, r.decoded_tokens, r.max_live)


@settings(max_examples=150, deadline=None)
@given(data=st.data(), policy=st.sampled_from(COMPILED_POLICIES), size=st.integers(1, 24),
       lmax=st.integers(4, 200), tight=st.floats(0.0, 1.0), slots=st.one_of(st.none(), st.integers(1, 24)),
       clip=st.booleans())
def test_engine_many_equals_the_event_engine(data, policy, size, lmax, tight, slots, clip):
    """``clip``: SGLang's remaining max_new_tokens clipped below L_max (its 4096 against a longer L_max)."""
    from lengthsched.runtime import SGLangLike

    saved = SGLangLike.clip_tokens
    SGLangLike.clip_tokens = max(1, lmax // 3) if clip else saved
    try:
        _engine_many_equals_the_event_engine(data, policy, size, lmax, tight, slots)
    finally:
        SGLangLike.clip_tokens = saved


def _engine_many_equals_the_event_engine(data, policy, size, lmax, tight, slots):
    # Budgets from one longest completion (constant preemption) up to several times the group's need.
    batch = np.array(data.draw(st.lists(st.lists(st.integers(1, lmax), min_size=size, max_size=size),
                                        min_size=1, max_size=4)))
    prompts = np.array(data.draw(st.lists(st.integers(0, 70), min_size=len(batch), max_size=len(batch))))
    budget = int(batch.max() + 32 + tight * 4 * size * lmax)
    kwargs = dict(budget_tokens=budget, max_new_tokens=lmax, slots=slots)
    expected = [engine_row(lengths, policy, prompt_len=int(p), **kwargs) for lengths, p in zip(batch, prompts)]
    try:
        got = engine_many(batch, policy, prompt_lens=prompts, **kwargs)
    except (InvalidArgument, SimulationError) as exc:
        assert type(exc) in expected  # the first failing group fails the batch, as it fails run_group
        return
    for row, want in enumerate(expected):
        assert tuple(int(got[k][row]) for k in FIELDS) == want


@pytest.mark.parametrize("policy", COMPILED_POLICIES)
def test_engine_many_on_a_preempting_castillo_batch(policy):
    from simulate.workloads import castillo_groups

    groups = castillo_groups(64, limit=3, seed=5, max_new_tokens=1024)
    batch = np.stack([g.lengths for g in groups])
    prompts = np.array([g.prompt_len for g in groups])
    got = engine_many(batch, policy, budget_tokens=4 * 1024, max_new_tokens=1024, prompt_lens=prompts)
    assert got["preemptions"].sum() > 0  # the hard case: a budget far below the group's need
    for row, g in enumerate(groups):
        want = engine_row(g.lengths, policy, budget_tokens=4 * 1024, max_new_tokens=1024, prompt_len=g.prompt_len)
        assert tuple(int(got[k][row]) for k in FIELDS) == want
        assert got["decoded_tokens"][row] >= g.lengths.sum()
        assert got["peak_kv"][row] <= 4 * 1024


def test_the_python_kernels_equal_the_compiled_ones():
    from simulate import compiled

    if not compiled.HAVE_NUMBA:
        pytest.skip("numba not installed: the kernels already run as Python")
    lengths = np.array([40, 7, 33, 21, 60, 5, 18, 44], dtype=np.int64)
    # (lengths, prompt tail, prompt tokens, budget, blocks, block, cap, prefill chunk) and
    # (lengths, prompt tokens, budget, L_max, cap, prefill chunk, ratio settings, clip), then counters and a step
    # log. SGLang's: remaining max_new_tokens clipped at 16 (it then admits enough to retract) and unclipped.
    for kernel, args, retracts in ((compiled._vllm_group, (lengths, 5, 37, 96, 6, 16, 8, 40), True),
                                   (compiled._sglang_group, (lengths, 37, 80, 64, 8, 40, 0.7, 0.098, 0.005, 20, 16),
                                    True),
                                   (compiled._sglang_group, (lengths, 37, 100, 64, 8, 40, 0.7, 0.098, 0.005, 20, 4096),
                                    False)):
        a, b = np.zeros(7, dtype=np.int64), np.zeros(7, dtype=np.int64)
        log_a, log_b = np.zeros((400, 5), dtype=np.int64), np.zeros((400, 5), dtype=np.int64)
        assert kernel(*args, a, log_a) == kernel.py_func(*args, b, log_b) == 0
        assert a.tolist() == b.tolist() and log_a.tolist() == log_b.tolist()
        if retracts:
            assert a[2] > 0 and log_a[:, 3].sum() > 0  # it preempted and recomputed


@pytest.mark.parametrize("kwargs, name", [
    (dict(lengths=[[3, 4]], policy="fcfs"), "policy"),
    (dict(lengths=[3, 4]), "lengths"),
    (dict(lengths=[[3, 0]]), "lengths"),
    (dict(lengths=[[3.5, 4]]), "lengths"),
    (dict(lengths=[[3, 40]]), "lengths"),
    (dict(lengths=[[3, 4]], budget_tokens=3), "budget_tokens"),
    (dict(lengths=[[3, 4]], budget_tokens=20, prompt_lens=[15]), "budget_tokens"),  # 15 % 16 + 4 > 16
    (dict(lengths=[[3, 4]], prompt_lens=[1, 2]), "prompt_lens"),
    (dict(lengths=[[3, 4]], slots=0), "slots"),
])
def test_engine_many_rejects_bad_input_naming_the_argument(kwargs, name):
    args = dict(policy="vllm", budget_tokens=64, max_new_tokens=32) | kwargs
    with pytest.raises(InvalidArgument, match=f"argument '{name}'"):
        engine_many(args.pop("lengths"), args.pop("policy"), **args)


def test_sglang_caps_max_new_tokens_at_the_pool_as_its_scheduler_does():
    """A new request reserves its whole max_new_tokens, which SGLang caps at the pool less the prompt and 2
    tokens: a pool of 100 tokens runs a group of L_max 4096 one completion at a time at first (each
    reserves 98 of the 100 tokens), both engines alike."""
    r = run_group([50, 60], "sglang", budget_tokens=100, max_new_tokens=4096)
    got = engine_many([[50, 60]], "sglang", budget_tokens=100, max_new_tokens=4096)
    assert tuple(int(got[k][0]) for k in FIELDS) == engine_row([50, 60], "sglang", budget_tokens=100,
                                                                 max_new_tokens=4096)
    assert (r.max_live, r.steps) == (1, 110)  # one at a time: the second waits for the first to finish
