"""Measure engine-step times of a Qwen3-shaped model on one GPU and calibrate lengthsched.cost.

Run on a GPU machine through ``benchmarks/gpu_cost.sh`` (which bounds the time and records the
card), or directly:

    python benchmarks/gpu_cost.py                              # cuda, bf16, the full grid
    python benchmarks/gpu_cost.py --device cpu --quick         # tiny model and grid: checks the code path only

The model has the shapes of ``lengthsched/presets/<--model>.json`` (default qwen3-1.7b; qwen3-8b is
the rollout step's default model) and random weights, built with
``transformers`` from that config (``AutoModelForCausalLM.from_config``, attn_implementation
"sdpa"; nothing is downloaded). Steps are timed the way an engine runs them:

- decode: ``rows`` sequences each add one token after a context of ``ctx`` tokens. The KV of the
  context lives in static per-layer buffers filled with random values (no prefill needed); a
  registered attention function writes the new token's K and V into the last slot and runs
  ``torch.nn.functional.scaled_dot_product_attention`` (GQA) over the whole buffer, so each row
  attends ``ctx`` tokens: kv_tokens_read = rows x ctx;
- prefill: one prompt of ``T`` tokens, causal SDPA, K and V written to the buffers, logits of the
  last token only (as engines do): prefill_context = T (T + 1) / 2;
- mixed (``--mixed-chunks``, measured after the others and kept out of the fit): a prefill chunk of
  ``T`` tokens and ``rows`` decode rows of ``ctx`` tokens of context in ONE forward, packed as one
  sequence (chunk first, then the rows), as vLLM V1 and SGLang schedule chunked prefill beside
  decodes; logits of the chunk's last token and of every row. These steps go to ``..._mixed.jsonl``
  and the report gives the errors on them of the model fitted on the pure steps: whether a step's
  price adds its prefill and decode work as the model says.

Each step is captured as a CUDA graph where capture works (as vLLM and SGLang replay decode
steps; ``--eager`` to skip) and timed with CUDA events: ``--warmup`` runs, then the median of
``--reps``. Every measured step is appended to a JSON lines file as soon as it is measured (keys of
:func:`lengthsched.cost.read_samples`), so a run cut off by a time-out keeps what it measured.
Then :meth:`StepCost.fit_and_validate` fits on a seeded half of the steps and the report (held-out
errors of the fitted model and of the unfitted preset of this card) goes to ``--out``, by default
``benchmarks/results/cost_gpu_<card>.json``. A CPU run's numbers are not GPU evidence.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import time
from pathlib import Path

import numpy as np
from common import ROOT, machine, write_json

from lengthsched.cost import StepCost, error_stats, read_samples
from lengthsched.hfconfig import PRESET_DIR
from lengthsched.memory import ModelMemory

ATTENTION = "lengthsched_cost_static_kv"
TINY = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 256}


def ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def preset_for(card: str) -> str:
    """The GPU preset of a CUDA device name (H100 when nothing matches; the report names the card)."""
    lower = card.lower()
    for name in ("h200", "h100", "a100", "l40s", "b200"):
        if name in lower:
            return name
    return "h100"


class StaticKV:
    """Per-layer K / V buffers (views into one allocation) and the attention that uses them."""

    def __init__(self, torch, layers: int, kv_heads: int, head_dim: int, max_tokens: int, dtype, device):
        self.torch, self.kv_heads, self.head_dim = torch, kv_heads, head_dim
        self.store = torch.randn((2, layers, max_tokens * kv_heads * head_dim), dtype=dtype, device=device)
        self.k = self.v = self.pk = self.pv = None
        self.decode, self.chunk, self.pieces = True, 0, 1
        try:
            q, kv = torch.zeros(1, 2, 1, 4), torch.zeros(1, 1, 2, 4)
            torch.nn.functional.scaled_dot_product_attention(q, kv, kv, enable_gqa=True)
            self.gqa = True
        except (TypeError, RuntimeError):  # torch < 2.5: repeat the KV heads (a copy)
            self.gqa = False

    def shape(self, rows: int, ctx: int, decode: bool, chunk: int = 0, pieces: int = 1) -> None:
        """Use the first rows x ctx tokens of each layer's buffer as a (rows, kv_heads, ctx, head_dim) cache;
        ``chunk`` > 0: a mixed step, a prefill chunk of that many tokens before the rows (in the same buffers,
        after the rows' context), made of ``pieces`` sequences of chunk / pieces tokens each (causal within
        each: several prompts prefilled in one step attend their own tokens only)."""
        n = rows * self.kv_heads * ctx * self.head_dim
        view = (rows, self.kv_heads, ctx, self.head_dim)
        self.k = [self.store[0, i, :n].view(view) for i in range(self.store.shape[1])]
        self.v = [self.store[1, i, :n].view(view) for i in range(self.store.shape[1])]
        m = chunk * self.kv_heads * self.head_dim
        pview = (pieces, self.kv_heads, chunk // pieces, self.head_dim)
        self.pk = [self.store[0, i, n:n + m].view(pview) for i in range(self.store.shape[1])]
        self.pv = [self.store[1, i, n:n + m].view(pview) for i in range(self.store.shape[1])]
        self.decode, self.chunk, self.pieces = decode, chunk, pieces

    def _sdpa(self, query, k, v, causal: bool, scaling):
        sdpa = self.torch.nn.functional.scaled_dot_product_attention
        if self.gqa:
            return sdpa(query, k, v, is_causal=causal, scale=scaling, enable_gqa=True)
        groups = query.shape[1] // k.shape[1]
        return sdpa(query, k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1), is_causal=causal,
                    scale=scaling)

    def mixed(self, layer: int, query, key, value, scaling):
        """One packed sequence: the chunk's ``self.chunk`` tokens (``self.pieces`` sequences, each causal among
        its own tokens), then one token per decode row (each attends its own context buffer, the new token
        written to its last slot)."""
        t, p = self.chunk, self.pieces
        pk, pv, kb, vb = self.pk[layer], self.pv[layer], self.k[layer], self.v[layer]

        def split(x):  # (1, heads, t, d) -> (pieces, heads, t / pieces, d)
            return x[0, :, :t].unflatten(1, (p, t // p)).transpose(0, 1)

        pk.copy_(split(key))
        pv.copy_(split(value))
        # contiguous slices, so that SDPA picks the kernels it picks for the separate steps
        out_p = self._sdpa(split(query).contiguous(), pk, pv, True, scaling)
        out_p = out_p.transpose(0, 1).flatten(1, 2).unsqueeze(0)
        # (1, heads, rows, d) -> (rows, heads, 1, d): each row is its own sequence
        kb[:, :, -1:].copy_(key[0, :, t:].transpose(0, 1).unsqueeze(2))
        vb[:, :, -1:].copy_(value[0, :, t:].transpose(0, 1).unsqueeze(2))
        out_d = self._sdpa(query[0, :, t:].transpose(0, 1).unsqueeze(2).contiguous(), kb, vb, False, scaling)
        out_d = out_d.squeeze(2).transpose(0, 1).unsqueeze(0)
        return self.torch.cat([out_p, out_d], dim=2)

    def attention(self, module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
        if self.chunk:
            return self.mixed(module.layer_idx, query, key, value, scaling).transpose(1, 2).contiguous(), None
        kb, vb = self.k[module.layer_idx], self.v[module.layer_idx]
        if self.decode:  # the new token goes to the last slot; attend to the whole context
            kb[:, :, -1:].copy_(key)
            vb[:, :, -1:].copy_(value)
            k, v, causal = kb, vb, False
        else:  # prefill: write the prompt's K and V, attend causally within it
            kb[:, :, : key.shape[2]].copy_(key)
            vb[:, :, : value.shape[2]].copy_(value)
            k, v, causal = key, value, True
        return self._sdpa(query, k, v, causal, scaling).transpose(1, 2).contiguous(), None


def build_model(torch, fields: dict, dtype, device):
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(fields["model_type"], **{k: v for k, v in fields.items() if k != "model_type"})
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
    finally:
        torch.set_default_dtype(previous)
    return model.eval()


def register(kv: StaticKV, compiled: bool = False) -> None:
    """Register the static-KV attention; under --compile it runs eagerly (one SDPA kernel and a KV write)
    and is left out of the compiled layers, which would otherwise be specialised on each layer's index."""
    from transformers import AttentionInterface

    fn = kv.attention
    if compiled:
        fn = kv.torch.compiler.disable(fn)
    AttentionInterface.register(ATTENTION, fn)


class Timer:
    """Median seconds of a step: CUDA graph replay where capture works, else eager; CUDA events on a GPU."""

    def __init__(self, torch, device, warmup: int, reps: int, graphs: bool):
        self.torch, self.cuda = torch, device.type == "cuda"
        self.warmup, self.reps, self.graphs = warmup, reps, graphs and device.type == "cuda"

    def _once(self, fn) -> float:
        if not self.cuda:
            start = time.perf_counter()
            fn()
            return time.perf_counter() - start
        start, end = self.torch.cuda.Event(enable_timing=True), self.torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3

    def time(self, fn) -> tuple[float, float, bool]:
        """(median, min) seconds over the reps, and whether a CUDA graph was replayed."""
        torch, graph = self.torch, None
        if self.graphs:
            try:
                stream = torch.cuda.Stream()
                stream.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(stream):
                    for _ in range(self.warmup):
                        fn()
                torch.cuda.current_stream().wait_stream(stream)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    fn()
            except Exception as exc:  # noqa: BLE001 - any capture failure: measure eagerly from now on
                print(f"CUDA graph capture failed ({type(exc).__name__}: {str(exc)[:200]}); timing eagerly",
                      file=sys.stderr, flush=True)
                self.graphs, graph = False, None
                torch.cuda.synchronize()
        run = graph.replay if graph is not None else fn
        for _ in range(self.warmup):
            run()
        times = [self._once(run) for _ in range(self.reps)]
        del graph
        return statistics.median(times), min(times), run is not fn


def forward_fn(torch, model, ids, positions, keep: int | None):
    # A ready 4-D mask is passed through as is by every transformers version, so no mask is built (mask
    # building may read tensors on the host, which a CUDA graph capture forbids); the attention ignores it.
    mask = torch.ones((1, 1, 1, 1), dtype=torch.bool, device=ids.device)
    kwargs = dict(input_ids=ids, position_ids=positions, attention_mask=mask, use_cache=False)
    if keep is not None:  # the logits of the last `keep` positions only (as engines compute them)
        kwargs["logits_to_keep"] = keep

    def step():
        return model(**kwargs).logits

    return step


class Stepper:
    """Times engine steps of ``model`` (one per :meth:`step`): the static-KV attention registered, a CUDA
    graph per shape where capture works (:class:`Timer`), each decoder layer compiled with ``compile``.
    ``max_tokens``: the KV buffer (rows x context + chunk tokens of the largest step)."""

    def __init__(self, torch, model, fields: dict, device, max_tokens: int, *, warmup: int, reps: int,
                 graphs: bool, compile: bool = False, seed: int = 0):
        self.torch, self.model, self.fields, self.device = torch, model, fields, device
        dtype = next(model.parameters()).dtype
        self.kv = StaticKV(torch, fields["num_hidden_layers"], fields["num_key_value_heads"], fields["head_dim"],
                           max_tokens, dtype, device)
        register(self.kv, compiled=compile)
        if hasattr(model, "set_attn_implementation"):
            model.set_attn_implementation(ATTENTION)
        else:  # older transformers
            model.config._attn_implementation = ATTENTION
        self.timer = Timer(torch, device, warmup, reps, graphs)
        self.compile, self.reps = compile, reps
        if compile:
            # Regional compilation: each decoder layer is compiled (dynamic shapes) and, the layers sharing one
            # code object, dynamo compiles that code once for all of them (the whole model, compiled at once,
            # took about 100 s per shape family on an H100 for 1.7B). The fused layers are where an engine's
            # kernels differ from the eager forward's; the embedding, final norm and LM head stay eager.
            import torch._dynamo

            torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
            if hasattr(torch._dynamo.config, "recompile_limit"):
                torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
            try:  # no size equalities guessed from coincident sizes (fewer recompiles)
                import torch.fx.experimental._config as fx_config

                fx_config.use_duck_shape = False
            except (ImportError, AttributeError):
                pass
            for layer in model.model.layers:
                layer.compile(dynamic=True)
        self.gen = torch.Generator(device=device).manual_seed(seed)

    def step(self, kind: str, rows: int, n: int, chunk: int = 0, pieces: int = 1) -> dict:
        """Time one step; its row of the samples file. decode: rows x (1 token after n of context);
        prefill: ``pieces`` sequences of n / pieces tokens each (causal within each); mixed: a chunk of
        ``chunk`` tokens (``pieces`` sequences), then rows x (1 token after n)."""
        torch, device, fields, gen = self.torch, self.device, self.fields, self.gen
        decode, mixed = kind == "decode", kind == "mixed"
        if kind == "prefill":  # a batch of pieces sequences, each attending its own n / pieces tokens
            self.kv.shape(pieces, n // pieces, False)
        else:
            self.kv.shape(rows, n, decode, chunk if mixed else 0, pieces if mixed else 1)
        if decode:
            ids = torch.randint(fields["vocab_size"], (rows, 1), device=device, generator=gen)
            positions, keep = torch.full((rows, 1), n - 1, device=device), (1 if self.compile else None)
        elif mixed:
            ids = torch.randint(fields["vocab_size"], (1, chunk + rows), device=device, generator=gen)
            positions = torch.cat([torch.arange(chunk, device=device) % (chunk // pieces),  # each piece from 0
                                   torch.full((rows,), n - 1, device=device)]).unsqueeze(0)
            keep = rows + 1  # the chunk's last token and every row
        else:
            s = n // pieces
            ids = torch.randint(fields["vocab_size"], (pieces, s), device=device, generator=gen)
            positions, keep = torch.arange(s, device=device).unsqueeze(0).expand(pieces, s), 1
        median, best, graphed = self.timer.time(forward_fn(torch, self.model, ids, positions, keep))
        t = chunk if mixed else (0 if decode else n)
        p = pieces if t else 1
        rows_read = 0 if kind == "prefill" else rows
        return {"decode_rows": rows_read, "kv_tokens_read": rows_read * n, "prefill_tokens": t,
                "prefill_context": p * (t // p) * (t // p + 1) // 2, "seconds": median, "min_seconds": best,
                "kind": kind, "context": 0 if kind == "prefill" else n, "reps": self.reps, "cuda_graph": graphed,
                "compiled": "layers" if self.compile else False}

    def close(self) -> None:
        """Free the KV buffers."""
        kv = self.kv
        kv.store = kv.k = kv.v = kv.pk = kv.pv = None


def measure(args, torch, model, fields: dict, device, samples_path: Path, deadline: float,
            mixed_path: Path | None = None, mixed_deadline: float = 0.0) -> dict:
    layers, kv_heads, head_dim = fields["num_hidden_layers"], fields["num_key_value_heads"], fields["head_dim"]
    dtype = next(model.parameters()).dtype
    kv_per_token = 2 * layers * kv_heads * head_dim * dtype.itemsize
    needed = max(max(args.rows) * max(args.contexts), max(args.prefills))
    if mixed_path is not None:
        needed = max(needed, max(args.mixed_rows) * max(args.mixed_contexts) + max(args.mixed_chunks))
    max_tokens = max(min(needed, int(args.kv_budget_gib * 2**30 // kv_per_token)), max(args.prefills))
    stepper = Stepper(torch, model, fields, device, max_tokens, warmup=args.warmup, reps=args.reps,
                      graphs=not args.eager, compile=bool(args.compile), seed=args.seed)
    step = stepper.step

    points = [("prefill", 1, t, 0) for t in args.prefills]  # few and short: first, so a time-out keeps both kinds
    points += [("decode", r, c, 0) for c in args.contexts for r in args.rows if r * c <= max_tokens]
    skipped = [(r, c) for c in args.contexts for r in args.rows if r * c > max_tokens]
    done, graphs, stopped = 0, 0, None
    with samples_path.open("w", encoding="utf-8") as out, torch.inference_mode():
        for kind, rows, n, chunk in points:
            if time.monotonic() > deadline:
                stopped = f"time budget reached after {done} of {len(points)} steps"
                break
            row = step(kind, rows, n, chunk)
            out.write(json.dumps(row) + "\n")
            out.flush()
            done += 1
            graphs += row["cuda_graph"]
            print(f"{kind:>7} rows {rows:>4} tokens {n:>5}: {row['seconds'] * 1e3:9.3f} ms"
                  f"{' (graph)' if row['cuda_graph'] else ''}", flush=True)
    mixed_info = None
    if mixed_path is not None:
        grid = [(c, r, n) for c in args.mixed_chunks for n in args.mixed_contexts for r in args.mixed_rows
                if r * n + c <= max_tokens]
        mixed_done, mixed_stopped = 0, None
        with mixed_path.open("w", encoding="utf-8") as out, torch.inference_mode():
            for chunk, rows, n in grid:
                if time.monotonic() > mixed_deadline:
                    mixed_stopped = f"time budget reached after {mixed_done} of {len(grid)} mixed steps"
                    break
                row = step("mixed", rows, n, chunk)
                out.write(json.dumps(row) + "\n")
                out.flush()
                mixed_done += 1
                print(f"  mixed chunk {chunk:>5} + rows {rows:>4} x {n:>5}: {row['seconds'] * 1e3:9.3f} ms"
                      f"{' (graph)' if row['cuda_graph'] else ''}", flush=True)
        mixed_info = {"steps_measured": mixed_done, "steps_planned": len(grid), "stopped": mixed_stopped,
                      "samples_file": str(mixed_path)}
    stepper.close()
    return {"steps_measured": done, "steps_planned": len(points), "cuda_graph_steps": graphs,
            "skipped_over_kv_budget": skipped, "stopped": stopped, "kv_budget_tokens": max_tokens,
            "mixed": mixed_info}


FORMS = ("separate", "overlapped")


def add_fits(results: dict, prior: StepCost, memory: ModelMemory, cfg: dict, samples_path: Path,
             mixed_path: Path | None, seed: int, form: str) -> None:
    """Fit both forms of the step price (attention separate from the linear layers, or overlapped with
    them: lengthsched.cost) on a seeded half of the pure steps; score each on the other half and on the
    mixed steps. ``results["fit"]`` / ``["fitted"]`` hold the ``form`` one, ``results["fits"]`` both."""
    samples = read_samples(samples_path)
    mixed = read_samples(mixed_path) if mixed_path is not None and mixed_path.is_file() else None
    preset = prior.gpu
    results["fits"] = {}
    for name in FORMS:
        start = prior.replace(separate_attention=name == "separate")
        fitted, report = start.fit_and_validate(samples, train_fraction=0.5, seed=seed)
        entry = {"report": report, "fitted": json.loads(fitted.to_json())}
        if mixed is not None:  # priced by the model fitted on the pure steps, and by the unfitted preset
            signed = fitted.errors(mixed)
            entry["mixed"] = {**error_stats(signed), "signed_median": float(np.median(signed)),
                              "prior": error_stats(start.errors(mixed))}
        results["fits"][name] = entry
        h, p = report["held_out"], report["prior_held_out"]
        line = (f"{name}: fitted {report['parameters']}; held-out |rel err| median {h['median']:.3f} "
                f"max {h['max']:.3f}; unfitted {preset} preset median {p['median']:.3f} max {p['max']:.3f}")
        if mixed is not None:
            m = entry["mixed"]
            line += (f"; mixed steps ({m['n']}) median {m['median']:.3f} max {m['max']:.3f} "
                     f"(signed {m['signed_median']:+.3f})")
        print(line, flush=True)
    results["form"] = form
    results["fit"] = results["fits"][form]["report"]
    results["fitted"] = results["fits"][form]["fitted"]
    results["unfitted_all_steps"] = {  # the unfitted presets on every measured step
        other: error_stats(StepCost.from_gpu(memory, other, config=cfg).errors(samples))
        for other in sorted({preset, "h100", "h200"})}


def model_config(ap, model: str, quick: bool) -> tuple[dict, dict, str]:
    """(the preset's config.json, the fields a model is built from, the model's name) of --model."""
    preset_path = PRESET_DIR / f"{model}.json"
    if not preset_path.is_file():
        ap.error(f"--model {model!r}: no such preset; expected one of "
                 f"{sorted(p.stem for p in PRESET_DIR.glob('*.json'))}")
    preset_cfg = json.loads(preset_path.read_text(encoding="utf-8"))
    cfg = {k: v for k, v in preset_cfg.items() if not k.startswith("_") and k not in ("architectures", "torch_dtype")}
    if quick:
        cfg.update(TINY)
    return preset_cfg, cfg, "tiny-qwen3-cost" if quick else preset_cfg["_name_or_path"]


def refit(ap, args, argv) -> int:
    """--refit REPORT: the fits of a recorded run redone with this lengthsched (no GPU, no torch)."""
    path = Path(args.refit)
    try:
        results = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        ap.error(f"--refit {args.refit!r}: expected a report JSON written by gpu_cost.py ({exc})")
    quick = str(results.get("model", "")).startswith("tiny")
    _, cfg, name = model_config(ap, args.model, quick)
    if not quick and not str(results.get("model", "")).startswith(name):
        ap.error(f"--model {args.model!r}: the report {path} measured {results.get('model')!r}; "
                 "pass the preset of that model")
    samples_path = path.with_suffix(".jsonl")
    mixed_path = samples_path.with_name(samples_path.stem + "_mixed.jsonl")
    if not samples_path.is_file():
        ap.error(f"--refit {args.refit!r}: expected the measured steps beside it, {samples_path}")
    memory = ModelMemory.from_hf_config({**cfg, "_name_or_path": name}, results["dtype"])
    prior = StepCost.from_gpu(memory, results["preset"], config=cfg)
    add_fits(results, prior, memory, cfg, samples_path, mixed_path, args.seed, args.form)  # it skips a missing file
    results["refit"] = {"command": " ".join([Path(sys.argv[0]).name] + (argv if argv is not None else sys.argv[1:])),
                        "machine": machine()}
    write_json(path, results)
    print(f"rewrote the fits of {path}")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default=None, help="bfloat16 (default on cuda) or float32 (default on cpu)")
    ap.add_argument("--model", default="qwen3-1.7b",
                    help="a preset of lengthsched/presets (its shapes, random weights); default qwen3-1.7b")
    ap.add_argument("--quick", action="store_true", help="tiny model (hidden 64, 2 layers) and a tiny grid")
    ap.add_argument("--rows", type=ints, default=None, help="decode rows, comma-separated (default 1,2,4,...,256)")
    ap.add_argument("--contexts", type=ints, default=None, help="context tokens per row (default 128,...,4096)")
    ap.add_argument("--prefills", type=ints, default=None, help="prefill tokens (default 128,...,8192)")
    ap.add_argument("--kv-budget-gib", type=float, default=32.0,
                    help="largest KV buffer; bigger grid points are skipped")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--eager", action="store_true", help="no CUDA graphs")
    ap.add_argument("--compile", action="store_true",
                    help="torch.compile every decoder layer (one compile shared by all layers, dynamic shapes; "
                         "fused elementwise kernels, closer to an engine's than the eager forward's); the report "
                         "is named ..._compiled")
    ap.add_argument("--budget-seconds", type=float, default=420.0, help="stop measuring after this long, then fit")
    ap.add_argument("--mixed-chunks", type=ints, default=None,
                    help="also measure mixed steps: prefill chunks of these many tokens beside decode rows "
                         "(comma-separated; kept out of the fit, scored by it); off by default")
    ap.add_argument("--mixed-rows", type=ints, default=[1, 16, 64, 128], help="decode rows of the mixed steps")
    ap.add_argument("--mixed-contexts", type=ints, default=[512, 2048],
                    help="context tokens per row of the mixed steps")
    ap.add_argument("--mixed-seconds", type=float, default=60.0,
                    help="seconds for the mixed steps, after --budget-seconds")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--form", choices=FORMS, default="separate",
                    help="the step price's form written as the report's fit (both are fitted and reported): "
                         "attention separate from the linear layers (default; mixed steps side with it) or "
                         "overlapped with them (lengthsched.cost's default form)")
    ap.add_argument("--refit", default=None, metavar="REPORT",
                    help="measure nothing: refit a recorded report's steps (REPORT's .jsonl and _mixed.jsonl "
                         "beside it; --model must be the report's model) and rewrite REPORT's fits in place")
    ap.add_argument("--out-dir", default=str(ROOT / "benchmarks" / "results"),
                    help="folder of the report cost_gpu_<card>.json and the steps cost_gpu_<card>.jsonl")
    ap.add_argument("--out", default=None, help="report JSON path (instead of --out-dir/cost_gpu_<card>.json)")
    ap.add_argument("--samples", default=None, help="measured steps, JSON lines (default: --out with .jsonl)")
    args = ap.parse_args(argv)
    start = time.monotonic()
    if args.refit:
        return refit(ap, args, argv)

    import torch
    import transformers

    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: no CUDA device (use --device cpu --quick to check the code path)")
    card = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    preset = preset_for(card)
    matched = device.type == "cuda" and preset in card.lower()
    slug = preset if matched else re.sub(r"[^a-z0-9]+", "-", card.lower()).strip("-")
    if args.model != "qwen3-1.7b":
        slug += "_" + re.sub(r"[^a-z0-9.]+", "-", args.model.lower())
    if args.compile:
        slug += "_compiled"
    out = Path(args.out or Path(args.out_dir) / f"cost_gpu_{slug}.json")
    samples_path = Path(args.samples or out.with_suffix(".jsonl"))
    samples_path.parent.mkdir(parents=True, exist_ok=True)
    quick = args.quick
    args.rows = args.rows or ([1, 2, 4] if quick else [1, 2, 4, 8, 16, 32, 64, 128, 256])
    args.contexts = args.contexts or ([16, 32] if quick else [128, 256, 512, 1024, 2048, 4096])
    args.prefills = args.prefills or ([16, 32, 64] if quick else [128, 256, 512, 1024, 2048, 4096, 8192])
    dtype_name = args.dtype or ("bfloat16" if device.type == "cuda" else "float32")
    dtype = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}[dtype_name]

    preset_cfg, cfg, name = model_config(ap, args.model, quick)
    torch.manual_seed(args.seed)
    model = build_model(torch, cfg, dtype, device)
    shapes = "tiny" if quick else preset_cfg["_name_or_path"]
    print(f"{card}: {shapes}-shaped model, {dtype_name}, "
          f"{sum(p.numel() for p in model.parameters()) / 1e9:.3f} B parameters; preset {preset}", flush=True)

    deadline = start + args.budget_seconds
    mixed_path = samples_path.with_name(samples_path.stem + "_mixed.jsonl") if args.mixed_chunks else None
    if args.quick and args.mixed_chunks:
        args.mixed_rows, args.mixed_contexts = [1, 4], [16]
    info = measure(args, torch, model, cfg, device, samples_path, deadline, mixed_path,
                   deadline + args.mixed_seconds)
    del model
    measured = info["steps_measured"]  # the lines written to samples_path (add_fits reads and checks them)

    memory = ModelMemory.from_hf_config({**cfg, "_name_or_path": name}, dtype_name)
    prior = StepCost.from_gpu(memory, preset, config=cfg)
    results = {"machine": machine(), "card": card, "device": str(device), "preset": preset,
               "preset_matches_card": preset in card.lower(), "dtype": dtype_name,
               "torch": torch.__version__, "cuda": torch.version.cuda, "transformers": transformers.__version__,
               "model": "tiny-qwen3 (--quick)" if quick else f"{preset_cfg['_name_or_path']} shapes, random weights",
               "compiled": bool(args.compile), "compile_scope": "each decoder layer" if args.compile else None,
               "command": " ".join([Path(sys.argv[0]).name] + (argv if argv is not None else sys.argv[1:])),
               "grid": {"rows": args.rows, "contexts": args.contexts, "prefills": args.prefills},
               "samples_file": str(samples_path), **info,
               "note": "CPU run: checks the code path, not GPU evidence" if device.type != "cuda" else None}
    if measured >= 6:
        add_fits(results, prior, memory, cfg, samples_path, mixed_path if info["mixed"] else None, args.seed,
                 args.form)
    else:
        results["fit"] = None
        print(f"only {measured} steps measured: no fit", file=sys.stderr)
    results["seconds_total"] = round(time.monotonic() - start, 1)
    write_json(out, results)
    print(f"wrote {out} and {samples_path} ({results['seconds_total']} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
