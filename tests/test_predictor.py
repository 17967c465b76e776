"""The predictor protocol and the oracles."""

from __future__ import annotations

import numpy as np
import pytest

from lengthsched import (
    ConstantLengthPredictor,
    InvalidArgument,
    LengthPredictor,
    NoisyOracleLengthPredictor,
    OracleLengthPredictor,
    plan_group,
)


def test_oracles_follow_the_protocol():
    for predictor in (OracleLengthPredictor([3, 4]), NoisyOracleLengthPredictor([3, 4], 0.3),
                      ConstantLengthPredictor(7)):
        assert isinstance(predictor, LengthPredictor)


def test_oracle_returns_remaining_after_the_prefix():
    oracle = OracleLengthPredictor({"a": 10, "b": 4})
    pred = oracle.predict(["a", "b", "a"], prefixes=[[1, 2, 3], 4, None], quantiles=[0.9])
    assert pred.lengths.tolist() == [7, 0, 10]
    assert pred.quantile(0.9).tolist() == [7, 0, 10]
    with pytest.raises(InvalidArgument, match="argument 'q'"):
        pred.quantile(0.5)
    with pytest.raises(InvalidArgument, match="argument 'prompts'"):
        oracle.predict(["c"])
    with pytest.raises(InvalidArgument, match="argument 'prefixes'"):
        oracle.predict(["a"], prefixes=[[1], [2]])
    with pytest.raises(InvalidArgument, match="argument 'prefixes'"):
        oracle.predict(["a"], prefixes=["some text"])


def test_noisy_oracle_is_deterministic_per_prompt_whatever_the_order():
    noisy = NoisyOracleLengthPredictor(list(range(1, 201)), sigma=0.5, seed=3)
    forward = noisy.predict(list(range(200))).lengths
    backward = noisy.predict(list(range(199, -1, -1))).lengths[::-1]
    assert np.array_equal(forward, backward)
    other_seed = NoisyOracleLengthPredictor(list(range(1, 201)), sigma=0.5, seed=4).predict(list(range(200)))
    assert not np.array_equal(forward, other_seed.lengths)


def test_noisy_oracle_error_has_the_requested_spread_and_calibrated_quantiles():
    truth = np.full(4000, 500)
    noisy = NoisyOracleLengthPredictor(truth, sigma=0.4, seed=0)
    pred = noisy.predict(list(range(4000)), quantiles=[0.1, 0.9])
    log_error = np.log(pred.lengths / truth)
    assert abs(np.median(log_error)) < 0.03
    assert np.std(log_error) == pytest.approx(0.4, rel=0.05)
    # Calibrated: the truth lies below the predicted 0.9-quantile about 90% of the time.
    assert np.mean(truth <= pred.quantile(0.9)) == pytest.approx(0.9, abs=0.02)
    assert np.mean(truth <= pred.quantile(0.1)) == pytest.approx(0.1, abs=0.02)


def test_predictions_feed_the_planner():
    truth = [120, 40, 300, 75, 60, 220]
    pred = NoisyOracleLengthPredictor(truth, sigma=0.2, seed=1).predict(list(range(6)), quantiles=[0.9])
    plan = plan_group(pred.lengths, slots=2, max_new_tokens=512, reserve_lengths=pred.quantile(0.9))
    assert plan.reserve_lengths == tuple(int(x) for x in pred.quantile(0.9))


def test_constant_predictor_and_errors():
    assert ConstantLengthPredictor(50).predict(["x", "y"], prefixes=[10, 60]).lengths.tolist() == [40, 1]
    with pytest.raises(InvalidArgument, match="argument 'length'"):
        ConstantLengthPredictor(0)
    with pytest.raises(InvalidArgument, match="argument 'sigma'"):
        NoisyOracleLengthPredictor([1, 2], sigma=-0.1)
    with pytest.raises(InvalidArgument, match="argument 'quantiles'"):
        OracleLengthPredictor([5]).predict([0], quantiles=[1.5])
