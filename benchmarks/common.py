"""Helpers shared by the benchmark scripts: Markdown tables, the machine, writing results."""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np

import lengthsched
from lengthsched.io import atomic_write_text

ROOT = Path(__file__).resolve().parent.parent


def table(title: str, header: list[str], rows: list[list]) -> str:
    """A Markdown table with a ### title; floats with three decimals."""
    out = [f"### {title}", "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(f"{v:.3f}" if isinstance(v, float) else str(v) for v in row) + " |" for row in rows]
    return "\n".join(out) + "\n"


def device_name(where=None) -> str:
    """A torch device in words, for table titles: the CUDA card's name or the CPU's threads. ``where``
    is a model (its parameters' device), a device or its name, or ``None`` (the default device)."""
    import torch

    if hasattr(where, "parameters"):
        where = next(where.parameters()).device
    dev = torch.device(where or ("cuda" if torch.cuda.is_available() else "cpu"))
    if dev.type == "cuda":
        return f"cuda: {torch.cuda.get_device_name(dev)}"
    return f"cpu ({torch.get_num_threads()} threads)"


def median_ms(fn, reps: int) -> float:
    """The median of ``reps`` timed calls of ``fn`` (after one untimed warm-up call), in milliseconds."""
    fn()  # warm-up (first-call caches)
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def machine() -> dict:
    """What the numbers were measured on."""
    cpu = platform.processor() or "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpu": cpu, "cores_visible": os.cpu_count(), "python": platform.python_version(),
            "numpy": np.__version__, "lengthsched": lengthsched.__version__, "platform": platform.platform()}


_CORES = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set()


def pin_one_core() -> None:
    """Run on one CPU core, so that timings do not depend on scheduling across cores."""
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})


def unpin() -> None:
    """Run on every core this process was given again (after :func:`pin_one_core`)."""
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, _CORES)


def report(results: dict, texts: list[str], out: str | Path, note: str) -> None:
    """Print the tables under a machine line and write ``results`` as JSON (atomically)."""
    info = results["machine"]
    print(f"machine: {info['cpu']}, {info['cores_visible']} cores visible, python {info['python']}, "
          f"numpy {info['numpy']}; {note}\n")
    print("\n".join(texts))
    write_json(out, results)


def run_sections(ap, args, sections: dict, *extra, checkpoint=None) -> tuple[list[str], dict]:
    """Run the comma-separated ``args.sections`` (name -> fn(args, *extra) -> (markdown, raw)); every name
    is checked before any runs. ``checkpoint(results)``, when given, is called after each section with
    the raw results so far, their ``section_seconds`` and their ``markdown`` tables, so a run cut off
    by a timeout keeps the sections it finished; progress goes to stderr."""
    names = args.sections.split(",")
    for name in names:
        if name not in sections:
            ap.error(f"--sections: unknown section {name!r}; expected some of {', '.join(sections)}")
    texts, results, seconds = [], {}, {}
    for name in names:
        start = time.perf_counter()
        text, raw = sections[name](args, *extra)
        seconds[name] = round(time.perf_counter() - start, 2)
        texts.append(text)
        results[name] = raw
        print(f"[{name}] done in {seconds[name]:.1f} s", file=sys.stderr, flush=True)
        if checkpoint is not None:
            checkpoint({**results, "section_seconds": dict(seconds), "markdown": list(texts)})
    results["section_seconds"] = seconds
    return texts, results


def write_json(path: str | Path, results: dict) -> None:
    """Write ``results`` as JSON (atomically), creating the folder."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(results, indent=1) + "\n")


@contextmanager
def patched(obj, **attrs):
    """``obj``'s attributes (a policy class's options, a module's function) set to ``attrs`` inside the
    block, restored after it (in this process only)."""
    saved = {name: getattr(obj, name) for name in attrs}
    try:
        for name, value in attrs.items():
            setattr(obj, name, value)
        yield
    finally:
        for name, value in saved.items():
            setattr(obj, name, value)
