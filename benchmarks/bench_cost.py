"""Step-cost model (lengthsched.cost) against measured GPU operator times (results go to docs/cost.md).

Run from the repository root (data processing only, a few seconds; no GPU needed):

    python benchmarks/bench_cost.py                 # every profile and tensor-parallel degree
    python benchmarks/bench_cost.py --quick         # one profile, degrees 1 and 2 (what the test suite runs)

Section ``vidur``: Vidur's profiles (microsoft/vidur, MIT; shipped in benchmarks/data/vidur, see
its README) give the measured GPU time of each non-attention operator of ONE decoder layer on one
tensor-parallel worker, at num_tokens = 1 .. 4096 (32768 for Llama-3-8B) tokens in the batch, on
H100 and A100. For each profile and degree the script builds the matching roofline with
:class:`lengthsched.cost.StepCost` (one layer's weights per worker read once, plus activations;
2 x parameters FLOPs per token; the GPU preset's datasheet numbers) and compares it with the
measured per-layer time (sum of the operators' medians) at every num_tokens:

- ``linear``: the four GEMMs (attn_pre_proj = QKV, attn_post_proj = O, mlp_up_proj, mlp_down_proj)
  against the model with the GEMMs' input and output activations;
- ``layer``: also the elementwise operators (input_layernorm, attn_rope, post_attention_layernorm,
  mlp_act, add; phi-2 has no post_attention_layernorm) against the model with their activation
  traffic added to the bytes. ``emb`` is
  left out (once per model, not per layer); attention is not in these profiles.

Errors are |modelled / measured - 1|. "unfitted" = the GPU preset's priors (bandwidth efficiency
0.75, compute efficiency 0.65) with zero overhead (these are GPU kernel times, not engine steps);
"fitted" = :meth:`StepCost.fit` on every other num_tokens point (even positions in increasing
order), errors on the other half. Writes ``--out`` (default benchmarks/results/cost_vidur.json).
"""

from __future__ import annotations

import argparse
import csv
import gzip
import sys
from pathlib import Path

import numpy as np
from common import ROOT, machine, report, run_sections, table

from lengthsched.cost import GPU_PRESETS, StepCost, error_stats

DATA = ROOT / "benchmarks" / "data" / "vidur"
LINEAR_OPS = ("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj")
ELEMENTWISE_OPS = ("input_layernorm", "attn_rope", "post_attention_layernorm", "mlp_act", "add")
PROFILES = (  # (file, GPU preset, model)
    ("h100_meta-llama_Llama-2-7b-hf_mlp.csv.gz", "h100", "Llama-2-7b"),
    ("h100_microsoft_phi-2_mlp.csv.gz", "h100", "phi-2"),
    ("a100_meta-llama_Llama-2-7b-hf_mlp.csv.gz", "a100", "Llama-2-7b"),
    ("a100_meta-llama_Meta-Llama-3-8B_mlp.csv.gz", "a100", "Llama-3-8B"),
)
BF16 = 2  # bytes per element: the profiles are bf16/fp16 runs


def read_profile(path: Path) -> tuple[dict, dict[int, list[tuple[int, float, float]]]]:
    """(shapes, {tp: [(num_tokens, linear seconds, layer seconds), ...] sorted by num_tokens}).

    Per-layer seconds are sums of the operators' median times; a (num_tokens, tp) pair measured
    twice gets the median of its sums."""
    with gzip.open(path, "rt", newline="") as handle:
        rows = list(csv.DictReader(handle))
    first = rows[0]
    shapes = {k: int(first[k]) for k in ("n_head", "n_kv_head", "n_embd", "n_expanded_embd")}
    shapes["gated"] = first["use_gated_mlp"].strip().lower() == "true"
    shapes["elementwise"] = [op for op in ELEMENTWISE_OPS if f"time_stats.{op}.median" in first]  # phi-2: one norm
    sums: dict[tuple[int, int], list[tuple[float, float]]] = {}
    for r in rows:
        linear = sum(float(r[f"time_stats.{op}.median"]) for op in LINEAR_OPS) * 1e-3
        other = sum(float(r[f"time_stats.{op}.median"]) for op in shapes["elementwise"]) * 1e-3
        key = (int(r["num_tensor_parallel_workers"]), int(r["num_tokens"]))
        sums.setdefault(key, []).append((linear, linear + other))
    by_tp: dict[int, list[tuple[int, float, float]]] = {}
    for (tp, tokens), values in sorted(sums.items()):
        v = np.asarray(values)
        by_tp.setdefault(tp, []).append((tokens, float(np.median(v[:, 0])), float(np.median(v[:, 1]))))
    return shapes, by_tp


def layer_cost(shapes: dict, tp: int, gpu: str, name: str, *, elementwise: bool) -> StepCost:
    """The roofline of one decoder layer's non-attention operators on one of ``tp`` workers.

    Column-parallel QKV and up projections, row-parallel O and down projections (Megatron style,
    as Vidur shards them): each worker holds 1 / tp of every GEMM's weights. Activations per token:
    each GEMM reads its input and writes its output (hidden-size ones are full, the others
    sharded); with ``elementwise``, the two RMSNorms (read + write hidden), rotary embedding (read +
    write the q and k shards), the MLP activation (read the up output, write the intermediate) and
    the residual add (read two, write one hidden vector) are added, for the operators the profile
    has (phi-2 has no post-attention norm). No KV, no attention, no LM head.
    """
    h, heads, kv_heads, inter = (shapes[k] for k in ("n_embd", "n_head", "n_kv_head", "n_expanded_embd"))
    head_dim = h // heads
    qkv, q = (heads + 2 * kv_heads) * head_dim, heads * head_dim
    up = 2 * inter if shapes["gated"] else inter
    params = (h * qkv + q * h + h * up + inter * h) / tp
    act = (h + qkv / tp) + (q / tp + h) + (h + up / tp) + (inter / tp + h)
    if elementwise:  # elements read + written per token by each elementwise operator the profile has
        moved = {"input_layernorm": 2 * h, "attn_rope": 2 * (heads + kv_heads) * head_dim / tp,
                 "post_attention_layernorm": 2 * h, "mlp_act": (up + inter) / tp, "add": 3 * h}
        act += sum(moved[op] for op in shapes["elementwise"])
    spec = GPU_PRESETS[gpu]
    return StepCost(model=f"{name} layer, 1/{tp} shard", gpu=gpu, bandwidth=spec.bandwidth, peak_flops=spec.peak_flops,
                    link_bandwidth=spec.link_bandwidth, weights_bytes=round(BF16 * params),
                    active_parameters=round(params), lm_head_parameters=0, kv_bytes_per_token=0,
                    attention_flops_per_kv_token=0, activation_bytes_per_token=round(BF16 * act), num_layers=1,
                    hidden_size=h, dtype_bytes=BF16, tp=1, overhead_seconds=0.0)


def compare(prior: StepCost, tokens: np.ndarray, seconds: np.ndarray) -> tuple[dict, np.ndarray, np.ndarray]:
    """Unfitted errors on every point; fitted on even positions, errors on odd positions.
    Returns the summary and the two arrays of signed errors."""
    samples = {"decode_rows": tokens, "kv_tokens_read": np.zeros_like(tokens), "prefill_tokens": np.zeros_like(tokens),
               "seconds": seconds}
    unfitted = prior.errors(samples)
    train = {k: v[0::2] for k, v in samples.items()}
    held = {k: v[1::2] for k, v in samples.items()}
    fitted = prior.fit(train)
    held_err = fitted.errors(held)
    worst = int(np.argmax(np.abs(unfitted)))
    bound = prior.decode_compute_bound_rows(0)
    return {"points": int(tokens.size), "unfitted": error_stats(unfitted),
            "unfitted_worst_at_tokens": int(tokens[worst]),
            "unfitted_signed_at_worst": float(unfitted[worst]),
            "fitted_held_out": error_stats(held_err), "fitted_train": error_stats(fitted.errors(train)),
            "fitted_parameters": fitted.parameters(), "prior_compute_bound_from_tokens": float(bound),
            "fitted_compute_bound_from_tokens": float(fitted.decode_compute_bound_rows(0)),
            "tokens": [int(t) for t in tokens], "unfitted_errors": [round(float(e), 4) for e in unfitted],
            "fitted_held_out_errors": [round(float(e), 4) for e in held_err]}, unfitted, held_err


def section_vidur(args) -> tuple[str, dict]:
    profiles = PROFILES[:1] if args.quick else PROFILES
    rows, raw, pooled = [], [], {"linear": ([], []), "layer": ([], [])}
    for file, gpu, name in profiles:
        shapes, by_tp = read_profile(Path(args.data) / file)
        for tp, points in sorted(by_tp.items()):
            if args.quick and tp > 2:
                continue
            tokens = np.array([p[0] for p in points], dtype=np.float64)
            for variant, column in (("linear", 1), ("layer", 2)):
                seconds = np.array([p[column] for p in points])
                prior = layer_cost(shapes, tp, gpu, name, elementwise=variant == "layer")
                summary, unfitted, held = compare(prior, tokens, seconds)
                result = {"file": file, "gpu": gpu, "model": name, "tp": tp, "variant": variant, **summary}
                raw.append(result)
                pooled[variant][0].extend(unfitted.tolist())
                pooled[variant][1].extend(held.tolist())
                u, f, p = result["unfitted"], result["fitted_held_out"], result["fitted_parameters"]
                rows.append([gpu, name, tp, variant, result["points"], 100 * u["median"], 100 * u["max"],
                             result["unfitted_worst_at_tokens"], 100 * f["median"], 100 * f["max"],
                             p["overhead_seconds"] * 1e6, p["bandwidth_efficiency"], p["compute_efficiency"]])
    summary = {v: {"unfitted": error_stats(pooled[v][0]), "fitted_held_out": error_stats(pooled[v][1])} for v in pooled}
    text = table("Vidur operator profiles: modelled vs measured per-layer time; |relative error| in % "
                 "(unfitted = preset priors, zero overhead; fitted on alternate num_tokens, errors on the others)",
                 ["GPU", "model", "tp", "ops", "points", "unfitted median %", "unfitted max %", "worst at tokens",
                  "fitted median %", "fitted max %", "fitted overhead us", "fitted bw eff", "fitted compute eff"], rows)
    text += "\n" + table("All profiles and degrees pooled: |relative error| in %",
                         ["ops", "points", "unfitted median %", "unfitted p90 %", "unfitted max %",
                          "fitted held-out median %", "fitted held-out p90 %", "fitted held-out max %"],
                         [[v, s["unfitted"]["n"], 100 * s["unfitted"]["median"], 100 * s["unfitted"]["p90"],
                           100 * s["unfitted"]["max"], 100 * s["fitted_held_out"]["median"],
                           100 * s["fitted_held_out"]["p90"], 100 * s["fitted_held_out"]["max"]]
                          for v, s in summary.items()])
    return text, {"rows": raw, "summary": summary}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="one profile, tensor-parallel degrees 1 and 2 (smoke test)")
    parser.add_argument("--sections", default="vidur", help="comma-separated sections: vidur")
    parser.add_argument("--data", default=str(DATA), help="folder of the Vidur profiles")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "cost_vidur.json"))
    args = parser.parse_args(argv)
    texts, results = run_sections(parser, args, {"vidur": section_vidur})
    results = {"machine": machine(), "command": " ".join([Path(sys.argv[0]).name] + (argv or sys.argv[1:])),
               **results}
    report(results, texts, args.out, "data, not timing: the numbers do not depend on this machine")
    return 0


if __name__ == "__main__":
    sys.exit(main())
