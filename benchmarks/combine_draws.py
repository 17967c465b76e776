"""Pool the results of several draws (seeds) of a multi-step section into one table.

``bench_simulate.py --sections rollout_partial``, ``--sections rollout_staleness``, ``--sections async_rl``,
``--sections async_verl``, ``--sections async_verl_driver``, ``--sections async_areal``,
``--sections async_areal_epochs``, ``--sections async_areal_ways``, ``--sections async_verl_ways``,
``--sections async_areal_sync``, ``--sections async_areal_bound2``,
``--sections slime_difficulty``, ``--sections slime_difficulty_drift`` and ``--sections slime_order_horizon``
each run one draw (``--seed``); this reads their JSON results and prints the section's table over all the draws'
settings pooled: means over every setting of every draw (each draw has the same settings, so the mean of the draws'
means), the lowest and worst over all of them, and the slower ones counted over all of them.

    python benchmarks/combine_draws.py rollout_staleness benchmarks/results/simulate_rollout_staleness.json \
        benchmarks/results/simulate_rollout_staleness_seed12.json ...

Several sections may follow one another (``rollout_partial FILES... rollout_staleness FILES...``); ``--figure``
then draws the runs they share, each mode once.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_simulate import (  # noqa: E402
    AREAL_BOUND2_COLUMNS,
    AREAL_BOUND2_PAIRS,
    AREAL_BOUND2_RUNS,
    AREAL_COLUMNS,
    AREAL_EPOCH_COLUMNS,
    AREAL_EPOCH_RUNS,
    AREAL_PAIRS,
    AREAL_RUNS,
    AREAL_SYNC_COLUMNS,
    AREAL_SYNC_PAIRS,
    AREAL_SYNC_RUNS,
    AREAL_WAYS_PAIRS,
    AREAL_WAYS_RUNS,
    ASYNC_COLUMNS,
    ASYNC_PAIRS,
    ASYNC_RUNS,
    DIFFICULTY_COLUMNS,
    DIFFICULTY_RUNS,
    DRIFT_COLUMNS,
    DRIFT_RUNS,
    DRIVER_COLUMNS,
    DRIVER_PAIRS,
    DRIVER_RUNS,
    HORIZON_COLUMNS,
    HORIZON_RUNS,
    PAIRED_COLUMNS,
    PARTIAL_COLUMNS,
    PARTIAL_RUNS,
    STALENESS_RUNS,
    VERL_COLUMNS,
    VERL_DAPO_COLUMNS,
    VERL_DAPO_RUNS,
    VERL_PAIRS,
    VERL_RUNS,
    VERL_WAYS_PAIRS,
    VERL_WAYS_RUNS,
    areal_epoch_rows,
    async_columns,
    async_rows,
    difficulty_rows,
    drift_rows,
    horizon_rows,
    paired_rows,
    partial_rows,
    verl_dapo_rows,
)
from common import table  # noqa: E402

SECTIONS = {"rollout_partial": PARTIAL_RUNS, "rollout_staleness": STALENESS_RUNS, "async_rl": ASYNC_RUNS,
            "async_verl": VERL_RUNS, "async_verl_driver": DRIVER_RUNS, "slime_difficulty": DIFFICULTY_RUNS,
            "slime_difficulty_drift": DRIFT_RUNS, "slime_order_horizon": HORIZON_RUNS,
            "verl_dapo_skip": VERL_DAPO_RUNS, "async_areal": AREAL_RUNS, "async_areal_epochs": AREAL_EPOCH_RUNS,
            "async_areal_ways": AREAL_WAYS_RUNS, "async_verl_ways": VERL_WAYS_RUNS, "async_areal_sync": AREAL_SYNC_RUNS,
            "async_areal_bound2": AREAL_BOUND2_RUNS}
#: The sections whose runs are over-sampled steps (the others have other columns and no figure).
STEPS_SECTIONS = ("rollout_partial", "rollout_staleness")
#: The sections that also compare runs with their baselines setting by setting.
PAIRS = {"async_rl": ASYNC_PAIRS, "async_verl": VERL_PAIRS, "async_verl_driver": DRIVER_PAIRS,
         "async_areal": AREAL_PAIRS, "async_areal_ways": AREAL_WAYS_PAIRS, "async_verl_ways": VERL_WAYS_PAIRS,
         "async_areal_sync": AREAL_SYNC_PAIRS, "async_areal_bound2": AREAL_BOUND2_PAIRS}
#: The columns of each asynchronous section's table.
COLUMNS = {"async_rl": ASYNC_COLUMNS, "async_verl": VERL_COLUMNS, "async_verl_driver": DRIVER_COLUMNS,
           "async_areal": AREAL_COLUMNS, "async_areal_ways": AREAL_COLUMNS, "async_verl_ways": DRIVER_COLUMNS,
           "async_areal_sync": AREAL_SYNC_COLUMNS, "async_areal_bound2": AREAL_BOUND2_COLUMNS}
#: The sections with rows of their own (from their pooled settings) and columns: the dynamic-sampling sections
#: (slime's, verl's v1 trainer's) and the AReaL integration's epochs on several ranks.
SLIME_TABLES = {"slime_difficulty": (difficulty_rows, DIFFICULTY_COLUMNS),
                "slime_difficulty_drift": (drift_rows, DRIFT_COLUMNS),
                "slime_order_horizon": (horizon_rows, HORIZON_COLUMNS),
                "verl_dapo_skip": (verl_dapo_rows, VERL_DAPO_COLUMNS),
                "async_areal_epochs": (areal_epoch_rows, AREAL_EPOCH_COLUMNS)}


def combine(section: str, paths: list[str], *, paired: bool = False) -> list:
    """The section's rows over the settings of every result file in ``paths`` pooled (one draw each); with
    ``paired``, its runs against their baselines setting by setting (``PAIRS``) instead."""
    if section not in SECTIONS:
        raise SystemExit(f"combine_draws.py: error: argument section: got {section!r}; expected one of "
                         + ", ".join(SECTIONS))
    pooled = []
    for draw, path in enumerate(paths):
        try:
            settings = json.loads(Path(path).read_text(encoding="utf-8"))[section]["settings"]
        except (OSError, ValueError, KeyError) as exc:
            raise SystemExit(f"combine_draws.py: error: argument paths: got {path!r}; expected a bench_simulate "
                             f"result with a {section} section ({exc})") from None
        pooled += settings if section not in STEPS_SECTIONS else [x[:7] + [draw] for x in settings]
    if paired:
        return paired_rows(pooled, PAIRS[section]) if section in PAIRS else []
    if section in SLIME_TABLES:
        return SLIME_TABLES[section][0](pooled)
    return (partial_rows(pooled, SECTIONS[section]) if section in STEPS_SECTIONS
            else async_rows(pooled, SECTIONS[section]))


def figure(rows: list, path: str, title: str) -> None:
    """Kept tokens per second (filled) and on-policy ones (hollow) against the kept tokens' mean age, one pair
    per mode and run of ``rows`` (pooled means; the modes named at the first run's points); written to
    ``path`` atomically."""
    from simulate.plots import pyplot, save_figure

    plt = pyplot()

    runs = list(dict.fromkeys(r[2] for r in rows))
    colors = plt.get_cmap("tab10").colors
    fig, ax = plt.subplots(figsize=(9, 5.2))
    named: list[tuple[float, float, int]] = []  # (age, kept, offset) of the names placed
    for r in rows:
        if len(r) < 20 or r[19] != r[19]:  # no age recorded (an older result)
            continue
        color = colors[runs.index(r[2]) % len(colors)]
        age, kept, fresh = r[19], r[4], r[10]
        ax.plot([age, age], [fresh, kept], color=color, linewidth=0.8, alpha=0.6)
        ax.scatter([age], [kept], color=color, s=30)
        ax.scatter([age], [fresh], facecolors="none", edgecolors=color, s=30)
        mode = f"{r[0]:g}x, " + {"no": "dropped", "yes": "partial"}.get(r[1], r[1].replace("yes, ", "partial, "))
        if r[2] == runs[0]:  # the modes named once, at the first run's points, clear of the names near them
            near = [dy for a, k, dy in named if abs(a - age) < 0.1 and abs(k - kept) < 0.06]
            dy = next(d for d in (3, -11, 15, -23, 27) if d not in near)
            ax.annotate("no over-sampling" if r[0] == 1 else mode, (age, kept), fontsize=7, xytext=(-4, dy),
                        textcoords="offset points", ha="right")
            named.append((age, kept, dy))
    for i, run in enumerate(runs):
        ax.scatter([], [], color=colors[i % len(colors)], s=30, label=f"{run}: kept tokens/s")
    ax.scatter([], [], facecolors="none", edgecolors="grey", s=30, label="hollow: on-policy kept tokens/s")
    ax.axhline(1.0, color="grey", linestyle="--", linewidth=0.8)
    ax.set_xlim(left=-0.15)  # room for the names of the modes at age 0
    ax.set_xlabel("mean age of the kept tokens (steps: policy updates they lag)")
    ax.set_ylabel("tokens per modelled second x vLLM + verl without over-sampling")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7, loc="lower left")
    fig.tight_layout()
    save_figure(fig, path)


def groups_of(args: list[str]) -> list[tuple[str, list[str]]]:
    """``SECTION FILE... [SECTION FILE...]`` as (section, files) pairs."""
    out: list[tuple[str, list[str]]] = []
    for arg in args:
        if arg in SECTIONS:
            out.append((arg, []))
        elif not out:
            raise SystemExit(f"combine_draws.py: error: argument section: got {arg!r}; expected one of "
                             + ", ".join(SECTIONS))
        else:
            out[-1][1].append(arg)
    for section, paths in out:
        if not paths:
            raise SystemExit(f"combine_draws.py: error: argument paths: got none after {section}; expected "
                             "bench_simulate.py results, one draw (--seed) each")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sections", nargs="+", metavar="SECTION FILE...",
                        help="a section (" + ", ".join(SECTIONS) + "), then bench_simulate.py results of it, one draw "
                             "(--seed) each; several sections may follow one another")
    parser.add_argument("--figure", default=None,
                        help="also draw kept and on-policy tokens per second against the kept tokens' mean age "
                             "(a PNG path); with several sections, the runs they share, every mode once")
    args = parser.parse_args(argv)
    every, seen = [], set()
    groups = groups_of(args.sections)
    for section, paths in groups:
        rows = combine(section, paths)
        columns = (PARTIAL_COLUMNS if section in STEPS_SECTIONS else SLIME_TABLES[section][1]
                   if section in SLIME_TABLES else async_columns(COLUMNS[section], rows))
        print(table(f"{section} over {len(paths)} draws pooled", columns, rows))
        if section in PAIRS:
            print(table(f"{section} over {len(paths)} draws pooled, per setting against a baseline", PAIRED_COLUMNS,
                        combine(section, paths, paired=True)))
        if section not in STEPS_SECTIONS:
            continue
        every += [r for r in rows if (r[0], r[1], r[2]) not in seen]
        seen |= {(r[0], r[1], r[2]) for r in rows}
    if args.figure is not None:
        if any(section not in STEPS_SECTIONS for section, _ in groups):
            raise SystemExit("combine_draws.py: error: argument --figure: got a section without over-sampled steps; "
                             "expected only " + ", ".join(STEPS_SECTIONS))
        shared = set.intersection(*({label for label, *_ in SECTIONS[section]} for section, _ in groups))
        draws = {len(paths) for _, paths in groups}
        figure([r for r in every if r[2] in shared], args.figure,
               f"{', '.join(section for section, _ in groups)}: over-sampled steps, "
               f"{'/'.join(map(str, sorted(draws)))} draws pooled (modelled)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
