"""``lengthsched simulate`` as a new user meets it (issue 17): every bad input one clear line naming
the flag, no flag silently ignored, a table and figures that explain themselves."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from lengthsched import InvalidArgument, LengthPrediction, NoisyOracleLengthPredictor
from lengthsched.cli import main
from lengthsched.runtime.registry import policy_names

SMALL = ["simulate", "--groups", "3", "--group-size", "8", "--max-new-tokens", "1024", "--workers", "1"]
QUICK = ["--policies", "micro,length_aware,vllm"]


def run(args, capsys):
    code = main(args)
    out, err = capsys.readouterr()
    return code, out, err


def one_line_error(args, capsys, *fragments):
    code, out, err = run(args, capsys)
    assert code == 2, err
    assert out == "" and err.count("\n") == 1 and "Traceback" not in err, err
    for fragment in fragments:
        assert fragment in err, err
    return err


# 1. --seed -1 ---------------------------------------------------------------------------------

def test_negative_seed_is_one_line_naming_seed(capsys):
    one_line_error(SMALL + QUICK + ["--seed", "-1"], capsys, "'seed'", ">= 0")


# 2. noisy predictor: sigma bounded, predictions never overflow, every answer checked ------------

@pytest.mark.parametrize("sigma", ["1000", "10", "5.5", "inf", "nan", "0", "-1"])
def test_noisy_sigma_out_of_range_is_rejected(sigma, capsys):
    err = one_line_error(SMALL + QUICK + ["--predictor", f"noisy:{sigma}"], capsys, "'predictor'")
    assert "SIGMA <= 5" in err


def test_noisy_at_the_bound_runs_with_positive_predictions(capsys):
    code, out, err = run(SMALL + ["--policies", "length_aware,vllm", "--predictor", "noisy:5", "--json"], capsys)
    assert code == 0, err
    rows = {r["policy"]: r for r in json.loads(out)["policies"]}
    assert set(rows) == {"length_aware", "vllm"} and rows["length_aware"]["seconds"] > 0


def test_noisy_predictor_never_overflows():
    truth = np.full(2000, 10**6)
    pred = NoisyOracleLengthPredictor(truth, sigma=5.0, seed=0).predict(list(range(2000)),
                                                                        quantiles=[0.5, 0.999999])
    for values in (pred.lengths, *pred.quantiles.values()):
        assert values.dtype == np.int64 and values.min() >= 1
    assert pred.quantile(0.999999).max() <= 2**53
    with pytest.raises(InvalidArgument, match="sigma"):
        NoisyOracleLengthPredictor(truth, sigma=5.01)


class _Broken:
    """A predictor whose answers overflowed or are not numbers."""

    def __init__(self, value):
        self.value = value

    def predict(self, prompts, prefixes=None, *, quantiles=()):
        values = np.full(len(prompts), self.value)
        return LengthPrediction(values, {q: values for q in quantiles})


@pytest.mark.parametrize("value", [-9223372036854775808, -1, np.nan, np.inf])
def test_negative_or_non_finite_predictions_are_errors_not_clipped(value):
    from simulate import run_group
    from simulate.report import CheckedPredictor

    lengths = np.array([5, 9, 3, 7])
    with pytest.raises(InvalidArgument, match="'predictor'.*finite predicted"):
        run_group(lengths, "length_aware", budget_tokens=40, max_new_tokens=16,
                  predicted=CheckedPredictor(_Broken(value), "mine"))


def test_checked_predictor_keeps_the_online_interface():
    from simulate.report import CheckedPredictor, predictions_for
    from simulate.workloads import castillo_groups

    group = castillo_groups(8, limit=1, max_new_tokens=1024)[0]
    online = predictions_for("online", group, 0, 0)
    assert isinstance(online, CheckedPredictor) and hasattr(online, "observe")
    assert not hasattr(predictions_for("constant:100", group, 0, 0), "observe")


# 3. --workload FILE --group-size N -------------------------------------------------------------

@pytest.fixture
def trace(tmp_path):
    from simulate.workloads import castillo_groups, write_trace

    groups = castillo_groups(6, limit=3, max_new_tokens=1024, seed=1)
    path = tmp_path / "trace.jsonl"
    write_trace(path, groups)
    return str(path)


def test_group_size_with_a_trace_file_is_checked_not_ignored(trace, capsys):
    args = ["simulate", "--workload", trace, "--max-new-tokens", "1024", "--workers", "1"] + QUICK
    one_line_error(args + ["--group-size", "16"], capsys, "'group_size'", "trace file", "has 6")
    code, out, err = run(args + ["--group-size", "6"], capsys)  # the trace's own size: a check that passes
    assert code == 0, err
    assert "3 groups of G=6 from " in out.splitlines()[0]


def test_trace_header_shows_the_group_size_that_ran(trace, capsys):
    args = ["simulate", "--workload", trace, "--max-new-tokens", "1024", "--workers", "1"] + QUICK
    code, out, err = run(args, capsys)
    assert code == 0, err
    assert "3 groups of G=6 from " in out.splitlines()[0]
    one_line_error(args + ["--sweep", "group_size=4,8"], capsys, "'sweep'", "trace file")


# 4. errors name the flag the user typed ---------------------------------------------------------

def test_groups_zero_names_groups(capsys):
    err = one_line_error(SMALL + QUICK + ["--groups", "0"], capsys, "'groups'")
    assert "'limit'" not in err


def test_budget_too_small_names_budget_and_what_fits(capsys):
    err = one_line_error(SMALL + QUICK + ["--budget", "1GiB"], capsys, "'budget'", "'1GiB'", "GiB")
    assert "budget_bytes" not in err and "budget_tokens" not in err
    needed = float(re.search(r"at least ([0-9.]+)GiB", err).group(1))
    code, _, err = run(SMALL + QUICK + ["--budget", f"{needed}GiB"], capsys)
    assert code == 0, err  # the budget the message names is enough


def test_budget_below_l_max_for_slot_policies_names_budget(capsys):
    err = one_line_error(SMALL + ["--policies", "micro", "--budget", "3.4GiB"], capsys, "'budget'", "L_max")
    assert "budget_tokens" not in err


def test_trace_predictor_without_predictions_does_not_list_trace(trace, capsys):
    err = one_line_error(["simulate", "--workload", trace, "--max-new-tokens", "1024", "--workers", "1",
                          "--predictor", "trace"] + QUICK, capsys, "'predictor'", "'predicted' field")
    assert "trace, online" not in err and ", trace," not in err


# 5. --policies with empty entries; clipped predictions noticed ------------------------------------

@pytest.mark.parametrize("policies", ["micro,,vllm", "micro,", ",vllm", "micro,micro"])
def test_policies_empty_or_repeated_entries_rejected(policies, capsys):
    one_line_error(SMALL + ["--policies", policies], capsys, "'policies'")


def test_predictions_clipped_to_max_new_tokens_are_noticed(capsys):
    code, out, err = run(SMALL + QUICK + ["--predictor", "constant:5000"], capsys)
    assert code == 0
    notices = [line for line in err.splitlines() if "notice" in line]
    assert len(notices) == 1 and "24 of 24 predicted lengths" in notices[0] and "--max-new-tokens" in notices[0]
    code, out, err = run(SMALL + QUICK, capsys)  # the oracle is never above L_max: no notice
    assert code == 0 and "notice" not in err


def test_clipped_notice_in_a_sweep_is_one_line(capsys):
    code, _, err = run(SMALL + QUICK + ["--predictor", "constant:5000", "--sweep", "max_new_tokens=1024,8192"],
                       capsys)
    assert code == 0, err
    notices = [line for line in err.splitlines() if "notice" in line]
    assert len(notices) == 1 and "max_new_tokens=1024: 24 of 24" in notices[0] and "8192" not in notices[0]


# 6. the table explains itself; sweeps show what they swept -----------------------------------------

def _columns(out: str) -> list[str]:
    header = next(line for line in out.splitlines() if line.startswith("policy "))
    return re.split(r"\s{2,}", header.strip())


def test_every_column_has_a_legend_line_and_there_is_a_verdict(capsys):
    code, out, err = run(SMALL + ["--budget", "3.6GiB"], capsys)
    assert code == 0, err
    lines = out.splitlines()
    columns = _columns(out)
    assert len(columns) >= 10
    for column in columns:
        assert any(line.strip().startswith(f"{column}: ") for line in lines), column
    verdict = [line for line in lines if line.startswith("verdict: ")]
    assert len(verdict) == 1 and "fastest within budget" in verdict[0]
    # full and full_freed break 3.6 GiB: marked in the table and named by the verdict.
    assert re.search(r"^full \*", out, re.M) and "break the budget" in verdict[0] and "full" in verdict[0]


def test_sweep_header_shows_the_swept_values_not_the_default(capsys):
    code, out, err = run(SMALL + QUICK + ["--sweep", "group_size=4,8"], capsys)
    assert code == 0, err
    header = out.splitlines()[0]
    assert "G=4, 8 (swept)" in header and "G=32" not in header
    code, out, err = run(SMALL + QUICK + ["--sweep", "budget=3.6GiB,6GiB"], capsys)
    assert code == 0, err
    assert "3.60 GiB, 6.00 GiB (swept)" in out.splitlines()[0] and "5.00 GiB" not in out.splitlines()[0]


def test_the_verdict_never_recommends_a_biased_control(capsys):
    """dynamic_slot stops at the first G completions of an endless stream (short ones first): it can look fastest,
    even below the lower bound, but the verdict names the fastest unbiased policy and says why it left it out."""
    code, out, err = run(SMALL + ["--policies", "dynamic_slot,fixed_slot,vllm", "--budget", "20GiB"], capsys)
    assert code == 0, err
    verdict = next(line for line in out.splitlines() if line.startswith("verdict: "))
    assert "fastest within budget: dynamic_slot" not in verdict and "not recommended: dynamic_slot" in verdict
    code, out, err = run(SMALL + ["--policies", "dynamic_slot,vllm", "--sweep", "budget=8GiB,20GiB"], capsys)
    assert code == 0, err
    verdict = next(line for line in out.splitlines() if line.startswith("verdict: "))
    assert "dynamic_slot fastest" not in verdict and "budget=20GiB: vllm fastest within budget" in verdict
    code, out, err = run(SMALL + ["--policies", "dynamic_slot"], capsys)  # nothing else to recommend
    verdict = next(line for line in out.splitlines() if line.startswith("verdict: "))
    assert code == 0 and "no unbiased policy to recommend: only dynamic_slot" in verdict
    assert "raise --budget" not in verdict and "every policy kept" not in verdict


def test_sweep_marks_over_budget_policies_and_has_a_verdict(capsys):
    code, out, err = run(SMALL + ["--policies", "full,vllm", "--sweep", "budget=3.6GiB,8GiB"], capsys)
    assert code == 0, err
    assert re.search(r"^full \*", out, re.M) and not re.search(r"^vllm \*", out, re.M)
    verdict = next(line for line in out.splitlines() if line.startswith("verdict: "))
    assert "budget=3.6GiB: vllm fastest within budget, 1 over budget" in verdict
    assert "* = over budget" in out


# 7. figures ------------------------------------------------------------------------------------------

def test_every_registered_policy_has_its_own_colour():
    from simulate.plots import policy_color

    names = policy_names()
    colours = [policy_color(n) for n in names]
    assert len(set(colours)) == len(names) >= 12
    assert colours == [policy_color(n) for n in names]  # stable


def test_sweep_figure_lines_use_the_policy_colour(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.colors import to_hex

    from simulate import plots

    seen = {}
    real = plots._save

    def keep(fig, ax, path, *rest):
        seen.update({line.get_label(): to_hex(line.get_color()) for line in ax.get_lines()})
        real(fig, ax, path, *rest)

    plots._save = keep
    try:
        names = policy_names()
        plots.sweep_lines([1, 2], {n: [1.0, 2.0] for n in names}, "x", tmp_path / "s.png", "t")
    finally:
        plots._save = real
    assert {n: seen[n] for n in names} == {n: plots.policy_color(n) for n in names}


@pytest.mark.parametrize("policy", ["vllm", "full", "dynamic_slot"])
def test_gantt_legend_covers_every_colour(policy):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.collections import QuadMesh
    from matplotlib.colors import to_hex

    from simulate import run_group
    from simulate.plots import gantt_figure

    lengths = np.array([40, 3, 25, 9, 31, 5, 17, 2])
    result = run_group(lengths, policy, budget_tokens=60, max_new_tokens=40, record=True, slots=4)
    fig = gantt_figure(result, "test")
    try:
        ax, *others = fig.axes
        legend = ax.get_legend()
        legend_colours = {to_hex(h.get_facecolor()) for h in (legend.legend_handles if legend else [])}
        # The colour bar: its mesh maps a run's tokens to its colour.
        mesh = next(c for cax in others for c in cax.collections if isinstance(c, QuadMesh))
        assert any(cax.get_ylabel() for cax in others), "the colour bar is labelled"
        kinds = {s[4] for s in result.timeline.segments} - {"run"}
        assert len(legend_colours) == len(kinds)  # one legend entry per kind of bar drawn
        assert ax.patches
        for bar in ax.patches:
            colour = to_hex(bar.get_facecolor())
            if colour not in legend_colours:
                assert colour == to_hex(mesh.get_cmap()(mesh.norm(bar.get_width()))), (colour, bar.get_width())
    finally:
        plt.close(fig)


def test_plot_titles_give_the_budget_in_gib(tmp_path, capsys, monkeypatch):
    from lengthsched import parse_bytes
    from simulate import plots

    seen = {"titles": [], "budget_values": None}
    real_gantt, real_memory, real_sweep = plots.gantt, plots.memory_over_time, plots.sweep_lines

    def gantt(result, path, title):
        seen["titles"].append(title)
        real_gantt(result, path, title)

    def memory(results, budget_tokens, path, title, budget_label="budget"):
        seen["titles"].append(title)
        seen["budget_label"] = budget_label
        real_memory(results, budget_tokens, path, title, budget_label)

    def sweep(values, seconds, xlabel, path, title):
        if "budget" in xlabel:
            seen["budget_values"], seen["budget_xlabel"] = list(values), xlabel
        real_sweep(values, seconds, xlabel, path, title)

    monkeypatch.setattr(plots, "gantt", gantt)
    monkeypatch.setattr(plots, "memory_over_time", memory)
    monkeypatch.setattr(plots, "sweep_lines", sweep)
    code, _, err = run(SMALL + ["--groups", "2", "--policies", "micro,vllm", "--budget", "6GiB", "--plot",
                                str(tmp_path)], capsys)
    assert code == 0, err
    assert seen["titles"] and all("budget 6.00GiB" in t for t in seen["titles"])
    assert "6.00GiB" in seen["budget_label"]
    # The budget sweep's ticks are budgets as --budget takes them.
    assert seen["budget_values"] and all(re.fullmatch(r"[0-9]+\.[0-9]{2}GiB", v) for v in seen["budget_values"])
    assert all(parse_bytes(v) > 2**30 for v in seen["budget_values"]) and "GiB" in seen["budget_xlabel"]
    assert {"gantt_vllm.png", "memory.png", "seconds_vs_budget.png"} <= {p.name for p in tmp_path.iterdir()}
