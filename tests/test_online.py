"""The online length predictor (lengthsched.online) and its evaluation (predictor_training.online_eval):
closed-form updates, censoring, history, drift, the protocol, the data loader, the cross-fitted
evaluation, the drift experiment, ``eval-predictor --online`` and its independence from torch."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lengthsched.cli import main
from lengthsched.errors import InvalidArgument
from lengthsched.online import OnlineLengthPredictor, fit_forgetting, fit_spreads, state_key
from lengthsched.predictor import LengthPredictor
from predictor_training.online_eval import (
    TARGETS,
    PromptGroup,
    check_targets,
    drift_experiment,
    evaluate_online,
    format_drift,
    format_online,
    limit_groups,
    load_groups,
    load_prior,
)

ROOT = Path(__file__).resolve().parent.parent
CASTILLO = ROOT / "lengthsched" / "data" / "castillo_qwen2.5-7b_lengths.jsonl"
FAST = settings(max_examples=60, deadline=None)


def lognormal_groups(n: int, size: int = 10, *, within: float = 0.18, seed: int = 0) -> dict[str, list[int]]:
    """``n`` prompts whose mean log length is N(6, 0.8) and whose samples scatter by ``within`` (about
    CASTILLO's spreads: 0.8 between prompts, 0.18 within)."""
    rng = np.random.default_rng(seed)
    means = rng.normal(6.0, 0.8, n)
    return {f"p{i}": np.maximum(1, np.rint(np.exp(m + within * rng.standard_normal(size)))).astype(int).tolist()
            for i, m in enumerate(means)}


def closed_form(prior_tokens: float, prior_sigma: float, within: float, logs: list[float],
                weights: list[float] | None = None) -> tuple[float, float]:
    weights = [1.0] * len(logs) if weights is None else weights
    precision = 1 / prior_sigma ** 2 + sum(weights) / within ** 2
    mean = (math.log(prior_tokens) / prior_sigma ** 2 + sum(w * y for w, y in zip(weights, logs)) / within ** 2)
    return mean / precision, 1 / precision


# ---------------------------------------------------------------------------------------------- the predictor
@FAST
@given(st.floats(20, 5000), st.floats(0.1, 2.0), st.floats(0.05, 1.0), st.lists(st.integers(1, 20000), max_size=8))
def test_belief_is_the_normal_posterior(prior, prior_sigma, within, lengths):
    p = OnlineLengthPredictor(prior, prior_sigma=prior_sigma, within_sigma=within)
    for i, y in enumerate(lengths):
        p.observe("x", y, completion=i)
    mean, var = p.belief("x")
    want_mean, want_var = closed_form(prior, prior_sigma, within, [math.log(y) for y in lengths])
    assert mean == pytest.approx(want_mean, rel=1e-9, abs=1e-9) and var == pytest.approx(want_var, rel=1e-9)
    # with the normal residual law the point prediction is the predictive median exp(mean)
    assert p.predict(["x"]).lengths[0] == max(1, round(math.exp(mean)))


def test_a_finished_sibling_pulls_the_prediction_towards_it():
    base = OnlineLengthPredictor(400, prior_sigma=0.5, within_sigma=0.2).predict(["x"]).lengths[0]
    for y in (50, 3000):
        p = OnlineLengthPredictor(400, prior_sigma=0.5, within_sigma=0.2)
        p.observe("x", y)
        after = p.predict(["x"]).lengths[0]
        assert min(base, y) < after < max(base, y)
        assert abs(after - y) < abs(base - y)


@FAST
@given(st.integers(10, 5000), st.lists(st.integers(1, 5000), max_size=4), st.integers(0, 20000), st.booleans())
def test_a_running_sibling_never_lowers_the_prediction_of_a_fresh_one(prior, finished, running, empirical):
    spreads = fit_spreads(list(lognormal_groups(50, seed=1).values())) if empirical else {"within_sigma": 0.3}
    p = OnlineLengthPredictor(prior, prior_sigma=0.6, **spreads)
    for i, y in enumerate(finished):
        p.observe("x", y, completion=i)
    before = p.predict(["x"], quantiles=[0.9])
    p.observe("x", running, finished=False, completion="r")
    after = p.predict(["x"], quantiles=[0.9])
    # Exact Bayes never lowers it; the closed form (no running sibling) and the grid (with one) are two
    # quadratures of the same predictive, which may differ by rounding: a token in a thousand.
    assert after.lengths[0] >= before.lengths[0] * (1 - 1e-3) - 1
    assert after.quantile(0.9)[0] >= before.quantile(0.9)[0] * (1 - 1e-3) - 1


def test_a_running_sibling_never_lowers_the_prediction_of_a_long_running_one():
    p = OnlineLengthPredictor(401, prior_sigma=0.5, within_sigma=0.3)
    before = p.predict(["x"], [1073]).lengths[0]
    p.observe("x", 372, finished=False, completion="r")
    assert p.predict(["x"], [1073]).lengths[0] >= before


@FAST
@given(st.integers(10, 3000), st.lists(st.integers(1, 3000), max_size=4), st.integers(0, 20000), st.booleans())
def test_quantiles_are_monotone_and_above_the_point_and_the_total_exceeds_progress(prior, finished, progress,
                                                                                    empirical):
    spreads = fit_spreads(list(lognormal_groups(50, seed=2).values())) if empirical else {"within_sigma": 0.3}
    p = OnlineLengthPredictor(prior, prior_sigma=0.6, **spreads)
    for i, y in enumerate(finished):
        p.observe("x", y, completion=i)
    levels = [0.1, 0.5, 0.75, 0.9, 0.99]
    res = p.predict(["x", "x"], [0, progress], quantiles=levels)
    for i in range(2):
        qs = [int(res.quantile(q)[i]) for q in levels]
        assert qs == sorted(qs)
        assert all(q >= res.lengths[i] for q in qs[1:])
        assert res.lengths[i] >= 1  # predicted total = progress + remaining > progress


def test_a_straggler_keeps_a_positive_upper_quantile():
    p = OnlineLengthPredictor(500, prior_sigma=0.1, within_sigma=0.2)
    res = p.predict(["x"], [3000], quantiles=[0.9])
    assert res.quantile(0.9)[0] > 1


@pytest.mark.parametrize("forgetting", [1.0, 0.5])
def test_history_weights_decay_with_forgetting(forgetting):
    p = OnlineLengthPredictor(300, prior_sigma=0.5, within_sigma=0.2, forgetting=forgetting)
    p.observe("x", 100, step=0)
    p.observe("x", 200, step=1)
    mean, var = p.belief("x")
    want = closed_form(300, 0.5, 0.2, [math.log(100), math.log(200)], [forgetting, 1.0])
    assert (mean, var) == pytest.approx(want, rel=1e-9)
    p.set_step(3)  # two steps later: the step-0 sample weighs forgetting**3, the step-1 one forgetting**2
    want = closed_form(300, 0.5, 0.2, [math.log(100), math.log(200)], [forgetting ** 3, forgetting ** 2])
    assert p.belief("x") == pytest.approx(want, rel=1e-9)


def test_steps_only_move_forward():
    p = OnlineLengthPredictor(300)
    p.observe("x", 100, step=2)
    assert p.step == 2
    with pytest.raises(InvalidArgument, match="'step'"):
        p.set_step(1)
    with pytest.raises(InvalidArgument, match="'step'"):
        p.observe("x", 100, step=1)
    p.observe("y", 100, step=5)  # a later step starts it for everyone
    assert p.step == 5


@settings(max_examples=30, deadline=None)
@given(events=st.lists(st.tuples(st.sampled_from(["a", "b", "c", "d"]), st.integers(1, 3000), st.integers(0, 2)),
                       min_size=0, max_size=40),
       drift=st.booleans(), prior=st.sampled_from([None, 300]), later=st.lists(st.tuples(
           st.sampled_from(["a", "e"]), st.integers(1, 3000)), max_size=6))
def test_a_predictor_loaded_from_its_saved_state_predicts_and_learns_as_the_original(events, drift, prior, later):
    def made():
        return OnlineLengthPredictor(prior, drift=drift, default_length=256, max_new_tokens=4096)

    original, step = made(), 0
    for prompt, length, gap in events:
        step += gap
        original.observe(prompt, length, step=step)
    saved = json.loads(json.dumps(original.state_dict()))  # what a file holds
    loaded = made()
    loaded.load_state_dict(saved)
    asked = ["a", "b", "c", "d", "e"]

    def same():
        for q in (original, loaded):
            assert q.informed == original.informed
        a = original.predict(asked, quantiles=(0.1, 0.9))
        b = loaded.predict(asked, quantiles=(0.1, 0.9))
        assert np.array_equal(a.lengths, b.lengths) and all(np.array_equal(a.quantiles[k], b.quantiles[k])
                                                        for k in a.quantiles)

    same()
    for prompt, length in later:  # both go on learning alike
        for q in (original, loaded):
            q.observe(prompt, length, step=step + 1)
    same()


@settings(max_examples=30, deadline=None)
@given(events=st.lists(st.tuples(st.sampled_from(["a", "b", "c", "d", "e"]), st.integers(1, 3000), st.integers(0, 2)),
                       min_size=1, max_size=40),
       cuts=st.lists(st.integers(0, 39), max_size=5), drift=st.booleans(), prior=st.sampled_from([None, 300]))
def test_a_whole_state_and_the_partial_states_written_after_it_replay_to_where_the_original_stands(events, cuts,
                                                                                                   drift, prior):
    # a restarted trainer rank: its whole state written at the first cut, and at every later cut the statistics of
    # the prompts it observed since the cut before (a partial state); loading the first and replaying the others
    # gives the state it had at the last cut
    def made():
        return OnlineLengthPredictor(prior, drift=drift, default_length=256, max_new_tokens=4096)

    original, step, changed, files = made(), 0, set(), []
    marks = sorted(set(cuts) | {len(events)})
    for i, (prompt, length, gap) in enumerate(events):
        step += gap
        original.observe(prompt, length, step=step)
        changed.add(prompt)
        if i + 1 in marks:
            state = original.state_dict() if not files else original.state_dict(prompts=sorted(changed))
            files.append(json.loads(json.dumps(state)))
            changed.clear()
    resumed = made()
    resumed.load_state_dict(files[0])
    for state in files[1:]:
        resumed.replay_state_dict(state)
    assert resumed.state_dict() == original.state_dict()
    asked = ["a", "b", "c", "d", "e", "f"]
    assert np.array_equal(resumed.predict(asked).lengths, original.predict(asked).lengths)
    if len(files) > 1 and files[0]["step"] < files[-1]["step"]:  # replaying an older state is refused
        with pytest.raises(InvalidArgument, match="state step"):
            resumed.replay_state_dict({**files[-1], "step": files[0]["step"]})
        assert resumed.state_dict() == original.state_dict()


def test_a_saved_state_that_is_wrong_is_refused_and_changes_nothing():
    p = OnlineLengthPredictor(default_length=256)
    p.observe("a", 100)
    before = p.state_dict()
    good = json.loads(json.dumps(before))
    for bad in [{}, {**good, "format": "x"}, {**good, "step": -1}, {**good, "prompts": {"a": [1, 2]}},
                {**good, "count": float("nan")}, {**good, "prompts": {"a": [None, 0, 1] + ["x"] * 11}}, [1]]:
        with pytest.raises(InvalidArgument, match="state"):
            p.load_state_dict(bad)
        assert p.state_dict() == before
    q = OnlineLengthPredictor(default_length=256)
    q.observe(("tuple", "key"), 100)
    with pytest.raises(InvalidArgument, match="prompt"):
        q.state_dict()


@settings(max_examples=30, deadline=None)
@given(ranks=st.integers(2, 4), epochs=st.integers(1, 4), seed=st.integers(0, 2**16), partial=st.booleans())
def test_ranks_that_merge_each_others_states_every_step_predict_as_one_predictor_that_saw_everything(ranks, epochs,
                                                                                                    seed, partial):
    # AReaL's ranks: every epoch the prompts are dealt to the ranks afresh (a shuffled DistributedSampler), each
    # rank predicts and then learns its own groups, and after each step every rank takes in the others' states:
    # whole, or (partial) only the prompts each observed in that step, as GroupRouter's change files carry them
    rng = np.random.default_rng(seed)
    prompts = [f"p{i}" for i in range(8)]

    def made():
        return OnlineLengthPredictor(300, default_length=256, max_new_tokens=4096)

    whole, apart = made(), [made() for _ in range(ranks)]
    step = 0
    for _ in range(epochs):
        order = rng.permutation(len(prompts))
        for start in range(0, len(order), 4):  # steps of 4 groups, group g on rank g mod ranks
            seen: list[list[str]] = [[] for _ in apart]
            for g, i in enumerate(order[start:start + 4]):
                lengths = rng.integers(1, 3000, size=int(rng.integers(1, 5)))
                whole.predict([prompts[i]])
                apart[g % ranks].predict([prompts[i]])
                seen[g % ranks].append(prompts[i])
                for n in lengths:
                    whole.observe(prompts[i], int(n), step=step)
                    apart[g % ranks].observe(prompts[i], int(n), step=step)
            step += 1
            for q in [whole, *apart]:
                q.set_step(step)
            saved = [json.loads(json.dumps(q.state_dict(prompts=mine if partial else None)))
                     for q, mine in zip(apart, seen)]
            for k, q in enumerate(apart):
                for j, other in enumerate(saved):
                    if j != k:
                        q.merge_state_dict(other)
    expected = whole.predict(prompts, quantiles=(0.1, 0.9))
    for q in apart:
        got = q.predict(prompts, quantiles=(0.1, 0.9))
        assert np.allclose(got.lengths, expected.lengths, rtol=1e-12)
        assert all(np.allclose(got.quantiles[k], expected.quantiles[k], rtol=1e-12) for k in expected.quantiles)


def test_a_merge_keeps_the_more_recent_statistics_and_refuses_a_wrong_state():
    a, b = OnlineLengthPredictor(300), OnlineLengthPredictor(300)
    a.observe("x", 100, step=0)
    a.observe("y", 200, step=0)
    b.observe("x", 900, step=3)  # b saw x later: a takes b's x, keeps its own y
    before_y = a.predict(["y"]).lengths[0]
    assert a.merge_state_dict(b.state_dict()) == 1
    assert a.step == 0 and a.predict(["x"]).lengths[0] == b.predict(["x"]).lengths[0] > 300
    assert a.predict(["y"]).lengths[0] == before_y
    a.observe("x", 800, step=0)  # b's later step was taken as a's own: a goes on observing at its step
    assert a.merge_state_dict(a.state_dict()) == 0  # its own statistics coming back change nothing
    b_x = b.predict(["x"]).lengths[0]
    assert b.merge_state_dict(a.state_dict()) == 1  # b takes a's y; its own x stays (step 3 is later than a's 0)
    a.set_step(3)  # at b's step, a's y is three steps old for both
    assert b.predict(["x"]).lengths[0] == b_x and b.predict(["y"]).lengths[0] == a.predict(["y"]).lengths[0]
    before = a.state_dict()
    for bad in [{}, {**before, "format": "x"}, {**before, "prompts": {"x": [1]}}, [1]]:
        with pytest.raises(InvalidArgument, match="state"):
            a.merge_state_dict(bad)
        assert a.state_dict() == before


def test_a_prompt_only_predicted_elsewhere_never_replaces_what_was_observed_here():
    # rank b asked for p (its group in flight, nothing back) at a later step than rank a observed p: a keeps what
    # it knows of p (before, the empty statistics of b's later step won, and a predicted p as a new prompt)
    a, b = OnlineLengthPredictor(default_length=100), OnlineLengthPredictor(default_length=100)
    for x in (1000, 1100, 900, 1200):
        a.observe("p", x, step=1)
    for x in (10, 11, 9, 12):
        a.observe("q", x, step=1)
    a.set_step(3)
    b.set_step(3)
    b.predict(["p", "new"])
    before = a.predict(["p", "q"]).lengths
    assert before[0] > 500
    a2 = OnlineLengthPredictor(default_length=100)
    a2.load_state_dict(a.state_dict())
    assert a2.merge_state_dict(b.state_dict()) == 0 and "new" not in a2.state_dict()["prompts"]
    assert np.array_equal(a2.predict(["p", "q"]).lengths, before)
    b.merge_state_dict(a.state_dict())  # b takes a's p (b knew nothing of it): then b knows it too
    assert b.predict(["p"]).lengths[0] > 500


def test_a_partial_state_holds_only_the_prompts_asked_for_and_cannot_be_loaded():
    p = OnlineLengthPredictor(default_length=100)
    long_text = "Solve: " + "y" * 200
    for key, x in (("a", 50), ("b", 60), (long_text, 70)):
        p.observe(key, x)
    part = p.state_dict(prompts=["b", long_text, "never seen"])
    assert part["partial"] is True and p.state_dict()["partial"] is False
    assert sorted(part["prompts"]) == sorted(["b", state_key(long_text)])
    with pytest.raises(InvalidArgument, match="partial"):
        OnlineLengthPredictor(default_length=100).load_state_dict(part)
    q = OnlineLengthPredictor(default_length=100)
    assert q.merge_state_dict(part) == 2 and q.predict(["b"]).lengths[0] == p.predict(["b"]).lengths[0]


def test_long_prompts_are_kept_and_saved_under_a_digest_and_the_prior_reads_their_text():
    from lengthsched.online import KEY_CHARS, state_key

    long_text = "Solve: " + "x" * 500
    short = "p1"
    assert state_key(short) == short and state_key(long_text).startswith("blake2b:")
    assert len(state_key(long_text)) < KEY_CHARS < len(long_text) and state_key(long_text) == state_key(long_text)
    seen = []

    class Prior:  # a trained predictor reads the prompt's text
        def predict(self, prompts, prefixes=None, **kwargs):
            seen.extend(prompts)
            return OnlineLengthPredictor(700).predict(prompts)

    p = OnlineLengthPredictor(Prior(), default_length=256)
    for n in (900, 1000, 1100):
        p.observe(long_text, n)
    asked = p.predict([long_text, long_text + "!", short])
    assert seen == [long_text, long_text + "!", short]  # the text, each once
    saved = json.loads(json.dumps(p.state_dict()))
    assert long_text not in json.dumps(saved) and state_key(long_text) in saved["prompts"]
    q = OnlineLengthPredictor(Prior(), default_length=256)
    q.load_state_dict(saved)
    assert np.array_equal(q.predict([long_text, short]).lengths, asked.lengths[[0, 2]])
    legacy = {**saved, "prompts": {long_text: saved["prompts"][state_key(long_text)]}}  # saved before digests
    r = OnlineLengthPredictor(Prior(), default_length=256)
    r.load_state_dict(legacy)
    assert r.predict([long_text]).lengths[0] == asked.lengths[0] and set(r.state_dict()["prompts"]) == {
        state_key(long_text)}


def test_a_predictor_that_has_seen_nothing_takes_the_empirical_prior_from_a_merge():
    seen, fresh = OnlineLengthPredictor(default_length=256), OnlineLengthPredictor(default_length=256)
    for n in (900, 1100, 1000):
        seen.observe("x", n)
    assert not fresh.informed
    fresh.merge_state_dict(seen.state_dict())
    assert fresh.informed
    assert fresh.predict(["new"]).lengths[0] == seen.predict(["new"]).lengths[0] != 256


def test_drift_is_estimated_from_prompts_seen_in_consecutive_steps():
    rng = np.random.default_rng(0)
    growth = math.log(1.05)
    flat = OnlineLengthPredictor(300, within_sigma=0.2, drift=False)
    tracked = OnlineLengthPredictor(300, within_sigma=0.2, drift=True)
    for step in range(6):
        for i in range(30):
            for y in np.exp(5.5 + 0.01 * i + growth * step + 0.2 * rng.standard_normal(8)):
                for p in (flat, tracked):
                    p.observe(f"p{i}", max(1, int(round(y))), step=step)
    tracked.set_step(6)
    flat.set_step(6)
    assert flat.drift_per_step == 0.0
    assert tracked.drift_per_step == pytest.approx(growth, abs=0.01)
    # the drift-corrected belief sits nearer the current level (step 6) than the flat one
    truth = 5.5 + growth * 6
    assert abs(tracked.belief("p0")[0] - truth) < abs(flat.belief("p0")[0] - truth)


@pytest.mark.parametrize(("call", "name"), [
    (lambda: OnlineLengthPredictor("abc"), "prior"),
    (lambda: OnlineLengthPredictor(-5), "prior"),
    (lambda: OnlineLengthPredictor(within_sigma=0), "within_sigma"),
    (lambda: OnlineLengthPredictor(prior_sigma=float("nan")), "prior_sigma"),
    (lambda: OnlineLengthPredictor(prior_bias=float("inf")), "prior_bias"),
    (lambda: OnlineLengthPredictor(forgetting=1.5), "forgetting"),
    (lambda: OnlineLengthPredictor(default_length=0), "default_length"),
    (lambda: OnlineLengthPredictor(max_new_tokens=0), "max_new_tokens"),
    (lambda: OnlineLengthPredictor(residual_quantiles=[0.0, 1.0]), "residual_quantiles"),
    (lambda: OnlineLengthPredictor().observe("x", 0), "length"),
    (lambda: OnlineLengthPredictor().observe("x", 2.5), "length"),
    (lambda: OnlineLengthPredictor().observe("x", 10, finished=False), "completion"),
    (lambda: OnlineLengthPredictor().predict(["x"], quantiles=[1.0]), "quantiles"),
    (lambda: OnlineLengthPredictor().predict(["x"], [1, 2]), "prefixes"),
    (lambda: OnlineLengthPredictor.fit({}), "groups"),
    (lambda: fit_spreads([[5]]), "groups"),
    (lambda: fit_spreads([[5, 6]], [1.0, 2.0]), "prior_lengths"),
])
def test_bad_inputs_name_the_argument(call, name):
    with pytest.raises(InvalidArgument, match=f"'{name}'"):
        call()


def test_fit_recovers_the_spreads():
    groups = lognormal_groups(400, within=0.3, seed=3)
    fitted = OnlineLengthPredictor.fit(groups)
    assert fitted.within_sigma == pytest.approx(0.3, rel=0.05)
    # a prior whose log error is N(0.2, 0.4): its bias and spread come back
    rng = np.random.default_rng(4)
    prior = {p: float(np.exp(np.mean(np.log(v)) + 0.2 + 0.4 * rng.standard_normal())) for p, v in groups.items()}
    fitted = OnlineLengthPredictor.fit(groups, prior, forgetting=0.7)
    assert fitted.prior_bias == pytest.approx(-0.2, abs=0.06)
    assert fitted.prior_sigma == pytest.approx(0.4, rel=0.15)
    assert fitted.forgetting == 0.7  # explicit options win


def test_it_is_a_length_predictor():
    p = OnlineLengthPredictor(ConstantPrior())
    assert isinstance(p, LengthPredictor)
    res = p.predict(["a", "b"], [None, [1, 2, 3]], quantiles=[0.9])
    assert res.lengths.shape == (2,) and res.quantile(0.9).shape == (2,)


class ConstantPrior:
    def predict(self, prompts, prefixes=None, *, quantiles=()):
        from lengthsched.predictor import LengthPrediction

        return LengthPrediction(np.full(len(prompts), 250))


# ---------------------------------------------------------------------------------------------- data
def write(path: Path, lines: list) -> Path:
    path.write_text("\n".join(x if isinstance(x, str) else json.dumps(x) for x in lines) + "\n")
    return path


def test_load_groups_reads_castillo_and_traces_with_history(tmp_path):
    groups = load_groups(CASTILLO, splits=["validate"])
    assert len(groups) == 1422 and all(len(g.lengths) == 10 and g.split == "validate" for g in groups.values())
    assert len(limit_groups(groups, 3)) == 15  # 3 per dataset
    trace = write(tmp_path / "trace.jsonl", [
        {"prompt_id": "a", "prompt_tokens": 12, "lengths": [10, 20], "step": 0},
        {"prompt_id": "b", "prompt_tokens": 5, "lengths": [7, 9, 11], "predicted": [8, 8, 8]},
        "",
        {"prompt_id": "a", "prompt_tokens": 12, "lengths": [30, 40], "step": 3, "split": "train"},
        {"prompt_id": "a", "prompt_tokens": 12, "lengths": [50], "step": 3},
    ])
    groups = load_groups(trace)
    assert list(groups) == ["a", "b"]
    assert sorted(groups["a"].steps) == [0, 3] and groups["a"].steps[3].tolist() == [30, 40, 50]
    assert groups["a"].lengths.tolist() == [10, 20, 30, 40, 50] and groups["a"].prompt_tokens == 12


def test_load_groups_reads_the_simulators_rollout_traces(tmp_path):
    from simulate.workloads import Group, write_trace

    path = tmp_path / "rollout.jsonl"
    write_trace(path, [Group("a", 5, np.array([3, 4]), step=0), Group("a", 5, np.array([5, 6]), step=2),
                       Group("b", 7, np.array([1, 2]), predicted=np.array([2, 2]))])
    groups = load_groups(path)
    assert {s: v.tolist() for s, v in groups["a"].steps.items()} == {0: [3, 4], 2: [5, 6]}
    assert groups["b"].steps[0].tolist() == [1, 2] and groups["b"].prompt_tokens == 7


@pytest.mark.parametrize(("line", "what"), [
    ("{not json", "JSON"),
    ('["a list"]', "JSON object"),
    ({"lengths": [1, 2]}, "prompt_id"),
    ({"prompt_id": "a"}, "lengths"),
    ({"prompt_id": "a", "lengths": [0, 5]}, "lengths"),
    ({"prompt_id": "a", "lengths": [5, 6], "step": -1}, "step"),
    ({"prompt_id": "a", "lengths": [5, 6], "step": 1.5}, "step"),
    ({"prompt_id": "a", "lengths": [5, 6], "prompt_tokens": "many"}, "prompt_tokens"),
    ({"prompt_id": "a", "lengths": [5, 6], "predicted": [5]}, "predicted"),
    ({"prompt_id": "a", "lengths": [5, 6], "split": 3}, "split"),
])
def test_load_groups_names_the_file_and_line_of_a_bad_line(tmp_path, line, what):
    path = write(tmp_path / "bad.jsonl", [{"prompt_id": "ok", "lengths": [3, 4]}, line])
    with pytest.raises(InvalidArgument, match="'online'") as info:
        load_groups(path, argument="online")
    # the message shortens a long value: the full one is kept on the error
    assert info.value.value == f"{path} line 2" and what in str(info.value)


def test_load_groups_and_load_prior_reject_unusable_files(tmp_path):
    with pytest.raises(InvalidArgument, match="readable"):
        load_groups(tmp_path / "missing.jsonl")
    with pytest.raises(InvalidArgument, match="at least one group"):
        load_groups(write(tmp_path / "empty.jsonl", [""]))
    with pytest.raises(InvalidArgument, match="split"):
        load_groups(write(tmp_path / "t.jsonl", [{"prompt_id": "a", "lengths": [1, 2], "split": "train"}]),
                    splits=["validate"])
    prior = tmp_path / "prior.json"
    prior.write_text(json.dumps({"id": ["a", "b"], "seed0": [100, 400], "seed1": [400, 100], "fold": [0, 1]}))
    assert load_prior(prior) == pytest.approx({"a": 200.0, "b": 200.0})
    prior.write_text(json.dumps({"a": 10, "b": -1}))
    with pytest.raises(InvalidArgument, match="'prior'"):
        load_prior(prior)


# ---------------------------------------------------------------------------------------------- evaluation
@pytest.fixture(scope="module")
def clean_evaluation():
    return evaluate_online(lognormal_groups(300, seed=5), siblings=(0, 1, 5, -1), bootstrap=20)


def test_evaluate_online_meets_the_targets_on_clean_lognormal_groups(clean_evaluation):
    ev = clean_evaluation
    rows = {(r["order"], r["siblings"], r["history"], r["method"]): r for r in ev["rows"]}
    assert ev["protocol"]["prompts"] == 300 and len(ev["fitted"]) == 2
    assert ev["fitted"][0]["within_sigma"] == pytest.approx(0.18, rel=0.1)
    one, five = rows[("finish", "1", False, "online")], rows[("finish", "5", False, "online")]
    assert one["pairs"] == 300 * 9 and five["pairs"] == 300 * 5
    assert one["tau_b"] >= TARGETS["tau_one"] and five["tau_b"] >= TARGETS["tau_five"]
    assert one["tau_b_ci"][0] < one["tau_b"] < one["tau_b_ci"][1]
    lo, hi = TARGETS["coverage"]
    for r in ev["rows"]:
        if r["method"] == "online":
            assert lo <= r["coverage"] <= hi, r  # calibrated in every reveal order on data the model fits
        if r["method"] == "online" and r["order"] == "random" and not r["history"]:
            assert r["tau_b"] >= rows[(r["order"], r["siblings"], False, "ceiling")]["tau_b"] - 0.01
    # history: 5 earlier samples rank the current ones better than one sibling revealed at random
    assert rows[("-", "0", True, "online")]["tau_b"] > rows[("random", "1", False, "online")]["tau_b"]
    assert rows[("-", "0", False, "prior")]["tau_b"] < 0.2  # the running mean alone ranks nothing
    # with history the groups hold 5: all but one is 4, and -1 is not repeated as its own row
    assert {r["siblings"] for r in ev["rows"] if r["history"]} == {"0", "1", "n-1"}
    met = {t["target"]: t["met"] for t in check_targets(ev)}
    assert met["tau-b >= 0.80 after one finished sibling"] and met["tau-b >= 0.85 with five finished siblings"]
    assert "finish" in format_online(ev) and "n-1" in format_online(ev)


def test_finish_order_coverage_after_one_sibling_on_clean_groups(clean_evaluation):
    row = next(r for r in clean_evaluation["rows"] if r["method"] == "online" and r["order"] == "finish"
               and r["siblings"] == "1" and not r["history"])
    assert row["coverage"] >= TARGETS["coverage"][0]


def test_evaluate_online_with_priors_and_trace_history():
    rng = np.random.default_rng(6)
    groups = {}
    for i in range(120):
        tokens = int(rng.integers(20, 2000))
        mean = 2.0 + 0.6 * math.log(tokens) + 0.3 * rng.standard_normal()
        steps = {s: np.maximum(1, np.rint(np.exp(mean + 0.05 * s + 0.2 * rng.standard_normal(4)))).astype(np.int64)
                 for s in (0, 2, 3)}
        groups[f"p{i}"] = PromptGroup(f"p{i}", steps, tokens)
    reg = evaluate_online(groups, siblings=(0, 1), prior="regression", bootstrap=0)
    none = evaluate_online(groups, siblings=(0, 1), prior="none", bootstrap=0)
    pick = lambda ev, h: next(r for r in ev["rows"] if r["siblings"] == "0" and r["history"] == h)  # noqa: E731
    assert pick(reg, False)["tau_b"] > 0.3 > pick(none, False)["tau_b"]  # the regression ranks prompts, a mean cannot
    assert pick(reg, True)["pairs"] == 120 * 4 * 2  # steps 2 and 3 have history; step 0 has none
    assert pick(reg, False)["pairs"] == 120 * 4 * 3
    mapping = {p: float(np.exp(np.mean(np.log(g.lengths)))) for p, g in groups.items()}
    oracle = evaluate_online(groups, siblings=(0,), prior=mapping, bootstrap=0, history=(False,), prior_name="oracle")
    assert oracle["rows"][0]["prior"] == "oracle" and oracle["rows"][0]["tau_b"] > pick(reg, False)["tau_b"]
    with pytest.raises(InvalidArgument, match="'prior'"):
        evaluate_online(groups, prior={"p0": 10.0})
    with pytest.raises(InvalidArgument, match="'prior'"):
        evaluate_online(groups, prior="bert")
    with pytest.raises(InvalidArgument, match="'orders'"):
        evaluate_online(groups, orders=("sorted",))
    with pytest.raises(InvalidArgument, match="'siblings'"):
        evaluate_online(groups, siblings=(-2,))
    with pytest.raises(InvalidArgument, match="'groups'"):
        evaluate_online({"a": [5, 6]})


def test_drift_experiment_follows_growth_where_a_frozen_predictor_falls_behind():
    groups = lognormal_groups(60, seed=7)
    res = drift_experiment(groups, steps=8, growth=0.05, forgettings=(1.0, 0.5), burn_in=3)
    by = {c["name"]: c for c in res["configs"]}
    assert set(by) == {"forgetting 1", "forgetting 1, drift", "forgetting 0.5", "forgetting 0.5, drift",
                       "frozen after step 0"}
    tracked, frozen = by["forgetting 0.5, drift"], by["frozen after step 0"]
    assert tracked["per_step"][-1]["drift_per_step"] == pytest.approx(math.log(1.05), abs=0.01)
    assert tracked["max_ratio_after_burn_in"] <= TARGETS["drift_ratio"]
    assert frozen["max_ratio_after_burn_in"] > by["forgetting 1"]["max_ratio_after_burn_in"] > 1.2  # both lag
    assert len(tracked["per_step"]) == 8
    assert tracked["per_step"][5]["mean_length"] > tracked["per_step"][0]["mean_length"]
    assert check_targets(drift=res)[0]["met"]
    assert "frozen" in format_drift(res)
    with pytest.raises(InvalidArgument, match="'burn_in'"):
        drift_experiment(groups, steps=3, burn_in=3)


# ---------------------------------------------------------------------------------------------- the command
@pytest.fixture()
def small_trace(tmp_path) -> Path:
    groups = lognormal_groups(60, seed=8)
    return write(tmp_path / "groups.jsonl", [{"prompt_id": p, "prompt_tokens": 100 + i, "lengths": v}
                                             for i, (p, v) in enumerate(groups.items())])


def test_cli_online_prints_tables_and_json(small_trace, tmp_path, capsys):
    assert main(["eval-predictor", "--online", str(small_trace), "--bootstrap", "0", "--siblings", "0,1,5"]) == 0
    out = capsys.readouterr().out
    assert "online predictor, prior none: 60 prompts" in out and "targets" in out and "| finish |" in out
    out_file = tmp_path / "res.json"
    assert main(["eval-predictor", "--online", str(small_trace), "--bootstrap", "0", "--siblings", "1",
                 "--online-prior", "regression", "--drift-steps", "4", "--json", "--output", str(out_file)]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed == json.loads(out_file.read_text())
    assert printed["evaluation"]["protocol"]["prior"] == "regression" and len(printed["drift"]["configs"]) == 9


@pytest.mark.parametrize(("args", "name"), [
    (["--online", "missing.jsonl"], "online"),
    (["--online", "{trace}", "--siblings", "one"], "siblings"),
    (["--online", "{trace}", "--online-prior", "missing.json"], "online_prior"),
    (["--online", "{trace}", "--model", "pred"], "model"),
    (["--online", "{trace}", "--split", "validate"], "online"),
    (["--online", "{trace}", "--drift-steps", "1"], "drift_steps"),
    (["--drift-steps", "5"], "drift_steps"),
])
def test_cli_online_bad_input_names_the_flag(small_trace, capsys, args, name):
    args = [a.replace("{trace}", str(small_trace)) for a in args]
    assert main(["eval-predictor", *args, "--bootstrap", "0"] if "--online" in args else
                ["eval-predictor", *args]) == 2
    assert f"argument '{name}'" in capsys.readouterr().err


def test_the_online_path_never_imports_torch(small_trace):
    code = textwrap.dedent(f"""
        import sys

        class Block:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in ("torch", "transformers", "datasets", "sklearn", "accelerate"):
                    raise ImportError("blocked heavy import: " + name)
                return None

        sys.meta_path.insert(0, Block())
        import predictor_training.online_eval
        from lengthsched.cli import main
        assert main(["eval-predictor", "--online", {str(small_trace)!r}, "--bootstrap", "0", "--siblings", "1",
                     "--drift-steps", "3"]) == 0
        leaked = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "transformers", "datasets"))
        assert not leaked, leaked
        print("ok")
        """)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=False)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().endswith("ok")


def test_the_benchmark_runs_quick(tmp_path):
    out = tmp_path / "online.json"
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_online.py"), "--quick", "--out",
                             str(out), "--sections", "siblings,drift,speed"],
                            capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    data = json.loads(out.read_text())
    assert {"machine", "siblings", "drift", "speed"} <= set(data)
    assert {"none", "regression"} <= set(data["siblings"]["evaluations"])
    assert "### Targets (siblings)" in result.stdout and "### Drift" in result.stdout
    speed = data["speed"]  # the two lookups answer alike (timings are for benchmarks/, not asserted)
    assert speed["queries"] > 0 and speed["log_sf_max_difference"] < 1e-9
    assert speed["predict_max_difference_tokens"] < 1.0
    assert "### Online predictor speed" in result.stdout


# ---------------------------------------------------------------------------------------------- per-prompt laws
def mixed_groups(n: int, size: int = 10, *, seed: int = 0) -> dict[str, list[int]]:
    """``n`` prompts whose spreads differ (0.05 or 0.4, half each) and whose means have a long left
    tail (a fifth of them short answers around exp(3.5)): what one spread and a normal prior miss."""
    rng = np.random.default_rng(seed)
    short = rng.random(n) < 0.2
    means = np.where(short, rng.normal(3.5, 0.5, n), rng.normal(6.2, 0.4, n))
    spreads = np.where(rng.random(n) < 0.5, 0.05, 0.4)
    return {f"q{i}": np.maximum(1, np.rint(np.exp(m + s * rng.standard_normal(size)))).astype(int).tolist()
            for i, (m, s) in enumerate(zip(means, spreads))}


@FAST
@given(st.sampled_from(["normal", "student", "skewed"]),
       st.lists(st.one_of(st.floats(-60, 60), st.sampled_from([math.inf, -math.inf, math.nan, 40.0, -40.0,
                                                                39.99875, 1e200])), min_size=1, max_size=40))
def test_the_residual_tables_lookup_is_linear_interpolation_in_float64(law, z):
    """log_sf reads its evenly spaced table by index: it must equal np.interp over the table (zero below
    it, the normal tail's slope above it, NaN for NaN) to float64 rounding, for the normal and for
    empirical laws."""
    from lengthsched.online import _GRID, _TABLE_Z, _Residuals

    rng = np.random.default_rng(0)
    draws = {"normal": None, "student": rng.standard_t(3, 20000), "skewed": rng.lognormal(0.0, 0.8, 20000) - 1.0}[law]
    residuals = _Residuals(None if draws is None else np.quantile(draws, _GRID))
    z = np.array(z)
    table = residuals._log_sf
    inside = np.interp(z, _TABLE_Z, table, left=0.0, right=table[-1])
    expected = np.where(z > _TABLE_Z[-1], table[-1] - 0.5 * (np.minimum(z, 1e150) ** 2 - _TABLE_Z[-1] ** 2), inside)
    got = residuals.log_sf(z)
    assert got.shape == z.shape
    np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12)  # NaN where expected is NaN
    assert float(residuals.log_sf(np.float64(1.5))) == pytest.approx(float(residuals.log_sf(np.array([1.5]))[0]))


def test_fit_spreads_with_laws_recovers_a_spread_law_and_a_skewed_prior():
    groups = list(mixed_groups(600, seed=3).values())
    out = fit_spreads(groups, [math.exp(5.7)] * len(groups), laws=True)
    assert out["residual_quantiles"] is None
    values, weights = np.array(out["spread_values"]), np.array(out["spread_weights"])
    assert weights.sum() == pytest.approx(1.0)
    assert weights[values < 0.1].sum() == pytest.approx(0.5, abs=0.08)  # half the prompts scatter by 0.05
    assert weights[(values > 0.25) & (values < 0.6)].sum() == pytest.approx(0.5, abs=0.08)
    offsets, w = np.array(out["prior_offsets"]), np.array(out["prior_weights"])
    assert w[offsets + out["prior_bias"] < -1.0].sum() == pytest.approx(0.2, abs=0.06)  # the short answers
    with pytest.raises(InvalidArgument, match="'residual_quantiles'"):
        OnlineLengthPredictor(300, spread_values=[0.1, 0.2], spread_weights=[1, 1], residual_quantiles=[0.0] * 1999)
    with pytest.raises(InvalidArgument, match="'spread_values'"):
        OnlineLengthPredictor(300, spread_values=[0.1, -0.2], spread_weights=[1, 1])
    with pytest.raises(InvalidArgument, match="'prior_offsets'"):
        OnlineLengthPredictor(300, prior_offsets=[0.0], prior_weights=[1.0])


def test_a_prompts_own_spread_sets_the_width_of_its_interval():
    p = OnlineLengthPredictor.fit(mixed_groups(400, seed=4))
    for y in (500, 505, 495, 500):
        p.observe("tight", y)
    for y in (300, 800, 450, 650):
        p.observe("loose", y)
    res = p.predict(["tight", "loose"], quantiles=[0.1, 0.9])
    width = res.quantile(0.9) / res.quantile(0.1)
    assert width[0] < 1.2 < 2.0 < width[1]
    # the spread is the prompt's, not the step's: with a small forgetting (its earlier mean is old news)
    # one sibling of the new step places it, and the spread learnt before still sets the width
    widths = {}
    for keep in (1.0, 0.2):
        q = OnlineLengthPredictor.fit(mixed_groups(400, seed=4), forgetting=0.2, spread_forgetting=keep)
        for y in (500, 505, 495, 500):
            q.observe("tight", y, step=0)
        q.observe("tight", 700, step=3)
        res = q.predict(["tight"], quantiles=[0.1, 0.9])
        widths[keep] = res.quantile(0.9)[0] / res.quantile(0.1)[0]
    assert widths[1.0] < 1.3 and 1.5 * widths[1.0] < widths[0.2]


@pytest.fixture(scope="module")
def mixed_evaluation():
    return evaluate_online(mixed_groups(300, seed=6), siblings=(0, 1, 4, -1), history=(False,), bootstrap=0)


def test_the_per_prompt_laws_are_calibrated_where_one_spread_is_not(mixed_evaluation):
    lo, hi = TARGETS["coverage"]
    for r in mixed_evaluation["rows"]:
        if r["method"] != "ceiling":
            assert lo <= r["coverage"] <= hi, r  # every number of siblings, both orders, the prior alone
    pooled = evaluate_online(mixed_groups(300, seed=6), siblings=(0, -1), history=(False,), orders=("finish",),
                             bootstrap=0, laws=False)
    cov = {r["siblings"]: r["coverage"] for r in pooled["rows"] if r["method"] != "ceiling"}
    assert not lo <= cov["n-1"] <= hi or not lo <= cov["0"] <= hi  # what the pooled model got wrong
    assert mixed_evaluation["protocol"]["laws"] and not pooled["protocol"]["laws"]


@FAST
@given(st.lists(st.integers(1, 3000), max_size=5), st.lists(st.integers(0, 5000), max_size=3), st.integers(0, 6000),
       st.booleans())
def test_predictions_exceed_progress_and_quantiles_are_ordered_with_laws(finished, running, progress, own):
    p = OnlineLengthPredictor.fit(mixed_groups(200, seed=7), max_new_tokens=20000)
    for i, y in enumerate(finished):
        p.observe("x", y, completion=f"f{i}")
    for i, k in enumerate(running):
        p.observe("x", k, finished=False, completion=f"r{i}")
    levels = [0.1, 0.5, 0.75, 0.9, 0.99]
    ask = "r0" if own and running else None
    res = p.predict(["x", "x"], [progress, None], quantiles=levels, completions=[ask, ask])
    for i in range(2):
        qs = [int(res.quantile(q)[i]) for q in levels]
        assert qs == sorted(qs)  # so the coverage of a higher quantile is never lower
        assert min(qs) >= 1 and res.lengths[i] >= 1  # the predicted total exceeds the progress


def test_coverage_is_monotone_in_the_quantile(mixed_evaluation):
    groups = mixed_groups(120, seed=8)
    low = evaluate_online(groups, siblings=(1,), history=(False,), bootstrap=0, quantile=0.8)
    high = evaluate_online(groups, siblings=(1,), history=(False,), bootstrap=0, quantile=0.95)
    for a, b in zip(low["rows"], high["rows"]):
        if a["method"] != "ceiling":
            assert a["coverage"] <= b["coverage"] and a["tau_b"] == b["tau_b"]


# ---------------------------------------------------------------------------------------------- completions
@pytest.mark.parametrize("fitted", [False, True])
def test_a_completions_own_progress_is_its_lower_bound_not_its_siblings_evidence(fitted):
    make = (lambda: OnlineLengthPredictor.fit(mixed_groups(200, seed=9))) if fitted else \
        (lambda: OnlineLengthPredictor(400, prior_sigma=0.6, within_sigma=0.3))
    p = make()
    p.observe("x", 380)
    p.observe("x", 900, finished=False, completion="c")
    asked = p.predict(["x"], quantiles=[0.9], completions=["c"])
    # the same as a predictor that never saw c running, asked with c's progress as the prefix
    q = make()
    q.observe("x", 380)
    alone = q.predict(["x"], [900], quantiles=[0.9])
    assert 900 + asked.lengths[0] == pytest.approx(900 + alone.lengths[0], rel=0.01)
    assert 900 + asked.quantile(0.9)[0] == pytest.approx(900 + alone.quantile(0.9)[0], rel=0.01)
    # counted as its own evidence (the old behaviour: no completion id) it raises its own prediction
    counted = p.predict(["x"], [900], quantiles=[0.9])
    assert counted.lengths[0] >= asked.lengths[0]
    # another sibling's progress still counts: it raises c's prediction
    p.observe("x", 2000, finished=False, completion="d")
    assert p.predict(["x"], completions=["c"]).lengths[0] > asked.lengths[0]
    # a prefix below the observed progress does not lower the bound; None is a fresh completion
    both = p.predict(["x", "x"], [10, None], completions=["c", None])
    assert both.lengths[0] == p.predict(["x"], completions=["c"]).lengths[0]
    with pytest.raises(InvalidArgument, match="'completions'"):
        p.predict(["x", "x"], completions=["c"])


# ---------------------------------------------------------------------------------------------- empirical prior
def test_the_empirical_prior_follows_the_running_mean_with_forgetting():
    p = OnlineLengthPredictor(prior_sigma=0.5, within_sigma=0.2, forgetting=0.5, default_length=512)
    assert p.predict(["early"]).lengths[0] == 512  # first seen before anything is observed
    for i in range(50):
        p.observe(f"a{i}", 100)
    assert p.predict(["early"]).lengths[0] == 100  # not frozen at default_length
    p.set_step(2)
    for i in range(50):
        p.observe(f"b{i}", 1000)
    w = 0.5 ** 2  # the step-0 lengths weigh forgetting ** 2 now
    want = math.exp((w * 50 * math.log(100) + 50 * math.log(1000)) / (w * 50 + 50))
    assert p.predict(["early"]).lengths[0] == pytest.approx(want, abs=1)
    assert p.predict(["late"]).lengths[0] == pytest.approx(want, abs=1)


# ---------------------------------------------------------------------------------------------- forgetting
def test_fit_forgetting_keeps_history_without_drift_and_forgets_under_drift():
    rng = np.random.default_rng(11)
    means = rng.normal(6.0, 0.6, 60)

    def histories(walk: float) -> dict:
        out, m = {}, means.copy()
        for step in range(5):
            for i in range(60):
                out.setdefault(f"p{i}", {})[step] = np.exp(m[i] + 0.15 * rng.standard_normal(4)).round().astype(int) + 1
            m = m + walk * rng.standard_normal(60)  # each prompt's mean wanders between steps
        return out

    options = fit_spreads(list(lognormal_groups(100, seed=2).values()), [400] * 100, laws=True)
    flat, scores = fit_forgetting(histories(0.0), 400, **options)
    assert flat >= 0.9 and set(scores) == {1.0, 0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3}
    wandering, _ = fit_forgetting(histories(0.4), 400, **options)
    assert wandering <= 0.6
    with pytest.raises(InvalidArgument, match="'histories'"):
        fit_forgetting({"a": {0: [10, 20]}}, 400)  # no prompt with two steps: nothing to score


def test_the_evaluation_fits_the_forgetting_on_the_fit_half_unless_given():
    groups = lognormal_groups(60, seed=12)
    fitted = evaluate_online(groups, siblings=(0,), history=(True,), orders=("random",), bootstrap=0)
    assert all(f["forgetting"] >= 0.8 for f in fitted["fitted"])  # a split of one step: nothing drifts
    given = evaluate_online(groups, siblings=(0,), history=(True,), orders=("random",), bootstrap=0,
                            options={"forgetting": 0.5})
    assert all(f["forgetting"] == 0.5 for f in given["fitted"])


@pytest.mark.parametrize("fitted", [False, True])
def test_predict_with_completions_is_the_same_in_one_call_or_one_by_one(fitted):
    p = OnlineLengthPredictor.fit(mixed_groups(200, seed=13)) if fitted else OnlineLengthPredictor(300)
    p.observe("x", 200)
    p.observe("x", 300, finished=False, completion="c1")
    p.observe("x", 900, finished=False, completion="c2")
    p.observe("y", 50, finished=False, completion="c1")  # the same id under another prompt is another completion
    asks = [("x", "c1"), ("x", "c2"), ("x", None), ("y", "c1"), ("y", None), ("z", None)]
    together = p.predict([a for a, _ in asks], quantiles=[0.9], completions=[c for _, c in asks])
    for i, (prompt, completion) in enumerate(asks):
        alone = p.predict([prompt], quantiles=[0.9], completions=[completion])
        assert together.lengths[i] == alone.lengths[0] and together.quantile(0.9)[i] == alone.quantile(0.9)[0]
    assert together.lengths[1] < together.lengths[0]  # c2 is further along: less of it is left


def test_resumed_remaining_reads_the_finished_siblings_and_each_samples_progress():
    """A partial rollout's resumed group: a sample that outran its prediction is not nearly done, finished
    siblings longer than the prediction raise what the others have left, progress 0 without siblings is
    about the prediction itself, and the arguments are checked."""
    from lengthsched.online import resumed_remaining

    alone, outran, sibs = resumed_remaining([200, 200, 200], [[], [], [600, 640, 620]], [[0], [500], [0, 300]],
                                            within_sigma=0.1, max_new_tokens=4096)
    assert abs(int(alone[0]) - 200) <= 20
    assert outran[0] > 1 and outran[0] > max(1, 200 - 500)
    assert sibs[0] > 400 and 100 < sibs[1] < sibs[0]  # the group is long; the running one is partway
    assert [len(x) for x in resumed_remaining([100], [[50]], [[]])] == [0]
    assert resumed_remaining([], [], []) == []
    with pytest.raises(InvalidArgument, match="priors"):
        resumed_remaining([100, 100], [[]], [[0]])
    with pytest.raises(InvalidArgument, match="progress"):
        resumed_remaining([100], [[]], [[-1]])
    with pytest.raises(InvalidArgument, match="within_sigma"):
        resumed_remaining([100], [[]], [[0]], within_sigma=0)
    from lengthsched.integrations.rollout import remaining_after  # the piece the slime integration shares

    with pytest.raises(InvalidArgument, match="progress"):
        remaining_after(OnlineLengthPredictor(100), ["a", "b"], [[], []], [[0]])
    assert [x.tolist() for x in remaining_after(OnlineLengthPredictor(100), ["a"], [[]], [[]])] == [[]]


def test_copy_predictor_learns_apart_and_shares_the_model_it_holds():
    """lengthsched.predictor.copy_predictor: observations change only the copy; a prior that is a model
    (an object with predict) is the same object in both, not duplicated."""
    from lengthsched import OnlineLengthPredictor
    from lengthsched.predictor import ConstantLengthPredictor, copy_predictor

    prior = ConstantLengthPredictor(300)
    online = OnlineLengthPredictor(prior, prior_sigma=0.5)
    before = online.predict(["a"]).lengths.tolist()
    twin = copy_predictor(online)
    for n in (900, 950, 1000):
        twin.observe("a", n)
    assert twin.prior is prior and online.predict(["a"]).lengths.tolist() == before
    assert twin.predict(["a"]).lengths[0] > before[0]
    assert copy_predictor(7) == 7  # anything deep-copyable without attributes


def test_informed_says_whether_the_predictions_rest_on_anything():
    """Without a prior and before any length, every prompt is predicted default_length: not informed; one
    length told, or any prior, makes it informed."""
    bare = OnlineLengthPredictor(default_length=700)
    assert not bare.informed
    assert bare.predict(["a", "b"]).lengths.tolist() == [700, 700]
    bare.observe("a", 120)
    assert bare.informed
    assert OnlineLengthPredictor(prior=300).informed and OnlineLengthPredictor(prior={"a": 10}).informed


def test_a_mapping_prior_that_does_not_name_a_prompt_starts_it_from_the_running_mean():
    """A mapping prior is a partial table in RL (new prompts each epoch): a prompt it does not name is predicted as
    without a prior (the default length, then the running mean of what was observed); fit() on groups the mapping
    does not cover is an error naming the prior."""
    from lengthsched import OnlineLengthPredictor

    p = OnlineLengthPredictor(prior={"a": 300}, max_new_tokens=4096, default_length=512)
    assert p.predict(["a", "b"]).lengths.tolist() == [300, 512]
    p.observe("c", 1000, completion=0)
    assert p.predict(["b"]).lengths.tolist() == [1000]
    with pytest.raises(InvalidArgument, match="'prior'"):
        OnlineLengthPredictor.fit({"a": [100, 200], "b": [50, 60]}, prior={"a": 100})
