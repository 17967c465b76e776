"""Policy peaks and step counts against docs/model.md section 8 and the section 4 table."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import unit_memory
from hypothesis import given
from hypothesis import strategies as st

from lengthsched import InvalidArgument, ModelMemory, policy_peak

EXAMPLE = [5, 3, 8, 2]


def test_steps_of_the_worked_example():
    m = unit_memory()
    assert policy_peak(m, "full", EXAMPLE).steps == 8
    assert policy_peak(m, "micro", EXAMPLE, slots=2).steps == 13
    assert policy_peak(m, "continuous", EXAMPLE, slots=2).steps == 11
    assert policy_peak(m, "length_aware", EXAMPLE, slots=2).steps == 10


def test_kv_peaks_freed_at_finish():
    m = unit_memory()
    # full: after step t the live ones hold t each: max_t t * #{l >= t} = 5 * 2 = 10.
    assert policy_peak(m, "full", EXAMPLE).peak_kv_bytes == 10
    assert policy_peak(m, "micro", EXAMPLE, slots=2).peak_kv_bytes == 8
    assert policy_peak(m, "continuous", EXAMPLE, slots=2).peak_kv_bytes == 8


def test_padded_batches_hold_g_times_max_length():
    m = unit_memory(free_kv="batch_end")
    assert policy_peak(m, "full", EXAMPLE).peak_kv_bytes == 4 * 8
    assert policy_peak(m, "micro", EXAMPLE, slots=2).peak_kv_bytes == 2 * 8


def test_continuous_reserves_g_times_max_new_tokens():
    m = ModelMemory.from_preset("qwen3-1.7b")
    peak = policy_peak(m, "continuous", EXAMPLE, slots=2, prompt_tokens=100, max_new_tokens=64)
    c = m.kv_bytes_per_token
    assert peak.reserved_bytes == m.weights_bytes + 100 * c + 2 * (64 * c + m.activation_bytes_per_sequence)
    assert peak.peak_bytes <= peak.reserved_bytes


@given(lengths=st.lists(st.integers(1, 40), min_size=1, max_size=12), slots=st.integers(1, 5))
def test_shared_prompt_policies_never_beat_the_full_batch_steps(lengths, slots):
    m = unit_memory()
    full = policy_peak(m, "full", lengths)
    for policy in ("micro", "continuous", "length_aware"):
        result = policy_peak(m, policy, lengths, slots=slots)
        assert result.steps >= full.steps == max(lengths)
        assert np.array_equal(result.schedule.ends - result.schedule.starts + 1, lengths)


def test_length_aware_with_budget_and_noisy_predictions():
    m = unit_memory()
    true = [30, 5, 22, 9, 14, 3, 27, 11]
    predicted = [25, 8, 20, 9, 18, 2, 30, 10]
    result = policy_peak(m, "length_aware", true, predicted=predicted, reserve_lengths=[40] * 8,
                         budget_bytes=100, max_new_tokens=40)
    assert result.peak_kv_bytes <= 100
    assert result.reserved_bytes <= 100


def test_policy_errors():
    m = unit_memory()
    with pytest.raises(InvalidArgument, match="argument 'policy'"):
        policy_peak(m, "greedy", EXAMPLE)
    with pytest.raises(InvalidArgument, match="argument 'slots'"):
        policy_peak(m, "micro", EXAMPLE)
    with pytest.raises(InvalidArgument, match="argument 'lengths'"):
        policy_peak(m, "full", EXAMPLE, max_new_tokens=4)
