"""simulate.difficulty (DAPO's filter drawn from a model of prompt difficulty tied to length) and
lengthsched.filtering (the filter's history per prompt, and the order that puts likely-kept groups first)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from scipy import stats

from lengthsched import InvalidArgument
from lengthsched.filtering import FilterHistory, order_by_pass
from simulate.difficulty import DEFAULT_DIFFICULTY, Difficulty, filter_passes, fit_difficulty, pass_rates, rewarded
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
