"""``lengthsched simulate``: the table, JSON, sweeps, figures and one-line errors."""

from __future__ import annotations

import json

import pytest

from lengthsched.cli import main

SMALL = ["simulate", "--groups", "4", "--group-size", "8", "--max-new-tokens", "1024", "--workers", "1"]


def run(args, capsys):
    code = main(args)
    out, err = capsys.readouterr()
    return code, out, err


def test_default_table_lists_every_policy(capsys):
    code, out, err = run(SMALL, capsys)
    assert code == 0, err
    for policy in ("full", "micro", "fixed_slot", "dynamic_slot", "length_aware", "growth_aware", "vllm", "sglang",
                   "reserve_max"):
        assert f"\n{policy} " in out
    assert "x vllm" in out and "seconds" in out and "KS" in out and "plan ms" in out
    assert "fastest within budget:" in out


def test_json_and_output_file(tmp_path, capsys):
    target = tmp_path / "sim.json"
    code, out, _ = run(SMALL + ["--policies", "micro,growth_aware", "--json", "--output", str(target)], capsys)
    assert code == 0
    data = json.loads(out)
    rows = {r["policy"]: r for r in data["policies"]}
    assert set(rows) == {"micro", "growth_aware"}
    assert json.loads(target.read_text()) == data
    assert rows["micro"]["steps_vs_micro"] == 1.0
    # Ordered by modelled seconds among the policies within budget.
    ok = [r["seconds"] for r in data["policies"] if r["within_budget"] >= 1.0]
    assert ok == sorted(ok)


def test_cost_file_moved_to_another_gpu(tmp_path, capsys):
    """--cost FILE --gpu X prices with the fitted model moved to X's datasheet numbers (StepCost.on_gpu):
    the same seconds as a file holding the moved model, and other seconds than the file alone."""
    from pathlib import Path

    from lengthsched.cost import StepCost

    shipped = Path(__file__).resolve().parent.parent / "benchmarks" / "results" / "stepcost_h100_qwen3-1.7b.json"
    moved = tmp_path / "moved.json"
    moved.write_text(StepCost.from_file(shipped).on_gpu("h200").to_json())
    base = SMALL + ["--policies", "micro,vllm", "--model", "qwen3-1.7b", "--json"]
    seconds = {}
    for name, extra in (("file", ["--cost", str(shipped)]), ("both", ["--cost", str(shipped), "--gpu", "h200"]),
                        ("moved", ["--cost", str(moved)])):
        code, out, err = run(base + extra, capsys)
        assert code == 0, err
        seconds[name] = [r["seconds"] for r in json.loads(out)["policies"]]
    assert seconds["both"] == seconds["moved"]
    assert all(b < f for b, f in zip(seconds["both"], seconds["file"]))


def test_sweep(capsys):
    code, out, _ = run(SMALL + ["--policies", "micro,growth_aware", "--sweep", "group_size=4,8"], capsys)
    assert code == 0 and "group_size=4" in out and "group_size=8" in out


def test_plot_writes_figures(tmp_path, capsys):
    code, _, err = run(SMALL + ["--groups", "2", "--policies", "micro,growth_aware,vllm", "--plot", str(tmp_path)],
                       capsys)
    assert code == 0, err
    names = sorted(p.name for p in tmp_path.iterdir())
    assert {"gantt_micro.png", "gantt_growth_aware.png", "gantt_vllm.png", "memory.png",
            "seconds_vs_group_size.png", "seconds_vs_budget.png"} <= set(names)
    assert all((tmp_path / n).stat().st_size > 1000 for n in names)


@pytest.mark.parametrize(
    "extra,fragment",
    [
        (["--policies", "magic"], "argument 'policies'"),
        (["--predictor", "psychic"], "argument 'predictor'"),
        (["--sweep", "colour=red"], "argument 'sweep'"),
        (["--budget", "1GiB"], "argument 'budget'"),
        (["--workload", "nowhere.jsonl"], "argument 'workload'"),
        (["--policies", "micro,fixed_slot", "--predictor", "bogus"], "argument 'predictor'"),
        (["--workers", "-1"], "argument 'workers'"),
        (["--output", "/"], "is a directory"),
        (["--kv-compression", "512"], "argument 'kv_compression'"),
        (["--kv-compression", "0:8"], "argument 'kv_compression'"),
        (["--kv-compression", "512:32", "--groups", "4", "--headroom"], "argument 'headroom'"),  # (not a step)
    ],
)
def test_errors_are_one_line(extra, fragment, capsys):
    code, out, err = run(SMALL + extra, capsys)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and fragment in err


def test_errors_from_worker_processes_are_one_line(capsys):
    args = ["simulate", "--groups", "4", "--group-size", "8", "--max-new-tokens", "1024", "--workers", "2",
            "--policies", "micro,length_aware", "--predictor", "noisy:lots"]
    code, out, err = run(args, capsys)
    assert code == 2 and err.count("\n") == 1 and "argument 'predictor'" in err


def test_multiprocess_results_equal_single_process(capsys):
    args = ["simulate", "--groups", "6", "--group-size", "8", "--max-new-tokens", "1024", "--json",
            "--policies", "micro,growth_aware,vllm"]
    single = json.loads(run(args + ["--workers", "1"], capsys)[1])
    multi = json.loads(run(args + ["--workers", "2"], capsys)[1])
    strip = lambda d: [{k: v for k, v in row.items() if not k.endswith("_ms")} for row in d["policies"]]  # noqa: E731
    assert strip(single) == strip(multi)


def test_every_registered_policy_and_the_extras_have_their_own_colour():
    """Figures give every registered policy a colour of its own, and rows that are not policies (an oracle
    placement, ...) one of four more that no policy uses."""
    from lengthsched.runtime import policy_names
    from simulate.plots import PALETTE, policy_color

    colours = [policy_color(p) for p in policy_names()]
    assert len(set(colours)) == len(colours)
    extras = {PALETTE[-1 - k] for k in range(4)}
    assert not extras & set(colours) and policy_color("oracle placement") in extras


def test_a_compressed_cache_admits_more(capsys):
    """--kv-compression: every default row, the cache in the header, fewer steps where the
    budget held few sequences."""
    args = SMALL + ["--budget", "3.5GiB", "--json"]
    code, out, err = run(args + ["--policies", "micro,length_aware"], capsys)
    assert code == 0, err
    dense = {r["policy"]: r for r in json.loads(out)["policies"]}
    code, out, err = run(args + ["--kv-compression", "128:16"], capsys)
    assert code == 0, err
    data = json.loads(out)
    sparse = {r["policy"]: r for r in data["policies"]}
    assert {"vllm", "micro", "length_aware", "sglang", "growth_aware"} <= set(sparse)
    assert "KV compressed to 128 generated tokens every 16 (at most 144 a sequence)" in data["note"]
    for policy in ("micro", "length_aware"):
        assert sparse[policy]["steps"] < dense[policy]["steps"] and sparse[policy]["within_budget"] == 1.0
