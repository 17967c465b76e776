"""Workloads: real CASTILLO groups, the group model for single-length traces, trace files."""

from __future__ import annotations

import json

import numpy as np
import pytest

from lengthsched import InvalidArgument
from simulate.workloads import (
    Group,
    TraceError,
    castillo_file_groups,
    castillo_groups,
    castillo_prompt_tokens,
    castillo_spread,
    load_trace,
    make_workload,
    trace_groups,
    write_trace,
)


def test_castillo_groups_are_real_and_resampled_within_one_prompt():
    groups = castillo_groups(32, limit=20, seed=1)
    assert len(groups) == 20
    from simulate.workloads import _castillo_rows

    by_id = {r["prompt_id"]: r for r in _castillo_rows()}
    for g in groups:
        assert len(g.lengths) == 32 and g.source.startswith("castillo/")
        assert set(g.lengths.tolist()) <= set(min(x, 4096) for x in by_id[g.prompt_id]["lengths"])
    small = castillo_groups(4, limit=5, seed=1)
    for g in small:  # G <= 10 draws without replacement from the 10 real samples
        real = sorted(min(x, 4096) for x in by_id[g.prompt_id]["lengths"])
        assert all(real.count(x) >= g.lengths.tolist().count(x) for x in set(g.lengths.tolist()))


def test_castillo_selection_and_determinism():
    a = castillo_groups(16, datasets=["Mbpp"], splits=["validate"], limit=10, seed=3)
    b = castillo_groups(16, datasets=["Mbpp"], splits=["validate"], limit=10, seed=3)
    assert all(g.source == "castillo/Mbpp/validate" for g in a)
    assert [g.lengths.tolist() for g in a] == [g.lengths.tolist() for g in b]
    assert max(int(g.lengths.max()) for g in castillo_groups(16, max_new_tokens=300, limit=50)) <= 300
    with pytest.raises(InvalidArgument, match="argument 'datasets'"):
        castillo_groups(8, datasets=["ShareGPT"])
    with pytest.raises(InvalidArgument, match="argument 'splits'"):
        castillo_groups(8, splits=["test"])


def test_an_epoch_draws_the_same_prompts_again_with_fresh_completions():
    """RL revisits its prompts every epoch: ``epoch`` keeps the prompts (and epoch 0 the original draw)
    and draws each group's completions from a stream of its own."""
    for make in (lambda **kw: castillo_groups(16, limit=30, seed=5, **kw),
                 lambda **kw: trace_groups("lmsys", 16, spread=1.0, limit=30, seed=5, **kw)):
        first, again, later, other = make(), make(epoch=0), make(epoch=1), make(epoch=2)
        assert [g.lengths.tolist() for g in first] == [g.lengths.tolist() for g in again]
        assert [g.prompt_id for g in later] == [g.prompt_id for g in first] == [g.prompt_id for g in other]
        assert [g.prompt_len for g in later] == [g.prompt_len for g in first]
        changed = sum(g.lengths.tolist() != h.lengths.tolist() for g, h in zip(first, later))
        assert changed >= 20 and [g.lengths.tolist() for g in later] != [g.lengths.tolist() for g in other]
    from simulate.workloads import _castillo_rows

    by_id = {r["prompt_id"]: r for r in _castillo_rows()}
    for g in castillo_groups(16, limit=10, seed=5, epoch=3):  # still the prompt's own real samples
        assert set(g.lengths.tolist()) <= set(min(x, 4096) for x in by_id[g.prompt_id]["lengths"])
    with pytest.raises(InvalidArgument, match="argument 'epoch'"):
        castillo_groups(8, limit=3, epoch=-1)


def test_castillo_file_groups_read_a_file_of_your_own_as_the_bundled_one_is_read(tmp_path):
    """A CASTILLO file (its own schema: input_size, output_sizes) gives the groups castillo_groups
    draws from the same prompts in the bundled file (same order, same resampling streams)."""
    from simulate.workloads import _castillo_rows

    rows = [r for r in _castillo_rows() if r["dataset"] == "Mbpp" and r["split"] == "validate"]
    path = tmp_path / "preproc_Mbpp_validate.json"
    path.write_text(json.dumps([{"prompt_id": r["prompt_id"], "input_size": r["prompt_tokens"],
                                 "output_sizes": r["lengths"], "dataset": "Mbpp", "prompt_text": "..."}
                                for r in rows]))
    mine = castillo_file_groups(path, 16, max_new_tokens=300, limit=10, seed=3)
    bundled = castillo_groups(16, datasets=["Mbpp"], splits=["validate"], max_new_tokens=300, limit=10, seed=3)
    assert [g.prompt_id for g in mine] == [g.prompt_id for g in bundled]
    assert [g.lengths.tolist() for g in mine] == [g.lengths.tolist() for g in bundled]
    assert [g.prompt_len for g in mine] == [g.prompt_len for g in bundled]
    assert all(g.source == "castillo/Mbpp/file" for g in mine)
    for content, match in (("not json", "not JSON"), ("[]", "JSON list"), ('[{"prompt_id": "a"}]', "output_sizes"),
                           ('[{"prompt_id": "a", "input_size": 3, "output_sizes": [0, 4]}]', "output_sizes"),
                           ('[{"prompt_id": "a", "input_size": -1, "output_sizes": [4]}]', "input_size")):
        bad = tmp_path / "bad.json"
        bad.write_text(content)
        with pytest.raises(InvalidArgument, match=match):
            castillo_file_groups(bad, 4)
    with pytest.raises(InvalidArgument, match="argument 'path'"):
        castillo_file_groups(tmp_path / "missing.json", 4)


def test_group_model_for_single_length_traces():
    sigma = castillo_spread()
    assert 0.03 < sigma < 0.3
    groups = trace_groups("lmsys", 64, limit=200, seed=0, spread=0.5)
    logs = np.concatenate([np.log(g.lengths) - np.log(np.median(g.lengths)) for g in groups if g.lengths.min() > 20])
    assert np.std(logs) == pytest.approx(0.5, rel=0.15)
    azure = trace_groups("azure", 8, limit=5)
    assert all(g.prompt_len > 0 for g in azure)
    with pytest.raises(InvalidArgument, match="argument 'name'"):
        trace_groups("sharegpt", 8)


def test_trace_groups_draw_prompt_lengths_where_the_trace_has_none():
    """The lmsys trace has no prompt lengths (0 tokens); ``prompt_tokens`` gives each group one drawn from
    the given lengths, the same for the same seed and in every epoch, the completions untouched."""
    bare = trace_groups("lmsys", 16, spread=1.0, limit=40, seed=3)
    assert all(g.prompt_len == 0 for g in bare)
    real = castillo_prompt_tokens()
    assert len(real) > 100 and real.min() > 0 and 100 < np.median(real) < 400
    given = trace_groups("lmsys", 16, spread=1.0, limit=40, seed=3, prompt_tokens=real)
    assert [g.prompt_id for g in given] == [g.prompt_id for g in bare]
    assert all(np.array_equal(a.lengths, b.lengths) for a, b in zip(given, bare))
    assert set(g.prompt_len for g in given) <= set(real.tolist()) and len({g.prompt_len for g in given}) > 10
    later = trace_groups("lmsys", 16, spread=1.0, limit=40, seed=3, epoch=1, prompt_tokens=real)
    assert [g.prompt_len for g in later] == [g.prompt_len for g in given]
    assert [g.prompt_len for g in trace_groups("lmsys", 4, limit=5, seed=3, prompt_tokens=[128])] == [128] * 5
    for bad in ([], [-1], [1.5], [[1, 2]]):
        with pytest.raises(InvalidArgument, match="argument 'prompt_tokens'"):
            trace_groups("lmsys", 4, limit=5, prompt_tokens=bad)


def test_make_workload_gives_a_trace_prompt_lengths_by_name():
    """``prompt_tokens`` of make_workload (the CLI's --prompt-tokens): 'castillo' or a number of tokens, for
    the single-length traces only; anything else names the argument."""
    from simulate.workloads import prompt_lengths

    assert prompt_lengths(None) is None and prompt_lengths("64").tolist() == [64] and prompt_lengths(7).tolist() == [7]
    assert np.array_equal(prompt_lengths("castillo"), castillo_prompt_tokens())
    groups = make_workload("lmsys", 4, max_new_tokens=512, limit=6, seed=2, prompt_tokens="96")
    assert [g.prompt_len for g in groups] == [96] * 6
    azure = make_workload("azure", 4, max_new_tokens=512, limit=6, seed=2, prompt_tokens="castillo")
    assert set(g.prompt_len for g in azure) <= set(castillo_prompt_tokens().tolist())
    for bad in ("0", "-3", "1.5", "castilo", ""):
        with pytest.raises(InvalidArgument, match="argument 'prompt_tokens'"):
            make_workload("lmsys", 4, max_new_tokens=512, limit=6, seed=2, prompt_tokens=bad)
    with pytest.raises(InvalidArgument, match="it has its own"):
        make_workload("castillo", 4, max_new_tokens=512, limit=6, seed=2, prompt_tokens="96")


def test_trace_round_trip(tmp_path):
    path = tmp_path / "trace.jsonl"
    groups = [Group("p1", 12, np.array([5, 9, 3]), np.array([4, 10, 3])), Group("p2", 0, np.array([7]))]
    write_trace(path, groups)
    again = load_trace(path)
    assert [g.prompt_id for g in again] == ["p1", "p2"]
    assert again[0].lengths.tolist() == [5, 9, 3] and again[0].predicted.tolist() == [4, 10, 3]
    assert again[1].predicted is None and again[1].prompt_len == 0
    assert make_workload(str(path), 3, max_new_tokens=16, limit=1, seed=0)[0].prompt_id == "p1"


@pytest.mark.parametrize(
    "line,fragment",
    [
        ('{"prompt_id": "a", "prompt_tokens": 3}', "line 2: field 'lengths' is missing"),
        ('{"prompt_id": "a", "prompt_tokens": 3, "lengths": [4, -1]}', "line 2: field 'lengths'"),
        ('{"prompt_id": "a", "prompt_tokens": 3, "lengths": []}', "line 2: field 'lengths'"),
        ('{"prompt_id": "a", "prompt_tokens": 3, "lengths": [4, 900]}',
         "line 2: field 'lengths' has 900 > max_new_tokens"),
        ('{"prompt_id": "a", "prompt_tokens": -3, "lengths": [4]}', "line 2: field 'prompt_tokens'"),
        ('{"prompt_tokens": 3, "lengths": [4]}', "line 2: field 'prompt_id' is missing"),
        ('{"prompt_id": "a", "prompt_tokens": 3, "lengths": [4, 5], "predicted": [4]}', "line 2: field 'predicted'"),
        ('{"prompt_id": "a", "prompt_tokens": 3, "lengths": [4, 5', "line 2: not valid JSON"),
        ('[1, 2]', "line 2: expected a JSON object"),
    ],
)
def test_bad_traces_name_the_line(tmp_path, line, fragment):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({"prompt_id": "ok", "prompt_tokens": 1, "lengths": [3]}) + "\n" + line + "\n")
    with pytest.raises(TraceError, match=fragment.replace("[", r"\[")):
        load_trace(path, max_new_tokens=512)


def test_empty_and_missing_traces(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    with pytest.raises(TraceError, match="holds no groups"):
        load_trace(empty)
    with pytest.raises(TraceError, match="cannot read"):
        load_trace(tmp_path / "missing.jsonl")
    with pytest.raises(InvalidArgument, match="argument 'workload'"):
        make_workload("nowhere.jsonl", 4, max_new_tokens=16, limit=None, seed=0)


def test_a_trace_keeps_the_rollout_step(tmp_path):
    """Rollout logs carry the step a group was drawn in, so a prompt's history can be replayed."""
    from simulate.workloads import Group, load_trace, write_trace

    path = tmp_path / "log.jsonl"
    write_trace(path, [Group("p", 10, np.array([5, 6]), step=3), Group("p", 10, np.array([7, 8]))])
    groups = load_trace(path)
    assert [g.step for g in groups] == [3, None]
    path.write_text('{"prompt_id": "p", "prompt_tokens": 1, "lengths": [3], "step": -1}\n')
    with pytest.raises(Exception, match="line 1: field 'step'"):
        load_trace(path)


def test_history_predictions_learn_from_the_earlier_epoch_and_check_their_arguments(tmp_path):
    """simulate.workloads.history_predictions: one number per prompt (its siblings share it), pulled
    from the prior towards what the same prompts generated one epoch earlier; a mismatched earlier
    epoch or a prior without every prompt is an error naming the argument."""
    from simulate.workloads import castillo_groups, history_predictions, make_workload

    groups = castillo_groups(8, max_new_tokens=2048, limit=6, seed=3)
    before = castillo_groups(8, max_new_tokens=2048, limit=6, seed=3, epoch=1)
    prior = {g.prompt_id: 5 for g in groups}  # a prior far below every prompt's lengths
    pred = history_predictions(groups, before, prior, max_new_tokens=2048)
    assert pred.dtype == np.int64 and len(pred) == 48
    for i, b in enumerate(before):
        block = pred[8 * i:8 * (i + 1)]
        assert len(set(block.tolist())) == 1
        # 8 observed siblings outweigh the prior: within a factor 2 of the earlier epoch's median
        assert np.median(b.lengths) / 2 <= block[0] <= np.median(b.lengths) * 2
    with pytest.raises(InvalidArgument, match="argument 'before'"):
        history_predictions(groups, before[1:], prior, max_new_tokens=2048)
    with pytest.raises(InvalidArgument, match="argument 'prior'"):
        history_predictions(groups, before, {groups[0].prompt_id: 5}, max_new_tokens=2048)
    assert [g.prompt_id for g in make_workload("castillo", 8, max_new_tokens=2048, limit=6, seed=3, epoch=1)] == \
        [g.prompt_id for g in groups]
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"prompt_id": "a", "prompt_tokens": 10, "lengths": [5, 6, 7]}\n', encoding="utf-8")
    with pytest.raises(InvalidArgument, match="argument 'epoch'"):
        make_workload(str(trace), 3, max_new_tokens=64, limit=None, seed=0, epoch=1)
    assert len(make_workload(str(trace), 3, max_new_tokens=64, limit=None, seed=0)) == 1
