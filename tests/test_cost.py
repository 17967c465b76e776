"""The step-cost model (lengthsched.cost): presets, physics, the closed-form segment sum, the fit,
JSON, measured-step files, the ``cost`` CLI functions and the two benchmark scripts (quick)."""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lengthsched import InvalidArgument, ModelMemory
from lengthsched.cost import GPU_PRESETS, StepCost, read_samples
from lengthsched.cost_cli import COST_COMMANDS, CostFitOptions, CostShowOptions, run_cost_fit, run_cost_show
from lengthsched.hfconfig import preset_names
from lengthsched.options import add_arguments, from_args

ROOT = Path(__file__).resolve().parent.parent


def qwen(name: str = "qwen3-8b", gpu: str = "h100", **kw) -> StepCost:
    return StepCost.from_model(name, gpu, **kw)


# ------------------------------------------------------------------------------------------ presets
@pytest.mark.parametrize("gpu", sorted(GPU_PRESETS))
def test_every_preset_builds_for_every_bundled_model(gpu):
    spec = GPU_PRESETS[gpu]
    assert spec.bandwidth > 1e11 and spec.peak_flops > 1e14 and spec.link_bandwidth > 1e9
    assert spec.peak_flops / spec.bandwidth > 100  # every card's ridge is far above decode's intensity
    for model in preset_names():
        for tp in (1, 2):
            c = StepCost.from_model(model, gpu, tp=tp)
            for name in ("weights_bytes", "active_parameters", "lm_head_parameters", "kv_bytes_per_token",
                         "attention_flops_per_kv_token", "activation_bytes_per_token", "num_layers", "hidden_size"):
                assert getattr(c, name) > 0, (model, name)
            assert c.gpu == gpu and c.tp == tp and c.seconds(4, 4 * 512, 64, 64 * 65 // 2) > 0


def test_model_numbers_of_qwen3():
    small, big = qwen("qwen3-1.7b"), qwen("qwen3-8b")
    memory = ModelMemory.from_preset("qwen3-1.7b")
    assert small.weights_bytes == memory.weights_bytes  # tied embeddings: the table is the LM head, read
    assert small.lm_head_parameters == 151936 * 2048
    assert small.active_parameters == memory.num_parameters - 151936 * 2048 - 2048  # decoder layers
    assert small.kv_bytes_per_token == 114_688
    assert small.attention_flops_per_kv_token == 4 * 28 * 16 * 128
    # untied: the input-embedding table is gathered, not streamed
    assert big.weights_bytes == ModelMemory.from_preset("qwen3-8b").weights_bytes - 2 * 151936 * 4096
    assert abs(big.active_parameters - 6.95e9) < 0.01e9  # Qwen3-8B's published non-embedding count


def test_moe_counts_activated_experts_only():
    c = qwen("deepseek-v2-lite")
    assert 2.3e9 < c.active_parameters + c.lm_head_parameters < 2.5e9  # "2.4B activated" of 15.7B
    assert c.weights_bytes > 2 * 15e9  # every expert is read


def test_from_gpu_finds_the_bundled_config_and_takes_overrides():
    memory = ModelMemory.from_preset("qwen3-1.7b")
    assert StepCost.from_gpu(memory) == qwen("qwen3-1.7b")
    c = StepCost.from_gpu(memory, "H200", overhead_seconds=1e-3, compute_efficiency=0.5)
    assert (c.gpu, c.overhead_seconds, c.compute_efficiency) == ("h200", 1e-3, 0.5)
    hand_made = memory.replace(name="my-model")
    with pytest.raises(InvalidArgument, match="'config'"):
        StepCost.from_gpu(hand_made)
    assert StepCost.from_gpu(hand_made, config="qwen3-1.7b").active_parameters == c.active_parameters


@pytest.mark.parametrize(("call", "name"), [
    (lambda: qwen(gpu="v100"), "gpu"),
    (lambda: qwen(gpu=3), "gpu"),
    (lambda: qwen(tp=0), "tp"),
    (lambda: qwen(tp=1.5), "tp"),
    (lambda: qwen(bogus=1), "overrides"),
    (lambda: qwen(bandwidth_efficiency=0), "bandwidth_efficiency"),
    (lambda: qwen(overhead_seconds=-1e-3), "overhead_seconds"),
    (lambda: qwen().seconds(-1, 0), "decode_rows"),
    (lambda: qwen().seconds(1, [10, -5]), "kv_tokens_read"),
    (lambda: qwen().seconds(1, 10, math.nan), "prefill_tokens"),
    (lambda: qwen().seconds(1, 10, 0, "x"), "prefill_context"),
    (lambda: qwen().segment_seconds(1.5, 1, 0), "steps"),
    (lambda: qwen().segment_seconds(2, -1, 0), "rows"),
    (lambda: qwen().decode_compute_bound_rows(-1), "context"),
])
def test_bad_input_names_the_argument(call, name):
    with pytest.raises(InvalidArgument) as info:
        call()
    assert f"'{name}'" in str(info.value)


def test_bad_gpu_lists_the_presets():
    with pytest.raises(InvalidArgument) as info:
        qwen(gpu="tpu")
    assert all(name in str(info.value) for name in GPU_PRESETS)


# ------------------------------------------------------------------------------------------ physics
def test_one_decode_row_is_weight_read_bound():
    c = qwen()
    expected = c.overhead_seconds + c.weights_bytes / (c.bandwidth * c.bandwidth_efficiency)
    assert c.seconds(1, 128) == pytest.approx(expected, rel=0.01)
    assert not c.breakdown(1, 128)["compute_bound"]


def test_empty_step_costs_nothing_and_arrays_broadcast():
    c = qwen()
    assert c.seconds(0, 0) == 0.0 and c.seconds(0, 1000) == 0.0
    out = c.seconds(np.array([[1], [8]]), np.array([256, 1024]) * 8)
    assert out.shape == (2, 2) and out.dtype == np.float64 and np.all(out > 0)
    assert isinstance(c.seconds(1, 10), float)


def test_time_grows_with_rows_context_and_prefill():
    c = qwen()
    rows = np.arange(1, 600, 7)
    for ctx in (0, 64, 1024, 16384):
        assert np.all(np.diff(c.seconds(rows, rows * ctx)) >= 0)
    ctx = np.arange(0, 50000, 997)
    assert np.all(np.diff(c.seconds(32, 32 * ctx)) >= 0)
    tokens = np.arange(1, 20000, 301)
    assert np.all(np.diff(c.seconds(0, 0, tokens, tokens * (tokens + 1) // 2)) >= 0)
    assert c.seconds(8, 8000, 512) > c.seconds(8, 8000)


def test_decode_turns_compute_bound_where_the_helper_says():
    c = qwen()
    r = c.decode_compute_bound_rows(256)
    assert 1 < r < math.inf and r == int(r)
    r = int(r)
    at, before = c.breakdown(r, r * 256), c.breakdown(r - 1, (r - 1) * 256)
    assert at["compute_seconds"] >= at["memory_seconds"] and before["compute_seconds"] < before["memory_seconds"]
    # at long contexts attention reads ~kv bytes per few FLOPs: never compute bound
    assert c.decode_compute_bound_rows(16384) == math.inf
    assert not c.breakdown(10**6, 10**6 * 16384)["compute_bound"]
    assert np.array_equal(c.decode_compute_bound_rows([256, 16384]), [r, math.inf])


def test_prefill_is_compute_bound_and_tensor_parallel_adds_communication():
    c1, c2 = qwen(), qwen(tp=2)
    assert c1.breakdown(0, 0, 4096, 4096 * 4097 // 2)["compute_bound"]
    b1, b2 = c1.breakdown(16, 16 * 1024), c2.breakdown(16, 16 * 1024)
    assert b2["bytes"] == pytest.approx(b1["bytes"] / 2) and b2["flops"] == pytest.approx(b1["flops"] / 2)
    assert b1["comm_seconds"] == 0 and b2["comm_seconds"] >= 2 * 36 * c2.allreduce_latency_seconds
    assert b2["seconds"] == pytest.approx(c2.overhead_seconds + b2["memory_seconds"] + b2["comm_seconds"])


# ------------------------------------------------------------------------------------------ segments
def step_sum(c: StepCost, steps, rows, kv, pf, pc, growth=None) -> float:
    i = np.arange(int(steps))
    first = i == 0
    growth = rows if growth is None else growth
    return math.fsum(np.atleast_1d(c.seconds(rows, kv + i * growth, np.where(first, pf, 0), np.where(first, pc, 0))))


costs = st.builds(
    StepCost, model=st.just("m"), gpu=st.just("h100"), bandwidth=st.floats(1e11, 1e13),
    peak_flops=st.floats(1e13, 1e16), link_bandwidth=st.floats(1e9, 1e12),
    weights_bytes=st.integers(0, 10**11), active_parameters=st.integers(0, 10**10),
    lm_head_parameters=st.integers(0, 10**9), kv_bytes_per_token=st.integers(0, 10**6),
    attention_flops_per_kv_token=st.integers(0, 10**8), activation_bytes_per_token=st.integers(0, 10**7),
    num_layers=st.integers(1, 100), hidden_size=st.integers(1, 10**4), tp=st.integers(1, 8),
    overhead_seconds=st.floats(0, 1e-2), bandwidth_efficiency=st.floats(0.05, 1), compute_efficiency=st.floats(0.05, 1),
    separate_attention=st.booleans())


@given(costs, st.integers(0, 300), st.integers(0, 4096), st.integers(0, 10**7), st.integers(0, 10**5),
       st.integers(0, 10**9))
def test_segment_equals_the_sum_of_its_steps(c, steps, rows, kv_first, pf, pc):
    expected = step_sum(c, steps, rows, kv_first, pf, pc)
    got = c.segment_seconds(steps, rows, kv_first, pf, pc)
    assert got == pytest.approx(expected, rel=1e-9, abs=1e-300)


@given(costs, st.integers(0, 300), st.integers(0, 4096), st.integers(0, 4096), st.integers(0, 10**7),
       st.integers(0, 10**5), st.integers(0, 10**9))
def test_a_segment_whose_reads_grow_by_fewer_rows(c, steps, rows, growth, kv_first, pf, pc):
    """``growth``: step i reads kv_first + i * growth (a compressed cache's rows at its cap read the same KV);
    the float price agrees."""
    growth = min(growth, rows)
    expected = step_sum(c, steps, rows, kv_first, pf, pc, growth)
    got = c.segment_seconds(steps, rows, kv_first, pf, pc, 0, growth)
    assert got == pytest.approx(expected, rel=1e-9, abs=1e-300)
    assert c.segment_seconds_float(steps, rows, kv_first, pf, pc, 0, growth) == pytest.approx(got, rel=1e-9,
                                                                                              abs=1e-300)
    assert c.segment_seconds(steps, rows, kv_first, pf, pc, 0, rows) == c.segment_seconds(steps, rows, kv_first, pf,
                                                                                            pc)


def test_segment_crossing_over_in_the_middle_both_ways():
    c = qwen()
    # many rows, short contexts: compute bound first, then the growing KV makes it memory bound
    rows, kv, steps = 4000, 0, 400
    first, last = c.breakdown(rows, kv), c.breakdown(rows, kv + (steps - 1) * rows)
    assert first["compute_bound"] and not last["compute_bound"]
    assert c.segment_seconds(steps, rows, kv) == pytest.approx(step_sum(c, steps, rows, kv, 0, 0), rel=1e-12)
    # no KV bytes but attention FLOPs: memory bound first, compute bound later
    d = c.replace(kv_bytes_per_token=0, attention_flops_per_kv_token=10**8)
    rows, steps = 64, 2000
    first, last = d.breakdown(rows, rows), d.breakdown(rows, rows + (steps - 1) * rows)
    assert not first["compute_bound"] and last["compute_bound"]
    assert d.segment_seconds(steps, rows, rows) == pytest.approx(step_sum(d, steps, rows, rows, 0, 0), rel=1e-12)


def test_segment_edge_cases_and_vectorisation():
    c = qwen(tp=2)
    assert c.segment_seconds(0, 8, 100, 512, 512 * 513 // 2) == 0.0
    prefill_only = c.seconds(0, 0, 512, 512 * 513 // 2)
    assert c.segment_seconds(50, 0, 0, 512, 512 * 513 // 2) == pytest.approx(prefill_only)  # later steps cost 0
    assert c.segment_seconds(1, 8, 800) == pytest.approx(c.seconds(8, 800))
    steps, rows, kv = np.array([0, 1, 7, 100]), np.array([4, 0, 16, 256]), np.array([0, 10, 4096, 10**5])
    got = c.segment_seconds(steps, rows, kv, 128)
    assert got.shape == (4,)
    assert np.allclose(got, [c.segment_seconds(int(s), int(r), int(k), 128) for s, r, k in zip(steps, rows, kv)],
                       rtol=1e-12)


# ------------------------------------------------------------------------------------------ fitting
def synthetic(truth: StepCost, noise: float = 0.0, seed: int = 1) -> dict:
    grid = [(r, r * ctx, 0, 0) for r in (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024) for ctx in (16, 128, 1024, 4096)]
    grid += [(0, 0, t, t * (t + 1) // 2) for t in (128, 512, 2048, 8192)] + [(4, 4 * 2048, 256, 256 * 257 // 2)]
    a = np.array(grid, dtype=np.float64)
    t = truth.seconds(a[:, 0], a[:, 1], a[:, 2], a[:, 3])
    t = t * (1 + noise * np.random.default_rng(seed).standard_normal(t.size))
    return {"decode_rows": a[:, 0], "kv_tokens_read": a[:, 1], "prefill_tokens": a[:, 2],
            "prefill_context": a[:, 3], "seconds": t}


TRUTH = dict(overhead_seconds=0.3e-3, bandwidth_efficiency=0.82, compute_efficiency=0.55)


def test_fit_recovers_known_parameters_exactly_without_noise():
    prior = qwen()
    fitted = prior.fit(synthetic(prior.replace(**TRUTH)))
    for name, value in TRUTH.items():
        assert getattr(fitted, name) == pytest.approx(value, rel=1e-6)
    assert np.max(np.abs(fitted.errors(synthetic(prior.replace(**TRUTH))))) < 1e-6


@given(costs, st.integers(0, 4096), st.integers(0, 10**7), st.integers(0, 10**5), st.integers(0, 10**9))
def test_separate_attention_never_prices_a_step_below_the_overlapped_form(c, rows, kv, pf, pc):
    """A sum of two maxima is at least the maximum of the sums: the rollout lower bounds, derived for the
    overlapped form, stay bounds for the separate one."""
    over, sep = c.replace(separate_attention=False), c.replace(separate_attention=True)
    assert sep.seconds(rows, kv, pf, pc) >= over.seconds(rows, kv, pf, pc) * (1 - 1e-12)


def test_separate_attention_prices_mixed_steps_as_the_sum_of_their_kernels():
    """Separate attention: a memory-bound decode step and a compute-bound prefill cost what they cost
    overlapped; a mixed step pays the decode rows' KV reads on top of the chunk's compute-bound GEMMs."""
    over = qwen("qwen3-8b")
    sep = over.replace(separate_attention=True)
    assert sep.seconds(8, 8 * 2048) == pytest.approx(over.seconds(8, 8 * 2048), rel=1e-12)
    pc = 4096 * 4097 // 2
    assert sep.seconds(0, 0, 4096, pc) == pytest.approx(over.seconds(0, 0, 4096, pc), rel=1e-12)
    kv_read = 64 * 2048 * sep.kv_bytes_per_token / (sep.bandwidth * sep.bandwidth_efficiency)
    mixed_over, mixed_sep = over.seconds(64, 64 * 2048, 4096, pc), sep.seconds(64, 64 * 2048, 4096, pc)
    assert mixed_over < mixed_sep
    assert mixed_sep == pytest.approx(over.seconds(64, 0, 4096, pc) + kv_read, rel=1e-3)
    assert over.breakdown(64, 64 * 2048, 4096, pc)["compute_bound"] and sep.breakdown(64, 0, 4096, pc)["compute_bound"]
    # the linear layers alone decide where decode turns compute bound, whatever the context
    assert sep.decode_compute_bound_rows(16384) == sep.decode_compute_bound_rows(16)
    assert over.decode_compute_bound_rows(16384) > sep.decode_compute_bound_rows(16384)


def test_fit_recovers_separate_attention_parameters_exactly_without_noise():
    prior = qwen("qwen3-1.7b", separate_attention=True)
    truth = prior.replace(**TRUTH)
    samples = synthetic(truth)
    mixed = [(r, r * ctx, t, t * (t + 1) // 2) for r in (1, 16, 64, 128) for ctx in (512, 2048) for t in (256, 4096)]
    a = np.array(mixed, dtype=np.float64)
    samples = {k: np.concatenate([v, a[:, i] if i is not None else truth.seconds(*a.T)])
               for k, v, i in ((k, v, {"decode_rows": 0, "kv_tokens_read": 1, "prefill_tokens": 2,
                                        "prefill_context": 3, "seconds": None}[k]) for k, v in samples.items())}
    fitted = prior.fit(samples)
    assert fitted.separate_attention
    for name, value in TRUTH.items():
        assert getattr(fitted, name) == pytest.approx(value, rel=1e-6)
    # the overlapped form cannot price those mixed steps as well
    assert np.max(np.abs(prior.replace(separate_attention=False).fit(samples).errors(samples))) > 1e-3


def test_separate_attention_round_trips_and_is_checked():
    cost = qwen("qwen3-1.7b", separate_attention=True)
    again = StepCost.from_json(cost.to_json())
    assert again == cost and again.separate_attention
    old = json.loads(qwen("qwen3-1.7b").to_json())
    del old["separate_attention"]  # files written before the field existed
    assert StepCost.from_json(json.dumps(old)).separate_attention is False
    with pytest.raises(InvalidArgument, match="'separate_attention'"):
        qwen("qwen3-1.7b", separate_attention="yes")


def test_fit_with_noise_and_held_out_report():
    prior = qwen("qwen3-1.7b", tp=2)
    samples = synthetic(prior.replace(**TRUTH), noise=0.005)
    fitted, report = prior.fit_and_validate(samples, train_fraction=0.5, seed=0)
    assert fitted.bandwidth_efficiency == pytest.approx(0.82, rel=0.03)
    assert fitted.compute_efficiency == pytest.approx(0.55, rel=0.03)
    assert fitted.overhead_seconds == pytest.approx(0.3e-3, rel=0.25)
    assert report["held_out"]["n"] + report["train"]["n"] == len(samples["seconds"])
    assert report["held_out"]["median"] < 0.01 and report["held_out"]["max"] < 0.03
    assert report["prior_held_out"]["median"] > 0.05  # the priors are off: the fit matters
    assert report["compute_bound_train"] > 0
    again = prior.fit_and_validate(samples, train_fraction=0.5, seed=0)
    assert again[0] == fitted and again[1] == report  # the split is deterministic
    assert prior.fit_and_validate(samples, seed=1)[1]["held_out"] != report["held_out"]


def test_fit_accepts_every_sample_layout():
    prior = qwen("qwen3-1.7b")
    cols = synthetic(prior.replace(**TRUTH))
    names = ("decode_rows", "kv_tokens_read", "prefill_tokens", "seconds", "prefill_context")
    rows = [dict(zip(names, v)) for v in zip(*(cols[n] for n in names))]
    table = np.stack([cols[n] for n in names], axis=1)
    structured = np.array([tuple(r.values()) for r in rows], dtype=[(n, "f8") for n in names])
    expected = prior.fit(cols)
    for layout in (rows, table, structured):
        assert prior.fit(layout) == expected
    decode_only = {k: v[:44] for k, v in cols.items() if k != "prefill_context"}  # 4 columns, no prefill
    assert prior.fit(table[:44, :4]) == prior.fit(decode_only)


def test_fit_rejects_bad_samples():
    prior = qwen()
    with pytest.raises(InvalidArgument, match="'samples'"):
        prior.fit({"decode_rows": [0, 1, 2], "kv_tokens_read": [0, 1, 2], "prefill_tokens": [0, 0, 0],
                   "seconds": [1e-3, 1e-3, 1e-3]})  # an empty step
    with pytest.raises(InvalidArgument, match="'samples'"):
        prior.fit({"decode_rows": [1], "kv_tokens_read": [1], "prefill_tokens": [0], "seconds": [1e-3]})
    with pytest.raises(InvalidArgument, match="'seconds'"):
        prior.fit({"decode_rows": [1, 2, 3], "kv_tokens_read": [1, 2, 3], "prefill_tokens": [0, 0, 0],
                   "seconds": [1e-3, 0, 1e-3]})
    with pytest.raises(InvalidArgument, match="'samples'"):
        prior.fit([{"decode_rows": 1, "seconds": 1e-3}])
    with pytest.raises(InvalidArgument, match="'train_fraction'"):
        prior.fit_and_validate(synthetic(prior), train_fraction=0.01)
    idle = {"decode_rows": [2, 2, 0, 2], "kv_tokens_read": [5, 6, 0, 7], "prefill_tokens": [0, 0, 0, 0],
            "seconds": [1e-3] * 4}
    for seed in range(4):  # named by its place in the input, whatever the split's order
        with pytest.raises(InvalidArgument, match=r"step 2 \(0-based, in the order given\)"):
            prior.fit_and_validate(idle, train_fraction=1.0, seed=seed)


# ------------------------------------------------------------------------------------------ JSON and files
def test_json_round_trip_and_validation():
    c = qwen(tp=4).fit(synthetic(qwen(tp=4).replace(**TRUTH)))
    text = c.to_json()
    assert StepCost.from_json(text) == c
    data = json.loads(text)
    assert data["version"] == 1 and data["format"] == "lengthsched.step_cost"
    for change, name in (({"version": 2}, "version"), ({"bandwidth": -1.0}, "bandwidth"), ({"tp": "2"}, "tp"),
                         ({"extra": 1}, "cost"), ({"format": "x"}, "cost")):
        with pytest.raises(InvalidArgument, match=f"'{name}'"):
            StepCost.from_json(json.dumps({**data, **change}))
    del data["weights_bytes"]
    with pytest.raises(InvalidArgument, match="weights_bytes"):
        StepCost.from_json(json.dumps(data))
    with pytest.raises(InvalidArgument, match="'cost'"):
        StepCost.from_json("not json")


def write_samples(path: Path, cols: dict) -> None:
    lines = []
    for i in range(len(cols["seconds"])):
        row = {k: (float(v[i]) if k == "seconds" else int(v[i])) for k, v in cols.items()}
        lines.append(json.dumps({**row, "kind": "decode"}))
    path.write_text("\n".join(lines[:3] + [""] + lines[3:]) + "\n")


def test_read_samples(tmp_path):
    cols = synthetic(qwen().replace(**TRUTH))
    good = tmp_path / "steps.jsonl"
    write_samples(good, cols)
    read = read_samples(good)
    assert all(np.allclose(read[k], cols[k]) for k in cols)
    bad = tmp_path / "bad.jsonl"
    for line, what in (("{not json", "JSON"),
                       ('{"decode_rows": 1, "kv_tokens_read": 2, "seconds": 1}', "prefill_tokens"),
                       ('{"decode_rows": -1, "kv_tokens_read": 2, "prefill_tokens": 0, "seconds": 1}', "decode_rows"),
                       ('{"decode_rows": 1, "kv_tokens_read": 2, "prefill_tokens": 0, "seconds": 0}', "seconds"),
                       ("[1, 2]", "object")):
        bad.write_text(good.read_text().splitlines()[0] + "\n\n" + line + "\n")
        with pytest.raises(InvalidArgument) as info:
            read_samples(bad)
        message = str(info.value)
        assert str(bad) in message and "line 3" in message and what in message
    with pytest.raises(InvalidArgument, match="'samples'"):
        read_samples(tmp_path / "missing.jsonl")
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(InvalidArgument, match="at least one"):
        read_samples(tmp_path / "empty.jsonl")


def test_on_gpu_moves_the_datasheet_numbers_and_keeps_the_fit():
    fitted = qwen("qwen3-1.7b", separate_attention=True).replace(**TRUTH, host_efficiency=0.6, tp=2)
    moved = fitted.on_gpu("H200")
    spec = GPU_PRESETS["h200"]
    assert (moved.gpu, moved.bandwidth, moved.peak_flops, moved.link_bandwidth, moved.host_bandwidth) == (
        "h200", spec.bandwidth, spec.peak_flops, spec.link_bandwidth, spec.host_bandwidth)
    assert moved.parameters() == fitted.parameters()
    assert (moved.host_efficiency, moved.tp, moved.separate_attention, moved.model) == (0.6, 2, True, fitted.model)
    assert moved.on_gpu("h100") == fitted
    # a bandwidth-bound decode step is cheaper on the card with more bandwidth, by at most its ratio
    h100, h200 = fitted.seconds(8, 8 * 1024), moved.seconds(8, 8 * 1024)
    assert spec.bandwidth / GPU_PRESETS["h100"].bandwidth > h100 / h200 > 1.0
    with pytest.raises(InvalidArgument, match="'gpu'"):
        fitted.on_gpu("v100")


def test_shipped_calibrations_carry_between_hopper_cards(tmp_path):
    """bench_cost.py --sections cards on the steps measured on the H100 and the H200: each card's fit moved
    to the other card (on_gpu) prices that card's steps better than the unfitted preset and better than
    the fit left on its own card's numbers, within 5% (median), and no better than a fit on the card."""
    out = tmp_path / "cost_cards.json"
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_cost.py"), "--sections", "cards",
                             "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    cards = json.loads(out.read_text())["cards"]
    pairs = [p for p in cards["pairs"] if "skipped" not in p]
    # the H200 runs the same steps faster, by less than its bandwidth ratio (steps pay a fixed overhead)
    assert len(cards["speedup"]) == 4
    assert all(1.0 < s["median"] < s["bandwidth_ratio"] for s in cards["speedup"])
    assert {(p["fitted_on"], p["priced_on"]) for p in pairs} == {("h100", "h200"), ("h200", "h100")}
    assert len(pairs) == 8  # 1.7B and 8B, eager and compiled, both ways
    for p in pairs:
        rows, a, b = p["rows"], p["fitted_on"], p["priced_on"]
        moved = rows[f"{a} fit moved to {b} (on_gpu)"]["median"]
        assert moved < 0.05
        assert moved < rows["unfitted preset"]["median"] and moved < rows[f"{a} fit on {a} numbers"]["median"]
        assert rows[f"{b} fit, held out"]["median"] < 0.05


# ------------------------------------------------------------------------------------------ CLI
def test_cost_fit_and_show(tmp_path, capsys):
    truth = qwen("qwen3-1.7b").replace(**TRUTH)
    steps, out = tmp_path / "measured.jsonl", tmp_path / "cost.json"
    write_samples(steps, synthetic(truth, noise=0.002))
    assert run_cost_fit(CostFitOptions(samples=str(steps), out=str(out), model="qwen3-1.7b", gpu="h100")) == 0
    text = capsys.readouterr().out
    assert "fitted, held out" in text and "preset, held out" in text and "compute_efficiency" in text
    fitted = StepCost.from_json(out.read_text())
    assert fitted.compute_efficiency == pytest.approx(0.55, rel=0.05)
    assert run_cost_fit(CostFitOptions(samples=str(steps), json=True, train_fraction=0.75, seed=3)) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["held_out"]["n"] == 12 and report["held_out"]["median"] < 0.01
    assert report["separate_attention"] is False
    separate = tmp_path / "separate.json"
    assert run_cost_fit(CostFitOptions(samples=str(steps), out=str(separate), separate_attention=True)) == 0
    assert "separate attention" in capsys.readouterr().out
    assert StepCost.from_json(separate.read_text()).separate_attention

    assert run_cost_show(CostShowOptions(cost=str(out))) == 0
    text = capsys.readouterr().out
    assert "decode turns compute bound" in text and "16384" in text and "8192 tokens" in text
    assert run_cost_show(CostShowOptions(model="qwen3-8b", gpu="h100", json=True)) == 0
    data = json.loads(capsys.readouterr().out)
    assert len(data["decode"]) == 7 * 4 and len(data["prefill"]) == 3
    assert data["compute_bound_from_rows"]["256"] == int(qwen().decode_compute_bound_rows(256))
    assert data["compute_bound_from_rows"]["16384"] is None
    cell = next(d for d in data["decode"] if d["rows"] == 64 and d["context"] == 1024)
    assert cell["ms"] == pytest.approx(qwen().seconds(64, 64 * 1024) * 1e3)
    # a fitted model moved to another card's datasheet numbers (--cost with --gpu)
    assert run_cost_show(CostShowOptions(cost=str(out), gpu="h200", json=True)) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["gpu"] == "h200" and data["parameters"] == fitted.parameters()
    cell = next(d for d in data["decode"] if d["rows"] == 64 and d["context"] == 1024)
    assert cell["ms"] == pytest.approx(fitted.on_gpu("h200").seconds(64, 64 * 1024) * 1e3)


def test_cost_cli_bad_input(tmp_path):
    with pytest.raises(InvalidArgument, match="'samples'"):
        run_cost_fit(CostFitOptions())
    with pytest.raises(InvalidArgument, match="'cost'"):
        run_cost_show(CostShowOptions(cost=str(tmp_path / "cost.json"), model="qwen3-8b"))
    with pytest.raises(InvalidArgument, match="'cost'.*--tp"):
        run_cost_show(CostShowOptions(cost=str(tmp_path / "cost.json"), tp=2))
    with pytest.raises(InvalidArgument, match="'cost'"):
        run_cost_show(CostShowOptions(cost=str(tmp_path / "missing.json")))
    with pytest.raises(InvalidArgument, match="'gpu'"):
        run_cost_show(CostShowOptions(gpu="v100"))


def test_cost_options_build_argparse_parsers():
    assert set(COST_COMMANDS) == {"fit", "show"}
    for name, (cls, run) in COST_COMMANDS.items():
        parser = argparse.ArgumentParser(prog=f"lengthsched cost {name}")
        add_arguments(parser, cls)
        assert callable(run) and (cls.__doc__ or "").strip().splitlines()[0]
    parser = argparse.ArgumentParser()
    add_arguments(parser, CostFitOptions)
    opts = from_args(CostFitOptions, parser.parse_args(["m.jsonl", "--out", "c.json", "--gpu", "h200", "--tp", "2",
                                                        "--train-fraction", "0.7", "--separate-attention"]))
    assert opts == CostFitOptions(samples="m.jsonl", out="c.json", gpu="h200", tp=2, train_fraction=0.7,
                                  separate_attention=True)


# ------------------------------------------------------------------------------------------ benchmarks
def test_vidur_benchmark_runs_quick(tmp_path):
    out = tmp_path / "cost_vidur.json"
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_cost.py"), "--quick", "--out", str(out)],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "### Vidur operator profiles" in result.stdout
    data = json.loads(out.read_text())
    rows = data["vidur"]["rows"]
    assert {(r["tp"], r["variant"]) for r in rows} == {(1, "linear"), (1, "layer"), (2, "linear"), (2, "layer")}
    for r in rows:
        assert r["points"] == 259 and r["unfitted"]["median"] < 0.5 and r["fitted_held_out"]["n"] == 129
    summary = data["vidur"]["summary"]["linear"]
    assert summary["fitted_held_out"]["median"] < summary["unfitted"]["median"]


def test_gpu_kv_transfer_script_runs_on_cpu_quick(tmp_path):
    """benchmarks/gpu_kv_transfer.py's code path (no GPU evidence): every size timed three ways beside
    the modelled recompute, fits per direction, the report written."""
    out = tmp_path / "kv.json"
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_kv_transfer.py"), "--device", "cpu",
                             "--quick", "--models", "qwen3-1.7b", "--out", str(out)],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(out.read_text())
    (model,) = report["models"]
    assert report["card"] == "cpu" and model["model"] == "qwen3-1.7b" and model["kv_bytes_per_token"] == 114688
    assert [r["tokens"] for r in model["rows"]] == [16, 64, 256]
    for r in model["rows"]:
        assert r["bytes"] == r["tokens"] * 114688 and min(r["offload_seconds"], r["load_seconds"]) > 0
        assert r["recompute_seconds_preset"] == pytest.approx(StepCost.from_model("qwen3-1.7b", "h100").seconds(
            0, 0, r["tokens"], r["tokens"] * (r["tokens"] + 1) // 2))
    assert set(model["fits"]) == {"offload", "load", "on_device"}
    (overlap,) = report["overlap"]
    assert overlap["model"] == "qwen3-1.7b" and overlap["steps"] >= 1 and overlap["steps_with_load_seconds"] > 0
    bad = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_kv_transfer.py"), "--device", "cpu",
                          "--quick", "--models", "no-such-model", "--out", str(tmp_path / "bad.json")],
                         capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "no-such-model" in bad.stderr and not (tmp_path / "bad.json").exists()


def test_gpu_cost_script_runs_on_cpu_quick(tmp_path):
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_cost.py"), "--device", "cpu", "--quick",
                             "--reps", "2", "--warmup", "1", "--out-dir", str(tmp_path)],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    samples = read_samples(tmp_path / "cost_gpu_cpu.jsonl")
    assert samples["seconds"].size == 3 * 2 + 3 and np.all(samples["seconds"] > 0)
    report = json.loads((tmp_path / "cost_gpu_cpu.json").read_text())
    assert report["card"] == "cpu" and report["steps_measured"] == 9 and "not GPU evidence" in report["note"]
    assert report["fit"]["held_out"]["n"] > 0 and set(report["unfitted_all_steps"]) == {"h100", "h200"}
    assert StepCost.from_json(json.dumps(report["fitted"])).model == "tiny-qwen3-cost"
    other = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_cost.py"), "--device", "cpu", "--quick",
                            "--model", "qwen3-8b", "--reps", "1", "--warmup", "0", "--out-dir", str(tmp_path)],
                           capture_output=True, text=True, timeout=300)
    assert other.returncode == 0, other.stderr[-3000:]
    assert (tmp_path / "cost_gpu_cpu_qwen3-8b.json").is_file() and (tmp_path / "cost_gpu_cpu_qwen3-8b.jsonl").is_file()
    bad = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_cost.py"), "--device", "cpu", "--quick",
                          "--model", "no-such-model", "--out-dir", str(tmp_path)], capture_output=True, text=True,
                         timeout=300)
    assert bad.returncode == 2 and "--model 'no-such-model'" in bad.stderr and "qwen3-8b" in bad.stderr


def _tiny_static_kv_model(torch, kv_tokens: int):
    """(gpu_cost, the tiny Qwen3-shaped model in float64 on the CPU with gpu_cost's static-KV attention, its
    fields, the StaticKV of ``kv_tokens`` tokens): what the float64 checks of gpu_cost's steps run on."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import gpu_cost

    _, fields, _ = gpu_cost.model_config(argparse.ArgumentParser(), "qwen3-1.7b", quick=True)
    torch.manual_seed(0)
    model = gpu_cost.build_model(torch, fields, torch.float64, torch.device("cpu"))
    kv = gpu_cost.StaticKV(torch, fields["num_hidden_layers"], fields["num_key_value_heads"], fields["head_dim"],
                           kv_tokens, torch.float64, torch.device("cpu"))
    gpu_cost.register(kv)
    model.set_attn_implementation(gpu_cost.ATTENTION)
    return gpu_cost, model, fields, kv


def test_gpu_cost_mixed_step_computes_what_the_separate_steps_compute():
    """A mixed step of benchmarks/gpu_cost.py (a prefill chunk and decode rows packed in one forward, as
    engines run chunked prefill) gives, in float64, the chunk's last logits of the prefill alone and each
    row's logits of the decode alone: the timed step does the work it is priced for."""
    torch = pytest.importorskip("torch")
    rows, ctx, chunk = 3, 10, 7
    gpu_cost, model, fields, kv = _tiny_static_kv_model(torch, rows * ctx + chunk)
    gen = torch.Generator().manual_seed(1)
    chunk_ids = torch.randint(fields["vocab_size"], (1, chunk), generator=gen)
    row_ids = torch.randint(fields["vocab_size"], (rows, 1), generator=gen)
    with torch.inference_mode():
        kv.shape(rows, ctx, False, chunk)
        positions = torch.cat([torch.arange(chunk), torch.full((rows,), ctx - 1)]).unsqueeze(0)
        mixed = gpu_cost.forward_fn(torch, model, torch.cat([chunk_ids[0], row_ids[:, 0]]).unsqueeze(0),
                                    positions, rows + 1)()
        kv.shape(rows, ctx, True)
        decode = gpu_cost.forward_fn(torch, model, row_ids, torch.full((rows, 1), ctx - 1), 1)()
        kv.shape(1, chunk, False)
        prefill = gpu_cost.forward_fn(torch, model, chunk_ids, torch.arange(chunk).unsqueeze(0), 1)()
    assert mixed.shape == (1, rows + 1, fields["vocab_size"])
    torch.testing.assert_close(mixed[0, 0], prefill[0, -1], rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(mixed[0, 1:], decode[:, -1], rtol=1e-10, atol=1e-10)


def test_gpu_cost_chunk_in_pieces_computes_separate_prefills():
    """A mixed step whose chunk is two sequences (gpu_cost.StaticKV with pieces=2, as benchmarks/gpu_replay.py
    runs several prompts prefilled in one step) gives, in float64, the last token's logits of the second
    sequence prefilled alone: each piece attends its own tokens."""
    torch = pytest.importorskip("torch")
    rows, ctx, piece = 2, 6, 5
    gpu_cost, model, fields, kv = _tiny_static_kv_model(torch, rows * ctx + 2 * piece)
    gen = torch.Generator().manual_seed(1)
    chunk_ids = torch.randint(fields["vocab_size"], (2, piece), generator=gen)
    row_ids = torch.randint(fields["vocab_size"], (rows, 1), generator=gen)
    with torch.inference_mode():
        kv.shape(rows, ctx, False, 2 * piece, pieces=2)
        positions = torch.cat([torch.arange(2 * piece) % piece, torch.full((rows,), ctx - 1)]).unsqueeze(0)
        mixed = gpu_cost.forward_fn(torch, model, torch.cat([chunk_ids.flatten(), row_ids[:, 0]]).unsqueeze(0),
                                    positions, rows + 1)()
        kv.shape(2, piece, False)
        prefill = gpu_cost.forward_fn(torch, model, chunk_ids, torch.arange(piece).expand(2, piece), 1)()
    torch.testing.assert_close(mixed[0, 0], prefill[1, -1], rtol=1e-10, atol=1e-10)


def test_gpu_cost_script_compiles_the_forward_on_cpu_quick(tmp_path):
    """--compile: torch.compile'd decoder layers (dynamic shapes), its own report name, every step
    marked; --mixed-chunks: mixed steps in their own file, kept out of the fit and scored by it."""
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_cost.py"), "--device", "cpu", "--quick",
                             "--compile", "--reps", "1", "--warmup", "1", "--rows", "1,2", "--contexts", "16,32",
                             "--prefills", "16,32", "--mixed-chunks", "8", "--out-dir", str(tmp_path)],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = (tmp_path / "cost_gpu_cpu_compiled.jsonl").read_text().splitlines()
    assert len(lines) == 6 and all(json.loads(line)["compiled"] for line in lines)
    report = json.loads((tmp_path / "cost_gpu_cpu_compiled.json").read_text())
    assert report["compiled"] is True and report["compile_scope"] == "each decoder layer"
    mixed = read_samples(tmp_path / "cost_gpu_cpu_compiled_mixed.jsonl")
    assert mixed["seconds"].size == 2 and np.all(mixed["decode_rows"] > 0) and np.all(mixed["prefill_tokens"] == 8)
    assert report["mixed"]["steps_measured"] == 2 and report["form"] == "separate"
    assert set(report["fits"]) == {"separate", "overlapped"}
    for form, entry in report["fits"].items():
        assert entry["mixed"]["n"] == 2 and entry["report"]["n_samples"] == 6  # the mixed steps are not fitted
        assert StepCost.from_json(json.dumps(entry["fitted"])).separate_attention == (form == "separate")
    assert report["fitted"] == report["fits"]["separate"]["fitted"]
    # --refit redoes the fits from the files, without torch or a GPU, and keeps the run's record
    path = tmp_path / "cost_gpu_cpu_compiled.json"
    again = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_cost.py"), "--refit", str(path),
                            "--model", "qwen3-1.7b", "--form", "overlapped"], capture_output=True, text=True,
                           timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    refit = json.loads(path.read_text())
    assert refit["form"] == "overlapped" and refit["fitted"] == report["fits"]["overlapped"]["fitted"]
    assert refit["command"] == report["command"] and "--refit" in refit["refit"]["command"]
    wrong = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_cost.py"), "--refit",
                            str(tmp_path / "missing.json")], capture_output=True, text=True, timeout=300)
    assert wrong.returncode == 2 and "--refit" in wrong.stderr


@pytest.mark.parametrize("model, report", [("qwen3-1.7b", "cost_gpu_h100_compiled"),
                                           ("qwen3-8b", "cost_gpu_h100_qwen3-8b_compiled")])
def test_h100_compiled_calibration_prices_mixed_steps_better_with_separate_attention(model, report):
    """The recorded H100 run with compiled layers (docs/benchmarks.md, level (c)): the shipped StepCost
    file is the report's separate-attention fit; fitted on pure steps only, that form prices the mixed
    steps (a prefill chunk beside decode rows) closer than the overlapped form, both too fast."""
    results = ROOT / "benchmarks" / "results"
    data = json.loads((results / f"{report}.json").read_text())
    shipped = StepCost.from_json((results / f"stepcost_h100_{model}_compiled.json").read_text())
    assert shipped == StepCost.from_json(json.dumps(data["fitted"])) and shipped.separate_attention
    mixed = read_samples(results / f"{report}_mixed.jsonl")
    errors = {form: StepCost.from_json(json.dumps(data["fits"][form]["fitted"])).errors(mixed)
              for form in ("separate", "overlapped")}
    for form, e in errors.items():
        assert np.median(np.abs(e)) == pytest.approx(data["fits"][form]["mixed"]["median"], rel=1e-9)
        assert np.median(e) < 0
    assert np.median(np.abs(errors["separate"])) < 0.7 * np.median(np.abs(errors["overlapped"]))
    held = data["fits"]["separate"]["report"]["held_out"]
    assert held["median"] < 0.02


@pytest.mark.parametrize("model, report", [("qwen3-1.7b", "cost_gpu_h100"), ("qwen3-8b", "cost_gpu_h100_qwen3-8b")])
def test_h100_calibration_files_load_and_reproduce_their_report(model, report):
    """The recorded H100 run (docs/cost.md, level (c)): the shipped StepCost file is the report's fit,
    and it prices the recorded steps within the reported errors."""
    results = ROOT / "benchmarks" / "results"
    data = json.loads((results / f"{report}.json").read_text())
    cost = StepCost.from_json((results / f"stepcost_h100_{model}.json").read_text())
    assert cost.parameters() == pytest.approx({k: data["fitted"][k] for k in cost.parameters()})
    assert "H100" in data["card"] and data["fit"]["held_out"]["median"] < 0.10
    errors = np.abs(cost.errors(read_samples(results / f"{report}.jsonl")))
    assert errors.size == data["steps_measured"] and np.median(errors) < 0.10


@given(costs, st.lists(st.tuples(st.integers(1, 50), st.integers(0, 512), st.integers(0, 10**6),
                                 st.integers(0, 4096), st.integers(0, 10**7)), min_size=1, max_size=5))
def test_lower_bound_is_below_every_split_of_the_work(c, segments):
    steps, rows, kv, pf, pc = (np.array(x, dtype=np.float64) for x in zip(*segments))
    active = np.where(rows > 0, steps, (pf > 0).astype(np.float64))  # steps that do something
    total = float(np.sum(c.segment_seconds(steps, rows, kv, pf, pc)))
    decoded = float(np.sum(rows * steps))
    read = float(np.sum(np.where(rows > 0, steps * kv + rows * steps * (steps - 1) / 2, 0)))  # rows = 0: no reads
    pc = np.where(rows + pf > 0, pc, 0)  # an empty segment attends nothing
    bound = c.lower_bound_seconds(steps=active.sum(), decode_tokens=decoded, kv_tokens_read=read,
                                  prefill_tokens=pf.sum(), prefill_context=pc.sum())
    assert bound <= total * (1 + 1e-9) + 1e-300


@given(costs, st.integers(0, 5000), st.integers(0, 10**6), st.integers(0, 10**9), st.integers(0, 10**5))
def test_lower_bound_parts_add_up_to_the_bound_and_are_linear_in_the_tokens(c, steps, rows, kv, pf):
    """lower_bound_parts: the per-step and per-token terms the rollout's packing bound splits between
    replicas; recombined they are lower_bound_seconds, and the token terms of two halves add up."""
    pc = pf * (pf + 1) // 2
    p = c.lower_bound_parts(rows, kv, pf, pc)
    again = steps * p["step_seconds"] + max(steps * p["step_memory_seconds"] + p["memory_seconds"],
                                            p["compute_seconds"]) + p["comm_seconds"]
    bound = c.lower_bound_seconds(steps=steps, decode_tokens=rows, kv_tokens_read=kv, prefill_tokens=pf,
                                  prefill_context=pc)
    assert again == pytest.approx(bound, rel=1e-12, abs=1e-300)
    half = c.lower_bound_parts(rows / 2, kv / 2, pf / 2, pc / 2)
    for key in ("memory_seconds", "compute_seconds", "comm_seconds"):
        assert 2 * half[key] == pytest.approx(p[key], rel=1e-12, abs=1e-300)


def test_lower_bound_is_tight_for_one_step():
    c = qwen(tp=2)
    for rows, kv, pf in ((1, 128, 0), (4000, 4000 * 16, 0), (0, 0, 4096)):
        pc = pf * (pf + 1) // 2
        assert c.lower_bound_seconds(steps=1, decode_tokens=rows, kv_tokens_read=kv, prefill_tokens=pf,
                                     prefill_context=pc) == pytest.approx(c.seconds(rows, kv, pf, pc), rel=1e-12)
    with pytest.raises(InvalidArgument, match="'steps'"):
        c.lower_bound_seconds(steps=-1, decode_tokens=1, kv_tokens_read=1)


@settings(max_examples=200, deadline=None)
@given(steps=st.integers(0, 5000), rows=st.integers(0, 600), kv=st.integers(0, 10**7), prefill=st.integers(0, 20000),
       context=st.integers(0, 10**8), tp=st.sampled_from([1, 2, 8]), gpu=st.sampled_from(["h100", "a100", "l40s"]),
       separate=st.booleans())
def test_the_float_segment_price_is_the_vectorised_one(steps, rows, kv, prefill, context, tp, gpu, separate):
    """StepCost.segment_seconds_float (what simulators price every event with) equals segment_seconds."""
    cost = qwen("qwen3-8b", gpu, tp=tp, separate_attention=separate)
    exact = float(cost.segment_seconds(steps, rows, kv, prefill, context))
    assert cost.segment_seconds_float(steps, rows, kv, prefill, context) == pytest.approx(exact, rel=1e-12, abs=1e-15)
    loaded = rows * 37  # KV loaded from host memory in the first step
    exact = float(cost.segment_seconds(steps, rows, kv, prefill, context, loaded))
    assert exact == pytest.approx(float(cost.segment_seconds(steps, rows, kv, prefill, context))
                                  + (cost.load_seconds(loaded) if steps else 0.0), rel=1e-12, abs=1e-15)
    assert cost.segment_seconds_float(steps, rows, kv, prefill, context, loaded) == pytest.approx(
        exact, rel=1e-12, abs=1e-15)


def test_a_kv_load_from_host_memory_costs_latency_plus_bytes_over_the_host_link():
    """StepCost.load_seconds: latency + KV bytes / (PCIe bandwidth x efficiency) per GPU shard, the H100
    defaults as measured in two runs (benchmarks/results/kv_transfer_h100*.json); nothing for no token."""
    cost = qwen("qwen3-8b", "h100")
    assert (cost.host_bandwidth, cost.host_efficiency, cost.host_latency_seconds) == (64e9, 0.83, 0.3e-3)
    assert cost.load_seconds(0) == 0.0
    tokens = 4096
    assert cost.load_seconds(tokens) == pytest.approx(0.3e-3 + tokens * cost.kv_bytes_per_token / (64e9 * 0.83))
    for run in ("kv_transfer_h100.json", "kv_transfer_h100_run1.json"):  # 12.0 and 12.3 ms measured
        measured = json.loads((ROOT / "benchmarks" / "results" / run).read_text())
        (model,) = [m for m in measured["models"] if m["model"] == "qwen3-8b"]
        row = next(r for r in model["rows"] if r["tokens"] == tokens)
        assert cost.load_seconds(tokens) == pytest.approx(row["load_seconds"], rel=0.06)
    assert cost.load_seconds(tokens) < cost.seconds(0, 0, tokens, tokens * (tokens + 1) // 2) / 5  # recompute
    assert cost.replace(tp=2).load_seconds(tokens) == pytest.approx(0.3e-3 + (cost.load_seconds(tokens) - 0.3e-3) / 2)
    assert np.array_equal(cost.load_seconds(np.array([0, 0])), [0.0, 0.0])
    assert qwen("qwen3-8b", "a100").host_bandwidth == 32e9
    with pytest.raises(InvalidArgument, match="'loaded_tokens'"):
        cost.load_seconds(-1)
    with pytest.raises(InvalidArgument, match="'host_efficiency'"):
        cost.replace(host_efficiency=0)


def test_a_step_cost_file_written_before_the_host_link_reads_with_the_h100_defaults():
    cost = qwen("qwen3-1.7b", "h100")
    data = json.loads(cost.to_json())
    for name in ("host_bandwidth", "host_efficiency", "host_latency_seconds"):
        del data[name]
    assert StepCost.from_json(json.dumps(data)) == cost
