"""Measure what moving one request's KV between engine replicas costs, against recomputing it.

Seer's divided rollout (arXiv 2511.14617) and ``steal``'s moves with ``WorkStealing.MIGRATE_KV``
carry a request's KV to another replica through a global KV pool in host memory (Mooncake) instead
of recomputing it there. The simulator prices that load at zero (``Engine.transferred``: an upper
bound). This script measures it on one GPU, the way a paged engine would do it:

- offload (device to host): the request's blocks of every layer are gathered from a paged cache
  (``[blocks, block_size * per-token elements]`` per layer, vLLM's 16-token blocks, block ids drawn
  at random) into one contiguous device staging buffer, then copied to pinned host memory;
- load (host to device): the reverse: pinned host to a staging buffer, then scattered into free
  blocks of every layer's cache;
- on-device (device to device): gather and scatter between two paged caches on the same GPU, with no
  host hop (what an NVLink copy could at best approach; one GPU cannot measure NVLink);
- overlap: whether a load on a side stream slows the decode steps running beside it (a memory-bound
  GEMM of 64 rows through the model's weight bytes, as many steps as fit in one 4096-token load, timed
  alone and beside the load).

Every size is timed with ``torch.cuda.synchronize`` around ``--reps`` repetitions after ``--warmup``
(median). ``seconds = latency + bytes / bandwidth`` is fitted per direction (least squares on relative
errors over the sizes), and each size's time is set beside the modelled time of recomputing those tokens as one
prefill (:class:`lengthsched.cost.StepCost`: the unfitted H100 preset and, where present, the
H100-fitted ``benchmarks/results/stepcost_h100_<model>.json``). Results go to ``--out`` after every
model, so a run cut off keeps the models it finished.

    python benchmarks/gpu_kv_transfer.py                         # cuda, qwen3-1.7b and qwen3-8b shapes
    python benchmarks/gpu_kv_transfer.py --device cpu --quick    # checks the code path only (no GPU evidence)
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
from common import ROOT, machine, write_json

from lengthsched.cost import StepCost
from lengthsched.memory import ModelMemory

BLOCK = 16  # tokens per KV block (vLLM's default)


def ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def fit_line(x: np.ndarray, y: np.ndarray) -> dict:
    """seconds = latency + bytes / bandwidth by least squares on relative errors; the fit's errors."""
    slope, intercept = np.polyfit(x, y, 1, w=1.0 / y)
    pred = intercept + slope * x
    rel = np.abs(pred / y - 1.0)
    return {"latency_seconds": float(intercept), "bytes_per_second": float(1.0 / slope) if slope > 0 else None,
            "max_rel_error": float(rel.max()), "median_rel_error": float(np.median(rel))}


def prefill_seconds(cost: StepCost, tokens: int) -> float:
    """Modelled seconds of one prefill of ``tokens`` tokens (causal, no decode rows)."""
    return float(cost.seconds(0, 0, tokens, tokens * (tokens + 1) // 2))


def median_seconds(torch, fn, reps: int, warmup: int, cuda: bool) -> float:
    """Median wall seconds of ``fn`` over ``reps`` runs after ``warmup`` (the GPU synchronised around each)."""
    for _ in range(warmup):
        fn()
    if cuda:
        torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        if cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def measure_model(torch, name: str, device: str, sizes: list[int], reps: int, warmup: int) -> dict:
    mem = ModelMemory.from_preset(name)
    layers = len(mem.layer_kv_bytes)
    per_layer = mem.layer_kv_bytes[0]
    if any(b != per_layer for b in mem.layer_kv_bytes):
        raise SystemExit(f"{name}: layers of different KV sizes are not handled here")
    elems = per_layer // 2  # bf16 elements per token per layer (K and V)
    block_elems = BLOCK * elems
    most = max(sizes)
    blocks_needed = -(-most // BLOCK)
    pool_blocks = 2 * blocks_needed + 8
    dtype = torch.bfloat16
    pin = device.startswith("cuda")
    caches = [torch.randn(pool_blocks, block_elems, device=device).to(dtype) for _ in range(layers)]
    others = [torch.empty(pool_blocks, block_elems, device=device, dtype=dtype) for _ in range(layers)]
    # Flat buffers: each size uses a contiguous prefix (a strided pinned destination takes a slow path).
    staging = torch.empty(layers * blocks_needed * block_elems, device=device, dtype=dtype)
    host = torch.empty(layers * blocks_needed * block_elems, dtype=dtype, pin_memory=pin)
    gen = torch.Generator().manual_seed(0)

    def timed(fn) -> float:
        return median_seconds(torch, fn, reps, warmup, pin)

    rows = []
    costs = {"preset": StepCost.from_model(name, "h100")}
    fitted = ROOT / "benchmarks" / "results" / f"stepcost_h100_{name}.json"
    if fitted.exists():
        costs["h100_fitted"] = StepCost.from_json(fitted.read_text())
    for tokens in sizes:
        nb = -(-tokens // BLOCK)
        src = torch.randperm(pool_blocks, generator=gen)[:nb].to(device)
        dst = torch.randperm(pool_blocks, generator=gen)[:nb].to(device)
        used = layers * nb * block_elems
        stage = staging[:used].view(layers, nb, block_elems)
        hbuf = host[:used].view(layers, nb, block_elems)

        def offload(src=src, stage=stage, hbuf=hbuf):
            for layer in range(layers):
                torch.index_select(caches[layer], 0, src, out=stage[layer])
            hbuf.copy_(stage, non_blocking=True)

        def load(dst=dst, stage=stage, hbuf=hbuf):
            stage.copy_(hbuf, non_blocking=True)
            for layer in range(layers):
                others[layer].index_copy_(0, dst, stage[layer])

        def on_device(src=src, dst=dst):
            for layer in range(layers):
                others[layer].index_copy_(0, dst, caches[layer].index_select(0, src))

        nbytes = nb * BLOCK * mem.kv_bytes_per_token
        row = {"tokens": tokens, "bytes": nbytes, "offload_seconds": timed(offload), "load_seconds": timed(load),
               "on_device_seconds": timed(on_device)}
        for key, cost in costs.items():
            row[f"recompute_seconds_{key}"] = prefill_seconds(cost, tokens)
        rows.append(row)
        print(f"{name} {tokens:6d} tokens {nbytes / 2**20:9.1f} MiB: offload {row['offload_seconds'] * 1e3:8.3f} ms, "
              f"load {row['load_seconds'] * 1e3:8.3f} ms, on device {row['on_device_seconds'] * 1e3:8.3f} ms, "
              f"recompute (preset) {row['recompute_seconds_preset'] * 1e3:8.3f} ms", flush=True)
    x = np.array([r["bytes"] for r in rows], dtype=np.float64)
    fits = {kind: fit_line(x, np.array([r[f"{kind}_seconds"] for r in rows]))
            for kind in ("offload", "load", "on_device")}
    return {"model": name, "layers": layers, "kv_bytes_per_token": mem.kv_bytes_per_token, "block_size": BLOCK,
            "rows": rows, "fits": fits}


def measure_overlap(torch, name: str, device: str, tokens: int, rows: int, reps: int, warmup: int) -> dict:
    """Whether a KV load on a side stream slows a decode-like step: a memory-bound GEMM of ``rows`` rows
    through a weight matrix of the model's weight bytes (what a decode step mostly reads), timed alone
    and while ``tokens`` tokens of KV are copied from pinned host memory on another stream."""
    mem = ModelMemory.from_preset(name)
    cost = StepCost.from_model(name, "h100")
    hidden = cost.hidden_size
    cols = max(cost.weights_bytes // 2 // hidden, 1)
    if not device.startswith("cuda"):
        cols = min(cols, 4096)  # the CPU check: a small matrix
    dtype = torch.bfloat16
    weight = torch.randn(hidden, cols, device=device).to(dtype)
    x = torch.randn(rows, hidden, device=device).to(dtype)
    elems = tokens * mem.kv_bytes_per_token // 2
    pin = device.startswith("cuda")
    host = torch.randn(elems).to(dtype)
    host = host.pin_memory() if pin else host
    dest = torch.empty(elems, device=device, dtype=dtype)
    side = torch.cuda.Stream() if pin else None

    def step():
        return x @ weight

    def load():
        if side is None:
            dest.copy_(host)
            return
        with torch.cuda.stream(side):
            dest.copy_(host, non_blocking=True)

    def timed(fn) -> float:
        return median_seconds(torch, fn, reps, warmup, pin)

    def steps_during_load() -> None:
        load()
        for _ in range(n_steps):
            step()

    step_alone = timed(step)
    load_alone = timed(load)
    n_steps = max(int(load_alone / max(step_alone, 1e-9)), 1)  # steps that fit in one load

    def steps_alone() -> None:
        for _ in range(n_steps):
            step()

    both = timed(steps_during_load)
    alone = timed(steps_alone)
    out = {"model": name, "rows": rows, "weight_bytes": hidden * cols * 2, "tokens_loaded": tokens,
           "step_seconds": step_alone, "load_seconds": load_alone, "steps": n_steps,
           "steps_seconds": alone, "steps_with_load_seconds": both,
           "slowdown": both / alone - 1.0}
    print(f"{name} overlap: {n_steps} steps of {rows} rows ({step_alone * 1e3:.3f} ms each) take {alone * 1e3:.2f} ms "
          f"alone, {both * 1e3:.2f} ms beside a {tokens}-token load ({load_alone * 1e3:.2f} ms alone): "
          f"{out['slowdown']:+.1%}", flush=True)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--models", default="qwen3-1.7b,qwen3-8b")
    ap.add_argument("--tokens", default="16,64,256,512,1024,2048,4096,8192,16384", help="request sizes in KV tokens")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="small sizes, few repetitions (checks the code path)")
    ap.add_argument("--out", default=None, help="JSON report (default benchmarks/results/kv_transfer_<card>.json)")
    args = ap.parse_args(argv)
    import torch

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("no CUDA device; use --device cpu for a check of the code path", file=sys.stderr)
        return 2
    models = args.models.split(",")
    for name in models:
        try:
            ModelMemory.from_preset(name)
        except Exception as exc:  # an unknown preset: one line, exit 2, nothing written
            ap.error(f"argument --models: {name!r}: {exc}")
    sizes = [16, 64, 256] if args.quick else ints(args.tokens)
    reps, warmup = (3, 1) if args.quick else (args.reps, args.warmup)
    card = torch.cuda.get_device_name(0) if args.device.startswith("cuda") else "cpu"
    short = "h100" if "H100" in card else "h200" if "H200" in card else "cpu" if card == "cpu" else "gpu"
    out = Path(args.out) if args.out else ROOT / "benchmarks" / "results" / f"kv_transfer_{short}.json"
    results = {"card": card, "device": args.device, "torch": torch.__version__, "machine": machine(),
               "command": " ".join(["python benchmarks/gpu_kv_transfer.py", *(sys.argv[1:] if argv is None else argv)]),
               "reps": reps, "warmup": warmup, "models": []}
    for name in models:
        results["models"].append(measure_model(torch, name, args.device, sizes, reps, warmup))
        write_json(out, results)
        for kind, fit in results["models"][-1]["fits"].items():
            bw = fit["bytes_per_second"]
            gbs = bw / 1e9 if bw else float("nan")
            print(f"{name} {kind}: latency {fit['latency_seconds'] * 1e6:.1f} us, bandwidth {gbs:.1f} GB/s "
                  f"(fit error max {fit['max_rel_error']:.1%})", flush=True)
    results["overlap"] = []
    for name in models:
        results["overlap"].append(measure_overlap(torch, name, args.device, 256 if args.quick else 4096, 64,
                                                  reps, warmup))
        write_json(out, results)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
