"""Planning speed and quality benchmarks (results go to docs/benchmarks.md).

Run from the repository root on an otherwise idle machine:

    python benchmarks/bench_planning.py                 # full run, about 2 minutes
    python benchmarks/bench_planning.py --quick         # smoke run (what the test suite does)
    python benchmarks/bench_planning.py --sections coordinator   # a StealDriver poll's cost (coordinator.json)
    python benchmarks/bench_planning.py --sections share   # AReaL ranks sharing what they learn (share.json)

It pins itself to one CPU core, reports medians over repetitions, and writes the tables as
Markdown to stdout and as JSON to ``--out`` (default benchmarks/results/planning.json).
Lengths come from the CASTILLO groups bundled in lengthsched/data (real Qwen2.5-7B completion
lengths, resampled within one prompt for G > 10) and from a uniform distribution.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
from common import ROOT, machine, median_ms, pin_one_core, report, table

import lengthsched
from lengthsched import ModelMemory, partition, plan_group
from lengthsched.io import DATA_DIR


def castillo_groups() -> list[list[int]]:
    rows = [json.loads(line) for line in (DATA_DIR / "castillo_qwen2.5-7b_lengths.jsonl").read_text().splitlines()]
    return [r["lengths"] for r in rows if max(r["lengths"]) < 15001]  # drop runaway samples at the cap


def real_group(rng, groups, size: int) -> np.ndarray:
    return rng.choice(groups[rng.integers(len(groups))], size=size)


def uniform(rng, size: int) -> np.ndarray:
    return rng.integers(1, 2048, size=size)


def bench_plan_group(rng, groups, reps: int, instances: int) -> tuple[str, list]:
    memory = ModelMemory.from_preset("qwen3-1.7b")
    rows = []
    # (G, slots, budget, reservation): slots mode, or budget mode reserving L_max or the true length.
    cases = [(8, 4, None, None), (32, 8, None, None), (32, None, "24GiB", "max"), (32, None, "24GiB", "oracle"),
             (128, 32, None, None), (1024, 64, None, None), (1024, 256, None, None),
             (1024, None, "40GiB", "max"), (1024, None, "40GiB", "oracle")]
    def kwargs_for(x, slots, budget, reserve):
        kwargs = dict(max_new_tokens=4096, prompt_tokens=300)
        if budget:
            kwargs.update(budget_bytes=lengthsched.parse_bytes(budget), memory=memory,
                          reserve_lengths=x if reserve == "oracle" else None)
        else:
            kwargs.update(slots=slots)
        return kwargs

    for g, slots, budget, reserve in cases:
        lens = [real_group(rng, groups, g) for _ in range(instances)]
        it = iter(range(10**9))

        def one(lens=lens, it=it, case=(slots, budget, reserve)):
            x = lens[next(it) % instances]
            plan_group(x, **kwargs_for(x, *case))

        ms = median_ms(one, reps)
        ratios = [plan_group(x, **kwargs_for(x, slots, budget, reserve)).ratio for x in lens]
        rows.append([g, slots or "-", budget or "-", reserve or "-", ms, float(np.mean(ratios)), float(np.max(ratios))])
    return table("plan_group latency (default path: FPTAS grouping, SJF refill), median ms; "
                 "steps/LB under oracle lengths",
                 ["G", "slots", "budget", "reserve", "median ms", "mean steps/LB", "max steps/LB"], rows), rows


def bench_fptas(rng, reps: int, instances: int) -> tuple[str, list]:
    rows = []

    def run(label, n, k, eps, family):
        data = [family(n) for _ in range(instances)]
        it = iter(range(10**9))
        auto = median_ms(lambda: partition.fptas(data[next(it) % instances], k, eps), reps)
        it2 = iter(range(10**9))
        dp = median_ms(lambda: partition.fptas(data[next(it2) % instances], k, eps, certify=False), reps)
        it3 = iter(range(10**9))
        try:
            raw = median_ms(lambda: partition.fptas(data[next(it3) % instances], k, eps, certify=False,
                                                    prune=False), min(reps, 5))
        except partition.StateLimitExceeded:
            raw = "state limit"
        rows.append([label, family.__name__, n, k, eps, auto, dp, raw])

    tight = lambda n: rng.integers(1, 100, size=n)  # noqa: E731 - few jobs per part: heuristics often miss
    tight.__name__ = "tight"
    unif = lambda n: uniform(rng, n)  # noqa: E731
    unif.__name__ = "uniform"
    run("target", 64, 4, 0.05, unif)
    for n in (16, 32, 64, 128, 256):
        run("n", n, 4, 0.05, unif)
    for n in (8, 10, 12, 14):
        run("n", n, 4, 0.05, tight)
    for k in (2, 3, 4, 6, 8):
        run("k", 64, k, 0.05, unif)
    for k in (2, 3, 4):
        run("k", 3 * k, k, 0.05, tight)
    for eps in (0.2, 0.1, 0.05, 0.02, 0.01):
        run("1/eps", 64, 4, eps, unif)
    for eps in (0.2, 0.1, 0.05, 0.02, 0.01):
        run("1/eps", 12, 4, eps, tight)
    return table("FPTAS time, median ms (auto = certify by the lower bound first; dp = always run the "
                 "programme; raw dp = the programme without incumbent pruning, its polynomial worst case)",
                 ["varies", "lengths", "n", "k", "eps", "auto ms", "dp ms", "raw dp ms"], rows), rows


def bench_quality(rng, groups, instances: int) -> tuple[str, list]:
    algorithms = {
        "lpt": lambda s, k: partition.lpt(s, k),
        "karmarkar_karp": lambda s, k: partition.karmarkar_karp(s, k),
        "fptas eps=0.05": lambda s, k: partition.fptas(s, k, 0.05),
        "fptas eps=0.01": lambda s, k: partition.fptas(s, k, 0.01),
    }
    rows = []
    for family, make in (("uniform", lambda n: uniform(rng, n)), ("castillo", lambda n: real_group(rng, groups, n))):
        for n, k, reference in ((10, 3, "optimum"), (14, 4, "optimum"), (64, 8, "lower bound"),
                                (1024, 64, "lower bound")):
            data = [make(n) for _ in range(instances)]
            if reference == "optimum":
                refs = [partition.exact(x, k, time_limit_s=30).makespan for x in data]
            else:
                refs = [partition.lower_bound(x, k) for x in data]
            for name, algorithm in algorithms.items():
                ratios, limited = [], 0
                for x, r in zip(data, refs):
                    try:
                        ratios.append(algorithm(x, k).makespan / r)
                    except partition.StateLimitExceeded:  # plan_group falls back to the best heuristic
                        limited += 1
                        ratios.append(partition.best_heuristic(x, k).makespan / r)
                rows.append([family, n, k, reference, name, float(np.mean(ratios)), float(np.max(ratios)),
                             f"{limited}/{len(data)}"])
    return table("Makespan quality: makespan / reference (CP-SAT optimum for small n, lower bound for large n); "
                  "'state limit' counts FPTAS runs that stopped at max_states and fell back to the best heuristic",
                  ["lengths", "n", "k", "reference", "algorithm", "mean ratio", "max ratio", "state limit"], rows), rows


def _coordinator_state(rng, groups, replicas: int, per: int, drained: int | None):
    """A StealCoordinator with ``per`` requests submitted to each of ``replicas`` and observed once (3 of
    4 running, 500 tokens in; 1 of 4 waiting), and each replica's snapshot (``drained``: that replica's
    emptied, as if everything there finished)."""
    from lengthsched.integrations import StealCoordinator

    coord = StealCoordinator(replicas, pool_tokens=per * 700, chunk=128)
    snaps = []
    for r in range(replicas):
        snap = {}
        for i in range(per):
            coord.submit((r, i), r, float(real_group(rng, groups, 1)[0]), prompt_tokens=300, group=(r, i // 16))
            snap[(r, i)] = 500 if i < 3 * per // 4 else 0
        snaps.append(snap)
    for r in range(replicas):
        coord.observe(r, snaps[r])
    if drained is not None:
        snaps[drained] = {}
    return coord, snaps


def _poll(coord, snaps, grown: int) -> int:
    """One poll: every replica observed with its running requests ``grown`` tokens further; the moves."""
    for r, snap in enumerate(snaps):
        coord.observe(r, {rid: (n + grown if n else 0) for rid, n in snap.items()})
    return len(coord.decide())


class _SnapshotServer:
    """A vLLM server with snapshots, in process: its snapshot fixed (what arrives from Ray, already decoded), an
    abort that finds nothing (no move is wanted in the steady state)."""

    def __init__(self, snap: dict):
        self.snap = snap

    def lengthsched_snapshot(self) -> dict:
        return self.snap

    def abort_request(self, request_id: str, reset_prefix_cache: bool = True) -> dict:
        return {"aborted": False, "request_id": request_id}


def _driver_state(rng, groups, replicas: int, per: int):
    """A StealDriver over in-process servers in :func:`_coordinator_state`'s steady state: ``per`` requests on each
    replica, 3 of 4 running 500 tokens in, 1 of 4 waiting, each snapshot keyed by the requests' vLLM ids."""
    from types import SimpleNamespace

    from lengthsched.integrations import StealCoordinator
    from lengthsched.integrations.verl_stealing import StealDriver, vllm_request_id

    snaps = [{"generated": {}, "finished": []} for _ in range(replicas)]
    driver = StealDriver(StealCoordinator(replicas, pool_tokens=per * 700, chunk=128),
                         SimpleNamespace(reroute=lambda *args: None), [_SnapshotServer(s) for s in snaps])
    for r in range(replicas):
        for i in range(per):
            key = r * per + i
            driver.submit(key, r, float(real_group(rng, groups, 1)[0]), prompt_tokens=300, group=(r, i // 16))
            snaps[r]["generated"][vllm_request_id(key, f"client-{key}", 0)] = 500 if i < 3 * per // 4 else 0
    return driver


def bench_coordinator(rng, groups, reps: int, cases) -> tuple[str, list]:
    """What one poll of a StealDriver costs the process that runs it (verl's agent-loop manager): the
    coordinator's ``observe`` of every replica's snapshot and its ``decide``, median ms over ``reps``
    polls, in two states: steady (every replica busy with requests waiting: nothing to decide) and a
    drain (one replica finished everything: it steals); and the whole steady poll of a
    :class:`~lengthsched.integrations.verl_stealing.StealDriver` (:meth:`poll_once` over in-process servers: every
    snapshot read by vLLM id, the coordinator's part, nothing to apply; without the Ray calls and the snapshots'
    transfer). ``cases``: (replicas, requests per replica); requests come in groups of 16 with CASTILLO lengths as
    predictions."""
    rows = []
    loop = asyncio.new_event_loop()
    for replicas, per in cases:
        coord, snaps = _coordinator_state(rng, groups, replicas, per, None)
        tick = iter(range(1, 10**9))
        steady_ms = median_ms(lambda c=coord, s=snaps, t=tick: _poll(c, s, 64 * next(t)), reps)
        assert _poll(coord, snaps, 64 * next(tick)) == 0
        times, moves = [], []
        for _ in range(max(3, reps // 10)):
            coord, snaps = _coordinator_state(rng, groups, replicas, per, 0)
            start = time.perf_counter()
            moves.append(_poll(coord, snaps, 200))
            times.append(time.perf_counter() - start)
        driver = _driver_state(rng, groups, replicas, per)
        loop.run_until_complete(driver.poll_once())  # the first round submits nothing new: the state settles
        driver_ms = median_ms(lambda d=driver: loop.run_until_complete(d.poll_once()), reps)
        assert driver.stats.applied.maxlen and not driver.stats.applied and driver.stats.errors == 0
        rows.append([replicas, per, replicas * per, steady_ms, statistics.median(times) * 1e3,
                     int(statistics.median(moves)), driver_ms])
    loop.close()
    return table("StealCoordinator: one poll (observe every replica's snapshot, then decide), median ms, "
                 "one core; steady = nothing to decide; drain = one replica finished everything; driver = "
                 "StealDriver.poll_once in the steady state (snapshots read by vLLM id, then the coordinator)",
                 ["replicas", "requests per replica", "requests", "steady ms", "drain ms", "moves in a drain",
                  "driver steady ms"], rows), rows


def _sharing_ranks(root: Path, prompts: int, ranks: int, per_step: int, rng):
    """``ranks`` GroupRouters sharing ``root`` in the steady state of a long run: every rank knows ``prompts``
    prompts (4 completions each seen), has written its whole file and one step's change file, and each has just
    observed ``per_step`` groups of the next step (not yet written)."""
    from lengthsched.integrations import areal as la

    seed = la.GroupRouter(10_000, group_size=4, batch=1, rank=ranks, share_dir=root / "seed")
    keys = [f"prompt {i}: " + "x" * 80 for i in range(prompts)]  # long: kept under digests, as real prompts are
    lengths = rng.integers(1, 4096, size=(prompts, 4))
    for start in range(0, prompts, 1000):
        chunk = keys[start:start + 1000]
        seed.planner.observe([k for k in chunk for _ in range(4)], lengths[start:start + 1000].ravel().tolist(),
                             step=1)
    state = json.loads(json.dumps(seed.planner.state()))
    routers = []
    for k in range(ranks):
        router = la.GroupRouter(10_000, group_size=4, batch=1, rank=k, share_dir=root / "share")
        router.planner.predictor.load_state_dict(state["predictor"])
        router.planner.steps = 1
        router.planner.save_state(router.state_path)
        routers.append(router)
    for router in routers:
        router.write_changes()
    for router in routers:
        router.merge()  # the first read: whole files; from now on change files
    for router in routers:
        chosen = rng.choice(prompts, size=per_step, replace=False)
        router.planner.observe([keys[i] for i in chosen for _ in range(4)],
                               rng.integers(1, 4096, size=4 * per_step).tolist(), step=2)
        router._changed.update((keys[i], None) for i in chosen)
    return routers


def _share_case(root: Path, prompts: int, ranks: int, per_step: int, rng, reps: int) -> list:
    """One row of :func:`bench_share`."""
    from lengthsched.integrations import areal as la

    routers = _sharing_ranks(root, prompts, ranks, per_step, rng)
    me = routers[0]
    whole_write = median_ms(lambda: me.planner.save_state(me.state_path), max(3, reps // 3))
    mine = dict(me._changed)
    for router in routers[1:]:  # the other ranks write the step's changes
        router.write_changes()

    def write_changes():  # a step's change file alone (the whole file is not due)
        me._changed = dict(mine)
        me._unsaved = 1
        me.write_changes()

    def by_changes():
        me._read = {k: 1 for k in range(1, ranks)}  # read up to step 1: the step-2 files are new
        return me.merge()

    def by_whole():
        return sum(me._merge_whole(f"rank{k}.json", always=True)[0] for k in range(1, ranks))

    change_write = median_ms(write_changes, reps)
    changes_ms = median_ms(by_changes, reps)
    whole_ms = median_ms(by_whole, max(3, reps // 3))
    # a restart: the whole file, then the WHOLE_EVERY - 1 change files written after it (the most there can be)
    me.planner.save_state(me.state_path)
    me._since = me.planner.steps
    for _ in range(la.WHOLE_EVERY - 1):
        me.planner.steps += 1
        write_changes()

    def restart():
        resumed = la.GroupRouter(10_000, group_size=4, batch=1, rank=0, share_dir=root / "share")
        assert resumed.status()["replayed"] == la.WHOLE_EVERY - 1
    restart_ms = median_ms(restart, max(3, reps // 3))
    size = (root / "share" / "rank1.json").stat().st_size
    change_size = max(p.stat().st_size for p in (root / "share").glob("rank1-*.json"))
    return [prompts, ranks, per_step, size / 1e6, change_size / 1e3, whole_write, change_write,
            change_write + whole_write / la.WHOLE_EVERY, restart_ms, whole_ms, changes_ms, whole_ms / changes_ms]


def bench_share(rng, reps: int, cases) -> tuple[str, list]:
    """What sharing what AReaL's ranks learn costs one rank at each rollout step
    (lengthsched.integrations.areal.GroupRouter with ``share_dir``), median ms over ``reps``: writing its whole
    file (its planner's state, for a restart: once in ``WHOLE_EVERY`` steps) and its change file (the prompts it
    observed in the step), a restart (the whole file and the change files after it), and merging the other ranks'
    step from their change files (what it does) against from their whole files (what it did before change
    files). ``cases``: (prompts known, ranks, groups per rank per step)."""
    import tempfile

    rows = []
    for prompts, ranks, per_step in cases:
        with tempfile.TemporaryDirectory() as tmp:
            rows.append(_share_case(Path(tmp), prompts, ranks, per_step, rng, reps))
    return table("Sharing what AReaL's ranks learn (lengthsched.integrations.areal, share_dir): one rank's cost at "
                 "each rollout step, median ms, one core; whole file = every prompt it knows (100-char prompts, "
                 "kept under digests); changes = the prompts each rank observed in the step",
                 ["prompts known", "ranks", "groups per rank per step", "whole file MB", "change file KB",
                  "write whole ms", "write changes ms", "own files per step ms (changes + whole / WHOLE_EVERY)",
                  "restart ms (whole + WHOLE_EVERY - 1 changes)", "merge others' whole files ms",
                  "merge others' changes ms", "whole / changes"], rows), rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="few repetitions (smoke test)")
    parser.add_argument("--out", default=None,
                        help="JSON results (default benchmarks/results/planning.json; with --sections coordinator "
                             "or share alone, benchmarks/results/coordinator.json or share.json)")
    parser.add_argument("--sections", default="plan_group,fptas,quality",
                        help="comma-separated, among plan_group, fptas, quality, coordinator, share "
                             "(default: the first three)")
    args = parser.parse_args(argv)
    known = ("plan_group", "fptas", "quality", "coordinator", "share")
    names = [n.strip() for n in args.sections.split(",") if n.strip()]
    bad = [n for n in names if n not in known]
    if bad or not names:
        parser.error(f"argument --sections: {args.sections!r} is not a list of sections among {', '.join(known)}")
    out = args.out or str(ROOT / "benchmarks" / "results" / (
        f"{names[0]}.json" if names in (["coordinator"], ["share"]) else "planning.json"))
    pin_one_core()
    rng = np.random.default_rng(2026)
    groups = castillo_groups()
    reps, instances = (3, 2) if args.quick else (200, 20)
    results = {"machine": machine(), "command": " ".join([Path(sys.argv[0]).name] + (argv or sys.argv[1:]))}
    texts = []
    sections = {
        "plan_group": lambda: bench_plan_group(rng, groups, reps, instances),
        "fptas": lambda: bench_fptas(rng, max(3, reps // 4), instances),
        "quality": lambda: bench_quality(rng, groups, 3 if args.quick else 30),
        "coordinator": lambda: bench_coordinator(rng, groups, 3 if args.quick else 30,
                                                 [(4, 64)] if args.quick else [(8, 128), (8, 512), (32, 128),
                                                                               (32, 512), (64, 512)]),
        "share": lambda: bench_share(rng, 3 if args.quick else 10,
                                     [(500, 4, 8)] if args.quick else [(10_000, 8, 32), (100_000, 8, 32)]),
    }
    for name in names:
        text, rows = sections[name]()
        texts.append(text)
        results[name] = rows
    report(results, texts, out, "pinned to one core")
    return 0


if __name__ == "__main__":
    sys.exit(main())
