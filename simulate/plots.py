"""Figures of ``lengthsched simulate --plot DIR`` (matplotlib, written as PNG files).

Every policy has one colour, the same in every figure (:func:`policy_color`); every colour of a
Gantt chart is in its legend or its colour bar.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from lengthsched.io import atomic_write_bytes
from lengthsched.runtime.registry import policy_names

from .run import SimResult

__all__ = ["PALETTE", "policy_color", "pyplot", "save_figure", "gantt", "gantt_figure", "memory_over_time",
           "sweep_lines", "rollout_gantt", "rollout_kv"]

# 29 distinct colours: matplotlib's tab10, the light halves of tab20, then darker ones of tab20b. Policies
# take them in registry order, so a policy keeps its colour in every figure and run; an unregistered name
# takes one of the last four (none of the registered policies' while there are at most 25).
PALETTE = (
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf",
    "#aec7e8", "#ffbb78", "#98df8a", "#ff9896", "#c5b0d5", "#c49c94", "#f7b6d2", "#dbdb8d", "#9edae5", "#393b79",
    "#637939", "#8c6d31", "#843c39", "#7b4173", "#5254a3", "#b5cf6b", "#e7ba52", "#ad494a", "#a55194",
    "#3182bd", "#e6550d", "#31a354", "#756bb1",
)

# Gantt bars that are not a completed run: their colours are outside the length colour map.
_KINDS = {"pad": ("#dddddd", "padding (a finished row kept in its padded batch)"),
          "preempted": ("#d62728", "run cut by a preemption (resumed later by recomputing its tokens)"),
          "discarded": ("#000000", "run discarded when collection stopped at G (dynamic_slot)")}


def policy_color(policy: str) -> str:
    """The colour of ``policy`` in every figure: distinct for every registered policy."""
    names = policy_names()
    if policy in names:
        return PALETTE[names.index(policy) % len(PALETTE)]
    return PALETTE[-1 - sum(map(ord, policy)) % 4]  # not registered: one of the extras, still stable


def pyplot():
    """matplotlib.pyplot on the Agg backend (files only, no display)."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    return plt


def gantt_figure(result: SimResult, title: str):
    """The Gantt chart of one run as a matplotlib figure: one bar per run of a completion on its slot
    (lane); a completed run is coloured by its tokens (colour bar), padding, preempted and discarded
    runs by kind (legend)."""
    plt = pyplot()
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import Normalize
    from matplotlib.patches import Patch

    segments = result.timeline.segments
    lanes = max((s[1] for s in segments), default=0) + 1
    fig, ax = plt.subplots(figsize=(10, 0.25 * lanes + 1.8))
    cmap = plt.get_cmap("viridis")
    longest = max(1, int(result.collected_lengths.max(initial=1)))
    norm = Normalize(vmin=1, vmax=longest)
    kinds = set()
    for _, lane, first, last, kind in segments:
        width = last - first + 1
        if kind in _KINDS:
            color = _KINDS[kind][0]
            kinds.add(kind)
        else:
            color = cmap(norm(min(width, longest)))
        ax.barh(lane, width, left=first - 1, height=0.8, color=color, edgecolor="white", linewidth=0.3)
    bar = fig.colorbar(ScalarMappable(norm=norm, cmap=cmap), ax=ax, pad=0.01)
    bar.set_label("decode run: tokens decoded in it")
    if kinds:
        ax.legend(handles=[Patch(facecolor=_KINDS[k][0], label=_KINDS[k][1]) for k in _KINDS if k in kinds],
                  fontsize=7, loc="upper right")
    ax.set_xlabel("decode step")
    ax.set_ylabel("slot")
    ax.set_title(f"{title}\n{result.policy}: {result.seconds:.2f} s modelled, {result.steps} steps, "
                 f"{result.preemptions} preemptions", fontsize=9)
    ax.invert_yaxis()
    fig.tight_layout()
    return fig


def save_figure(fig: Any, path: str | Path, dpi: int = 110) -> None:
    """Write a matplotlib figure to ``path`` (its format from the suffix, PNG without one) atomically:
    a reader sees the old file or the whole new one, never a part (rendered in memory, then
    :func:`lengthsched.io.atomic_write_bytes`); the figure is closed either way."""
    plt = pyplot()
    buffer = io.BytesIO()
    try:
        fig.savefig(buffer, dpi=dpi, format=Path(path).suffix.lstrip(".").lower() or "png")
    finally:
        plt.close(fig)
    atomic_write_bytes(path, buffer.getvalue())


def gantt(result: SimResult, path: Path, title: str) -> None:
    """Write :func:`gantt_figure` as a PNG."""
    save_figure(gantt_figure(result, title), path)


def memory_over_time(results: Sequence[SimResult], budget_tokens: int, path: Path, title: str,
                     budget_label: str = "budget") -> None:
    """KV tokens held (beyond the prompt) after each step, per policy, against the budget."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(10, 4.5))
    for r in results:
        steps, kv = zip(*r.timeline.kv)
        ax.plot(steps, kv, label=f"{r.policy} ({r.steps} steps)", linewidth=1.2, color=policy_color(r.policy))
    ax.axhline(budget_tokens, color="black", linestyle="--", linewidth=1, label=budget_label)
    _save(fig, ax, path, title, "decode step", "KV tokens held")


def sweep_lines(values: Sequence, seconds: dict[str, Sequence[float]], xlabel: str, path: Path, title: str) -> None:
    """Mean modelled seconds per group against a swept setting, one line per policy."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.5))
    x = np.arange(len(values))
    for policy, ys in seconds.items():
        ax.plot(x, ys, marker="o", label=policy, color=policy_color(policy))
    ax.set_xticks(x, [str(v) for v in values])
    ax.set_yscale("log")
    _save(fig, ax, path, title, xlabel, "modelled seconds per group (mean)")


def rollout_gantt(result, path: Path, title: str) -> None:
    """One rollout step (a ``simulate.RolloutResult`` run with ``record=True``) as a Gantt chart per
    replica, in modelled seconds: one row per replica, a bar per run of a completion (stacked on the
    replica's lanes), coloured by its prompt (colour bar: the group's index in the step), preempted
    runs in red (legend)."""
    plt = pyplot()
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import Normalize
    from matplotlib.patches import Patch

    sizes = [len(x) for x in result.collected_lengths]
    group_of = np.repeat(np.arange(len(sizes)), sizes)
    lanes = [max((s[1] for s in t.segments), default=0) + 1 for t in result.timelines]
    fig, axes = plt.subplots(len(lanes), 1, figsize=(11, 1.2 + sum(0.02 * n + 0.6 for n in lanes)), sharex=True,
                             squeeze=False)
    cmap, norm = plt.get_cmap("viridis"), Normalize(vmin=0, vmax=max(1, len(sizes) - 1))
    preempted = False
    for r, (ax, timeline) in enumerate(zip(axes[:, 0], result.timelines)):
        for job, lane, first, last, kind in timeline.segments:
            start, end = result.seconds_started(r, first), result.seconds_at(r, last)
            cut = kind == "preempted"
            preempted |= cut
            ax.barh(lane, end - start, left=start, height=1.0, linewidth=0,
                    color=_KINDS["preempted"][0] if cut else cmap(norm(group_of[job])))
        ax.set_ylabel(f"replica {r}\n{result.replica_seconds[r]:.2f} s", fontsize=7)
        ax.set_yticks([])
        ax.invert_yaxis()
    bar = fig.colorbar(ScalarMappable(norm=norm, cmap=cmap), ax=axes[:, 0].tolist(), pad=0.01)
    bar.set_label("prompt (group index in the step)")
    handles = [Patch(facecolor=_KINDS["preempted"][0], label=_KINDS["preempted"][1])] if preempted else []
    if handles:
        axes[0, 0].legend(handles=handles, fontsize=7, loc="upper right")
    axes[-1, 0].set_xlabel("modelled seconds")
    axes[0, 0].set_title(f"{title}\n{result.preemptions} preemptions, {result.recomputed_tokens:,} tokens recomputed, "
                         f"{result.prompt_loads} prompt loads", fontsize=9)
    save_figure(fig, path)


def rollout_kv(results: dict, pool_tokens: int, path: Path, title: str) -> None:
    """KV tokens held (prompts included) on every replica over modelled seconds, one colour per
    policy (the same as in every figure), one line per replica, against the pool."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(10, 4.5))
    for policy, result in results.items():
        for r, timeline in enumerate(result.timelines):
            steps, kv = zip(*timeline.kv)
            ax.plot(result.seconds_at(r, steps), kv, linewidth=0.9, color=policy_color(policy), alpha=0.8,
                    label=f"{policy} ({result.seconds:.2f} s), one line per replica" if r == 0 else None)
    ax.axhline(pool_tokens, color="black", linestyle="--", linewidth=1, label="each replica's pool")
    _save(fig, ax, path, title, "modelled seconds", "KV tokens held")


def _save(fig, ax, path: Path, title: str, xlabel: str, ylabel: str) -> None:
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    save_figure(fig, path)
