"""simulate.difficulty (DAPO's filter drawn from a model of prompt difficulty tied to length) and
lengthsched.filtering (the filter's history per prompt, the order that puts likely-kept groups first, and GRESO's
skip of the prompts it keeps dropping)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from scipy import stats

from lengthsched import InvalidArgument
from lengthsched.filtering import FilterHistory, SelectiveRollout, order_by_pass
from simulate.difficulty import (
    DEFAULT_DIFFICULTY,
    Difficulty,
    filter_passes,
    filter_sides,
    fit_difficulty,
    learnt_rates,
    pass_rates,
    record_epoch,
    rewarded,
    run_epochs,
    selective_stream,
)
from simulate.workloads import Group


def _groups(medians, g=16):
    return [Group(prompt_id=f"p{i}", prompt_len=10, lengths=np.full(g, m, dtype=np.int64))
            for i, m in enumerate(medians)]


@pytest.mark.slow
def test_the_default_difficulty_is_what_the_bundled_gsm8k_solutions_fit():
    fitted = fit_difficulty()
    assert fitted.alpha == pytest.approx(DEFAULT_DIFFICULTY.alpha, abs=5e-4)
    assert fitted.beta == pytest.approx(DEFAULT_DIFFICULTY.beta, abs=5e-4)
    assert fitted.correlation == pytest.approx(DEFAULT_DIFFICULTY.correlation, abs=0.01)


def test_the_fit_reads_the_share_of_correct_solutions_and_its_tie_to_length(tmp_path):
    """Labelled solutions where the long questions are the hard ones fit a negative correlation; the Beta law's
    mean is the share of correct solutions."""
    rng = np.random.default_rng(3)
    n = 2000
    z = rng.standard_normal(n)
    p = stats.beta.ppf(stats.norm.cdf(-0.8 * z + 0.6 * rng.standard_normal(n)), 2.0, 2.0)
    words = np.exp(4 + 0.4 * z[:, None] + 0.2 * rng.standard_normal((n, 4))).round().astype(int)
    correct = (rng.random((n, 4)) < p[:, None]).astype(int)
    path = tmp_path / "solutions.csv"
    header = ",".join(f"m{j}_{c}" for j in range(4) for c in ("words", "correct"))
    path.write_text(header + "\n" + "\n".join(",".join(f"{words[i, j]},{correct[i, j]}" for j in range(4))
                                              for i in range(n)) + "\n")
    fitted = fit_difficulty(path, draws=20_000)
    assert fitted.mean == pytest.approx(correct.mean(), abs=0.02)
    assert -0.95 < fitted.correlation < -0.6
    with pytest.raises(InvalidArgument, match="path"):
        fit_difficulty(tmp_path / "missing.csv")
    (tmp_path / "bad.csv").write_text("a,b\n1,2\n")
    with pytest.raises(InvalidArgument, match="path"):
        fit_difficulty(tmp_path / "bad.csv")


def test_longer_prompts_are_harder_and_their_groups_fail_the_filter_more_often():
    groups = _groups(np.geomspace(50, 4000, 4000).round())
    rates = pass_rates(groups, seed=1)
    assert stats.spearmanr(rates, [g.lengths[0] for g in groups])[0] < -0.4
    assert rates.mean() == pytest.approx(DEFAULT_DIFFICULTY.mean, abs=0.02)
    flags = filter_passes(rates, 16, seed=1)
    assert flags.mean() == pytest.approx(DEFAULT_DIFFICULTY.pass_share(16), abs=0.02)
    long, short = flags[2000:].mean(), flags[:2000].mean()
    assert long < short  # hard prompts fail together (all wrong), and they run long
    neutral = pass_rates(groups, Difficulty(0.709, 1.163, 0.0), seed=1)
    assert abs(stats.spearmanr(neutral, [g.lengths[0] for g in groups])[0]) < 0.05


def test_another_epoch_draws_the_rewards_again_from_the_same_rates():
    rates = np.array([0.0, 1.0, 0.5, 0.5, 0.02])
    a, b = rewarded(rates, 16, seed=3, epoch=0), rewarded(rates, 16, seed=3, epoch=1)
    assert a[0] == b[0] == 0 and a[1] == b[1] == 16
    assert np.array_equal(a, rewarded(rates, 16, seed=3, epoch=0))
    assert not np.array_equal(rewarded(np.full(50, 0.5), 16, seed=3, epoch=0),
                              rewarded(np.full(50, 0.5), 16, seed=3, epoch=1))
    assert filter_passes(rates, 16, seed=3).tolist()[:2] == [False, False]
    assert filter_passes(np.array([0.5]), 1).tolist() == [False]  # one completion: its rewards always agree


@given(st.floats(0.05, 20), st.floats(0.05, 20), st.integers(1, 64))
def test_the_expected_pass_share_is_the_beta_laws(alpha, beta, g):
    d = Difficulty(alpha, beta, 0.0)
    p = stats.beta.rvs(alpha, beta, size=200_000, random_state=0)
    assert d.pass_share(g) == pytest.approx(1 - np.mean(p ** g + (1 - p) ** g), abs=0.01)


def test_difficulty_arguments_are_checked():
    for bad in (dict(alpha=0.0, beta=1.0, correlation=0.0), dict(alpha=1.0, beta=-1.0, correlation=0.0),
                dict(alpha=1.0, beta=1.0, correlation=1.0), dict(alpha=True, beta=1.0, correlation=0.0)):
        with pytest.raises(InvalidArgument):
            Difficulty(**bad)
    with pytest.raises(InvalidArgument, match="difficulty"):
        pass_rates(_groups([10]), difficulty=(1, 1, 0))
    with pytest.raises(InvalidArgument, match="rates"):
        rewarded([0.5, 1.5], 16)
    with pytest.raises(InvalidArgument, match="group_size"):
        rewarded([0.5], 0)
    assert pass_rates([]).size == 0


# ----------------------------------------------------------------------------------------- the history
def test_the_history_estimates_each_prompts_chance_against_the_share_kept():
    h = FilterHistory(prior_strength=1.0, memory=None)
    assert not h.informed and h.share == 0.5
    assert h.pass_probability(["a"]).tolist() == [0.5]
    h.observe_many(["a", "b", "c", "d"], [True, True, True, False])
    assert h.informed and h.share == 0.75 and len(h) == 4
    p = h.pass_probability(["a", "d", "new"])
    assert p.tolist() == pytest.approx([(1 + 0.75) / 2, 0.75 / 2, 0.75])
    assert order_by_pass(p).tolist() == [0, 2, 1]


def test_the_history_forgets_beyond_its_memory():
    h = FilterHistory(memory=2)
    for kept in (False, False, True, True):
        h.observe("a", kept)
    assert h.pass_probability(["a"])[0] == pytest.approx((2 + 0.5) / 3)  # the last two only; share 2 of 4
    assert FilterHistory.from_dict(h.to_dict()).pass_probability(["a"])[0] == pytest.approx(
        (2 + 0.5) / 3)


@given(st.lists(st.floats(0, 1), max_size=30))
def test_the_order_puts_the_likely_kept_first_and_keeps_ties_in_order(p):
    order = order_by_pass(p)
    assert sorted(order.tolist()) == list(range(len(p)))
    q = np.asarray(p)[order]
    assert np.all(np.diff(q) <= 0)
    for a, b in zip(order, order[1:]):
        if p[a] == p[b]:
            assert a < b


def test_history_arguments_are_checked():
    for bad in (0, -1.0, float("nan"), True):
        with pytest.raises(InvalidArgument, match="prior_strength"):
            FilterHistory(prior_strength=bad)
    with pytest.raises(InvalidArgument, match="memory"):
        FilterHistory(memory=0)
    h = FilterHistory()
    with pytest.raises(InvalidArgument, match="kept"):
        h.observe("a", 1)
    with pytest.raises(InvalidArgument, match="key"):
        h.observe(["a"], True)
    with pytest.raises(InvalidArgument, match="kept"):
        h.observe_many(["a", "b"], [True])
    with pytest.raises(InvalidArgument, match="probabilities"):
        order_by_pass([0.5, 2.0])
    with pytest.raises(InvalidArgument, match="data"):
        FilterHistory.from_dict({"x": 1})


# ------------------------------------------------------------------------------ sides and GRESO's skip
def test_the_history_records_why_a_group_was_dropped_and_counts_streaks():
    h = FilterHistory(memory=3)
    h.observe_many(["a", "a", "b", "b", "c", "c", "d"], [False, False, False, True, False, False, False],
                   ["hard", "hard", "easy", None, "easy", "hard", None])
    assert (h.groups, h.kept, h.easy, h.hard) == (7, 1, 2, 3)
    easy, hard = h.streaks(["a", "b", "c", "d", "new"])
    assert easy.tolist() == [0, 0, 0, 0, 0] and hard.tolist() == [2, 0, 1, 0, 0]
    # the side does not change the chance of passing: a dropped group is a dropped group
    plain = FilterHistory(memory=3)
    plain.observe_many(["a", "a", "b", "b", "c", "c", "d"], [False, False, False, True, False, False, False])
    keys = ["a", "b", "c", "d", "new"]
    assert h.pass_probability(keys).tolist() == pytest.approx(plain.pass_probability(keys).tolist())
    for _ in range(5):
        h.observe("e", False, "easy")
    assert h.streaks(["e"])[0].tolist() == [3]  # no longer than the memory
    back = FilterHistory.from_dict(h.to_dict())
    assert (back.easy, back.hard, back.kept, back.groups) == (h.easy, h.hard, h.kept, h.groups)
    assert [x.tolist() for x in back.streaks(keys)] == [x.tolist() for x in h.streaks(keys)]
    assert back.pass_probability(keys).tolist() == pytest.approx(h.pass_probability(keys).tolist())


def test_a_long_prompt_is_recorded_under_its_digest_not_its_text():
    import json

    from lengthsched.online import state_key

    text = "Prove that " + "the sum of two even numbers is even; " * 10
    h = FilterHistory()
    h.observe_many([text, text, "short"], [False, True, False], ["hard", None, "easy"])
    saved = h.to_dict()
    assert text not in json.dumps(saved) and set(saved["outcomes"]) == {state_key(text), "short"}
    back = FilterHistory.from_dict(json.loads(json.dumps(saved)))
    assert back.pass_probability([text, "short"]).tolist() == h.pass_probability([text, "short"]).tolist()
    legacy = {**saved, "outcomes": {text: saved["outcomes"][state_key(text)], "short": ["easy"]}}  # text keys
    assert FilterHistory.from_dict(legacy).pass_probability([text]).tolist() == h.pass_probability([text]).tolist()


def test_sides_are_checked():
    h = FilterHistory()
    with pytest.raises(InvalidArgument, match="side"):
        h.observe("a", True, "easy")  # a kept group has no side
    with pytest.raises(InvalidArgument, match="side"):
        h.observe("a", False, "solved")
    with pytest.raises(InvalidArgument, match="sides"):
        h.observe_many(["a", "b"], [False, False], ["easy"])
    with pytest.raises(InvalidArgument, match="data"):
        FilterHistory.from_dict({"outcomes": {"a": ["medium"]}})
    with pytest.raises(InvalidArgument, match="kept"):
        FilterHistory.from_dict({"outcomes": {"a": ["easy"]}, "groups": 1, "easy": 1, "kept": 1})


def test_greso_skips_a_streak_with_one_minus_p_to_the_streak():
    h = FilterHistory(memory=None)
    h.observe_many(["e1", "e2", "e2", "h1", "h3", "h3", "h3", "k"], [False] * 7 + [True],
                   ["easy", "easy", "easy", "hard", "hard", "hard", "hard", None])
    rule = SelectiveRollout(p_easy=0.5, p_hard=0.2)
    keys = ["e1", "e2", "h1", "h3", "k", "new"]
    assert rule.skip_probability(h, keys).tolist() == pytest.approx([0.5, 0.75, 0.8, 0.99, 0.0, 0.0])  # floor 0.01
    runs = np.array([rule.select(h, keys) for _ in range(4000)])
    assert runs[:, 4:].all()  # never skips a prompt without a streak
    assert (1 - runs.mean(axis=0))[:4].tolist() == pytest.approx([0.5, 0.75, 0.8, 0.99], abs=0.03)
    again = SelectiveRollout(p_easy=0.5, p_hard=0.2)
    assert again.select(h, keys * 10).tolist() == SelectiveRollout(p_easy=0.5, p_hard=0.2).select(h, keys * 10).tolist()


def test_greso_explores_less_when_too_many_dropped_groups_were_generated_and_more_otherwise():
    h = FilterHistory()
    rule = SelectiveRollout(p_easy=0.5, p_hard=0.5, target=0.3, step=0.1, min_p=0.3, max_p=0.7)
    assert rule.adapt(h) is None and (rule.p_easy, rule.p_hard) == (0.5, 0.5)  # nothing observed
    h.observe_many(list("abcdefghij"), [False] * 2 + [True] * 8, ["easy", "easy"] + [None] * 8)
    assert rule.adapt(h) == pytest.approx((0.2, 0.0))  # all right 0.2 >= 0.1: skip more; all wrong 0 < 0.2: less
    assert (rule.p_easy, rule.p_hard) == pytest.approx((0.4, 0.6))
    assert rule.adapt(h) is None  # only what is new counts
    h.observe_many(list("klmnopqrst"), [False] * 5 + [True] * 5, ["hard"] * 5 + [None] * 5)
    rule.adapt(h)
    rule.adapt(h)
    assert (rule.p_easy, rule.p_hard) == pytest.approx((0.5, 0.5))
    for _ in range(3):
        h.observe_many(["x"] * 10, [False] * 10, ["easy"] * 5 + ["hard"] * 5)
        rule.adapt(h)
    assert (rule.p_easy, rule.p_hard) == pytest.approx((0.3, 0.3))  # held at min_p
    back = SelectiveRollout.from_dict(rule.to_dict())
    assert back.to_dict() == rule.to_dict() and back.adapt(h) is None


def test_greso_arguments_are_checked():
    for name, kwargs in (("p_easy", {"p_easy": 1.5}), ("p_hard", {"p_hard": 0.01}), ("max_p", {"min_p": 0.6,
                                                                                                "max_p": 0.4}),
                         ("target", {"target": -0.1}), ("step", {"step": True}), ("seed", {"seed": -1}),
                         ("min_p", {"min_p": "low"})):
        with pytest.raises(InvalidArgument, match=name):
            SelectiveRollout(**kwargs)
    with pytest.raises(InvalidArgument, match="data"):
        SelectiveRollout.from_dict([0.5])
    with pytest.raises(InvalidArgument, match="seen"):
        SelectiveRollout.from_dict({"seen": [1, 2]})


def test_an_epoch_of_the_difficulty_model_is_recorded_with_its_sides_and_skipped_by_them():
    groups = _groups(np.linspace(100, 3000, 400))
    rates = pass_rates(groups, seed=3)
    sides = filter_sides(rates, 16, seed=3, epoch=0)
    passes = filter_passes(rates, 16, seed=3, epoch=0)
    assert [x is None for x in sides] == passes.tolist()
    k = rewarded(rates, 16, seed=3, epoch=0)
    assert all((x == "easy") == (n == 16) and (x == "hard") == (n == 0) for x, n in zip(sides, k))
    history = FilterHistory()
    assert record_epoch(history, groups, rates, 16, seed=3, epoch=0).tolist() == passes.tolist()
    assert (history.easy, history.hard) == (sides.count("easy"), sides.count("hard"))
    runs = selective_stream(groups, history, SelectiveRollout(p_easy=0.05, p_hard=0.05))
    assert runs[passes].all()  # a prompt its filter kept is never skipped
    assert (~runs[~passes]).mean() == pytest.approx(0.95, abs=0.05)


@given(st.lists(st.floats(0, 1), min_size=1, max_size=40), st.integers(0, 6), st.floats(0, 2))
def test_a_learning_policy_makes_every_prompt_easier_epoch_by_epoch(rates, epoch, drift):
    base = np.asarray(rates)
    now = learnt_rates(base, epoch, drift=drift, seed=1)
    later = learnt_rates(base, epoch + 1, drift=drift, seed=1)
    assert now.shape == base.shape and np.all((now >= 0) & (now <= 1))
    assert np.all(later >= now - 1e-12)
    if drift == 0 or epoch == 0:
        assert now.tolist() == base.tolist()


def test_learnt_rates_shift_log_odds_by_a_speed_per_prompt():
    base = np.full(2000, 0.5)
    one = learnt_rates(base, 1, drift=1.0, spread=0.0, seed=2)
    assert one == pytest.approx(np.full(2000, 1 / (1 + np.exp(-1.0))))  # no spread: every prompt learns alike
    spread = learnt_rates(base, 2, drift=0.5, spread=0.5, seed=2)
    logits = np.log(spread / (1 - spread))
    assert np.median(logits) == pytest.approx(1.0, rel=0.05)  # median speed 1: 2 epochs x 0.5
    assert np.std(np.log(logits)) == pytest.approx(0.5, rel=0.1)
    assert learnt_rates(base, 2, drift=0.5, seed=2).tolist() == spread.tolist()  # the speeds are the prompt's own
    for name, kwargs in (("drift", {"drift": -0.1}), ("spread", {"spread": float("inf")}), ("epoch", {"epoch": -1}),
                         ("rates", {"rates": [1.5]})):
        with pytest.raises(InvalidArgument, match=name):
            learnt_rates(**{"rates": [0.5], "epoch": 1, **kwargs})


def test_earlier_epochs_are_recorded_and_a_skipped_prompt_keeps_its_streak():
    groups = _groups(np.linspace(100, 3000, 300))
    rates = pass_rates(groups, seed=5)
    plain = FilterHistory(memory=None)
    ran = run_epochs(groups, rates, 16, 3, plain, seed=5)
    assert ran.shape == (3, 300) and ran.all() and plain.groups == 900
    first = FilterHistory(memory=None)
    record_epoch(first, groups, rates, 16, seed=5, epoch=0)  # the same draws as run_epochs' first epoch
    assert plain.to_dict()["outcomes"]["p0"][0] == first.to_dict()["outcomes"]["p0"][0]
    skipping, rule = FilterHistory(memory=None), SelectiveRollout(p_easy=0.05, p_hard=0.05, seed=5)
    ran = run_epochs(groups, rates, 16, 3, skipping, rule=rule, seed=5)
    assert ran[0].all() and not ran[1:].all() and skipping.groups == ran.sum()
    # a prompt skipped in an epoch recorded nothing then: its outcomes are one per epoch it ran
    outcomes = skipping.to_dict()["outcomes"]
    assert all(len(outcomes[g.prompt_id]) == ran[:, i].sum() for i, g in enumerate(groups))
    assert rule.to_dict()["seen"][0] == skipping.groups  # adapted after every epoch
    learning = FilterHistory(memory=None)
    run_epochs(groups, rates, 16, 3, learning, drift=1.0, seed=5)
    assert learning.easy > plain.easy and learning.hard < plain.hard  # a learning policy solves more
