"""Figures of ``lengthsched simulate --plot DIR`` (matplotlib, written as PNG files)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from .run import SimResult

__all__ = ["gantt", "memory_over_time", "sweep_lines"]

_COLORS = {"run": None, "pad": "#dddddd", "preempted": "#d62728", "discarded": "#7f7f7f"}


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    return plt


def gantt(result: SimResult, path: Path, title: str) -> None:
    """One bar per run of a completion on its slot (lane); colour = the completion's length."""
    plt = _pyplot()
    segments = result.timeline.segments
    lengths = np.array([s[3] - s[2] + 1 for s in segments])
    cmap = plt.get_cmap("viridis")
    fig, ax = plt.subplots(figsize=(10, 0.25 * (max(s[1] for s in segments) + 1) + 1.5))
    longest = max(1, int(result.collected_lengths.max()))
    for (job, lane, first, last, kind), width in zip(segments, lengths):
        color = _COLORS[kind] or cmap(min(1.0, width / longest))
        ax.barh(lane, width, left=first - 1, height=0.8, color=color, edgecolor="white", linewidth=0.3)
    ax.set_xlabel("decode step")
    ax.set_ylabel("slot")
    ax.set_title(f"{title}\n{result.policy}: {result.seconds:.2f} s modelled, {result.steps} steps, "
                 f"{result.preemptions} preemptions "
                 "(grey: padding, red: preempted run)", fontsize=9)
    ax.invert_yaxis()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def memory_over_time(results: Sequence[SimResult], budget_tokens: int, path: Path, title: str) -> None:
    """KV tokens held (beyond the prompt) after each step, per policy, against the budget."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(10, 4.5))
    for r in results:
        steps, kv = zip(*r.timeline.kv)
        ax.plot(steps, kv, label=f"{r.policy} ({r.steps} steps)", linewidth=1.2)
    ax.axhline(budget_tokens, color="black", linestyle="--", linewidth=1, label="budget")
    _save(plt, fig, ax, path, title, "decode step", "KV tokens held")


def sweep_lines(values: Sequence, seconds: dict[str, Sequence[float]], xlabel: str, path: Path, title: str) -> None:
    """Mean modelled seconds per group against a swept setting, one line per policy."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.5))
    x = np.arange(len(values))
    for policy, ys in seconds.items():
        ax.plot(x, ys, marker="o", label=policy)
    ax.set_xticks(x, [str(v) for v in values])
    ax.set_yscale("log")
    _save(plt, fig, ax, path, title, xlabel, "modelled seconds per group (mean)")


def _save(plt, fig, ax, path: Path, title: str, xlabel: str, ylabel: str) -> None:
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
