"""The frozen options of ``lengthsched simulate`` (the CLI flags are derived from them)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from lengthsched.memory import DTYPE_BYTES
from lengthsched.refill import RefillRule
from lengthsched.runtime.registry import POLICIES

__all__ = ["SimulateOptions", "OPTION_DEFAULTS", "DEFAULT_POLICIES", "ROLLOUT_POLICIES", "resolve", "rollout_mode"]

# The comparison table's default rows: every policy of docs/model.md section 4 once.
DEFAULT_POLICIES = ("full", "full_freed", "micro", "fixed_slot", "dynamic_slot", "length_aware", "growth_aware",
                    "growth_aware_lpt", "growth_aware_fcfs", "vllm", "sglang", "reserve_max")


# The rollout table's default rows (--prompts / --replicas): the engines' schedulers, Seer, the project's.
ROLLOUT_POLICIES = ("vllm", "vllm_priority", "sglang", "sglang_priority", "seer", "seer_divided", "placed_adaptive",
                    "steal", "steal_longest", "steal_observed", "steal_sglang")

# The rollout table's default rows with --kv-compression: those of ROLLOUT_POLICIES that run a compressed cache.
COMPRESSED_ROLLOUT_POLICIES = tuple(p for p in ROLLOUT_POLICIES if POLICIES[p].compressed)

# Defaults that depend on the mode: one group at a time, or one RL rollout step.
GROUP_DEFAULTS = {"model": "qwen3-1.7b", "budget": "5GiB", "policies": ",".join(DEFAULT_POLICIES),
                  "predictor": "oracle"}
# verl's example rollout config: gpu_memory_utilization 0.5 of an 80 GiB H100 per replica.
ROLLOUT_DEFAULTS = {"model": "qwen3-8b", "budget": "40GiB", "policies": ",".join(ROLLOUT_POLICIES),
                    "predictor": "prompt:0.5", "prompts": 64, "replicas": 4, "group_size": 16,
                    "routers": "least_loaded,group_round_robin,cache_aware,contiguous_chunks,slime_plan"}


def _opt(default: Any, help: str, **extra: Any) -> Any:
    return field(default=default, metadata={"help": help, **extra})


@dataclass(frozen=True)
class SimulateOptions:
    """Simulate sampling policies on a workload and compare steps, memory, preemptions and bias."""

    model: str | None = _opt(None, "a config.json path, a model directory, or a bundled preset name (default "
                                   "qwen3-1.7b; qwen3-8b for a rollout step)")
    dtype: str = _opt("bfloat16", "weights and activations dtype", choices=sorted(DTYPE_BYTES))
    kv_dtype: str | None = _opt(None, "KV cache dtype, default --dtype", choices=sorted(DTYPE_BYTES))
    budget: str | None = _opt(None, "memory for one group: weights + activations of G sequences + KV (default "
                                    "5GiB); for a rollout step, each replica's (default 40GiB: 0.5 of an 80 GiB "
                                    "GPU, verl's gpu_memory_utilization)")
    group_size: int | None = _opt(None, "G, completions per prompt (default: 32 for castillo, lmsys and azure, 16 "
                                        "in a rollout step; a "
                                        "trace file keeps its groups' logged sizes: --group-size with one is only "
                                        "checked against them)")
    max_new_tokens: int = _opt(4096, "L_max in tokens; longer lengths in the workload are clipped to it, and so "
                                     "are longer predictions (a notice on stderr says how many)")
    workload: str = _opt("castillo", "castillo (real groups), lmsys or azure (single-length traces with the "
                                     "log-normal group model), or a trace .jsonl path")
    groups: int = _opt(200, "how many groups (prompts) to simulate")
    spread: float | None = _opt(None, "sigma of log length within a group for lmsys/azure "
                                      "(default: fitted to CASTILLO)")
    prompt_tokens: str | None = _opt(None, "prompt lengths for lmsys/azure instead of the trace's: castillo (each "
                                           "group one of the bundled CASTILLO prompts' lengths) or TOKENS (every "
                                           "prompt); the lmsys trace has none, so its prompts otherwise take 0 "
                                           "tokens: no prefill, no KV")
    predictor: str | None = _opt(None, "predicted lengths (default oracle; prompt:0.5 in a rollout step): oracle, "
                                       "noisy:SIGMA (log-normal error, 0 < SIGMA <= 5), prompt:SIGMA (one "
                                       "prediction per prompt, log-normal error on its median), constant:TOKENS, "
                                    "trace (the trace's 'predicted'), or online / online:TOKENS (learns from "
                                    "each group's finished siblings, from a constant prior); in a rollout step "
                                    "also history / history:SIGMA (what the online predictor knows after one "
                                    "earlier epoch of the same prompts, prompt:SIGMA its prior, default 0.5: "
                                    "adds steal_classes and recommends by the siblings' agreement)")
    quantile: float = _opt(0.9, "predicted quantile that length_aware reserves")
    policies: str | None = _opt(None, "comma-separated policies to compare, each once "
                                      "(lengthsched.runtime.POLICIES; default: " + ",".join(DEFAULT_POLICIES)
                                + "; in a rollout step " + ",".join(ROLLOUT_POLICIES) + ")")
    prompts: int | None = _opt(None, "simulate one RL rollout step of this many prompts x G on --replicas engine "
                                     "replicas instead of groups one at a time (default 64 when --replicas is given)")
    replicas: int | None = _opt(None, "engine replicas of the rollout step (default 4 when --prompts is given)")
    routers: str | None = _opt(None, "routers tried for the policies that do not place requests themselves, "
                                     "comma-separated: least_loaded (verl), group_round_robin (OpenRLHF), cache_aware "
                                     "(SGLang's router as slime runs it), contiguous_chunks (TRL 1.9's vllm-serve), "
                                     "slime_plan (slime with lengthsched.integrations.slime: the project's plan sent "
                                     "through its client queues; sglang only; with --oversample above 1 the "
                                     "integration's default leaves such steps to slime: the cache_aware row) "
                                     "(default all five)")
    headroom: bool = _opt(False, "in a rollout step, also search the placement that would be fastest with every "
                                 "true length known (an oracle: what placement could buy at most over vLLM FCFS "
                                 "replicas; simulate.search_placement) and report it apart from the policies")
    resubmit_seconds: float = _opt(0.0, "in a rollout step, the seconds a request that steal moves between replicas "
                                        "waits before its new replica can run it (a framework's abort and "
                                        "resubmission; verl 0.9.1's client waits 1 s)")
    poll_seconds: float | None = _opt(None, "in a rollout step, the seconds between the snapshots steal_observed "
                                            "decides from (a framework's poll interval; verl_stealing polls every "
                                            "0.25 s; default: a snapshot at each decision)")
    kv_offload: bool = _opt(False, "in a rollout step, every replica keeps a preempted request's KV in host memory "
                                   "and loads it back instead of recomputing it (vLLM's --kv-offloading-backend "
                                   "native; each load timed over the host link and overlapping the decoding, as "
                                   "vLLM loads asynchronously; with --turns also the conversations the prefix cache "
                                   "evicts, loaded back by a later turn instead of prefilled)")
    turns: str | None = _opt(None, "in a rollout step, simulate agent loops instead: each completion cut at random "
                                   "into N turns, or LO-HI drawn per completion (e.g. 2-5), a tool call between two "
                                   "turns (--tool-seconds, --tool-tokens), each later turn a new request of the whole "
                                   "conversation sent to its session's replica (verl's sticky routing) and prefilled "
                                   "from that replica's prefix cache while it holds the conversation; rows: vLLM FCFS, "
                                   "vllm_priority with the plan's priorities on first turns only and on every turn, "
                                   "steal following later turns or not, vLLM behind a cache-aware router "
                                   "(simulate.run_multiturn); --budget must hold "
                                   "the longest conversation")
    tool_seconds: float = _opt(0.5, "with --turns, the median seconds of a tool call (log-normal, log-sd "
                                    "--tool-sigma)")
    tool_sigma: float = _opt(0.5, "with --turns, the log-sd of a tool call's seconds (0: every call --tool-seconds)")
    tool_tokens: str = _opt("30-600", "with --turns, the tokens a tool's answer adds to the conversation: LO-HI, "
                                      "drawn log-uniformly, or N")
    framework: str = _opt("verl", "with --turns, whose rollout to compare against: verl (vLLM's engines, verl's "
                                  "sticky session routing, the rows above) or slime (SGLang's engines: slime as it "
                                  "ships, SGLang's router on every turn; sticky sessions; lengthsched.integrations."
                                  "slime's plan with and without its client window; steal_sglang; vLLM's engines "
                                  "beside)", choices=["verl", "slime"])
    draws: int = _opt(0, "in a rollout step, also run every policy on this many more draws of the predictor's "
                         "errors (prompt:SIGMA's, or history's prior; seeds --seed + 1 .. --seed + DRAWS, the "
                         "prompts and completions unchanged) and report each policy's median, best and worst "
                         "ratio to vLLM FCFS + verl and how often it was slower: one step is one draw of a "
                         "lottery over placements; the draws run on --workers processes")
    oversample: float | None = _opt(None, "in a rollout step, submit --prompts x OVERSAMPLE groups and end the step "
                                          "when --prompts of them have finished, the rest aborted (slime's "
                                          "over-sampling, DAPO's dynamic sampling with every group valid): also "
                                          "report each run's seconds to that group and how long the kept groups' "
                                          "completions are against all submitted (e.g. 1.25)")
    steps: int | None = _opt(None, "with --oversample, run this many over-sampled rollout steps one after another, "
                                   "each keeping the first --prompts groups to finish of the groups it submits "
                                   "(the others dropped, or carried with --partial-rollout), and compare kept tokens "
                                   "per modelled second, the share an earlier step generated and the kept groups' "
                                   "length bias (the workload draws a stream of fresh groups for the steps)")
    partial_rollout: bool = _opt(False, "with --steps, carry each step's aborted groups into the next with the "
                                        "tokens they generated (slime's --partial-rollout): the next step submits "
                                        "them first, keeps their finished samples and resumes the others")
    max_carry: int | None = _opt(None, "with --partial-rollout, a staleness limit: the most steps a group may wait "
                                       "between its first submission and the step that keeps it (1: a kept token "
                                       "is at most one policy update old; default: no limit)")
    carry_limit: str | None = _opt(None, "with --max-carry, what a step does with a group that old: drop (the default: "
                                    "it is thrown away with its tokens instead of being carried once more) or wait "
                                    "(the step does not end before it finishes, and keeps it; slower in the "
                                    "benchmarks, and no fresher on average)", choices=["drop", "wait"])
    valid_share: float | None = _opt(None, "with --steps, a dynamic-sampling filter that keeps this share of the "
                                           "finished groups (DAPO drops groups whose rewards all agree; slime's "
                                           "--dynamic-sampling-filter-path), each group passing at random "
                                           "whatever its length: a dropped group's tokens are thrown away and a "
                                           "step ends at its --prompts-th group that passed")
    slime_refill: bool = _opt(False, "with --steps and --in-flight, slime's dynamic sampling inside a step: the rows "
                                     "sent through the in-flight cap (slime's, sglang behind cache_aware or "
                                     "least_loaded, and slime_plan) submit another --prompts x --oversample groups "
                                     "whenever the filter has dropped so many that too few could still pass, "
                                     "instead of keeping fewer (slime's generate_rollout_async); the other rows as "
                                     "without it")
    difficulty: bool = _opt(False, "with --steps, DAPO's filter (a group whose rewards all agree is dropped) drawn "
                                   "from a model of prompt difficulty tied to length instead of at random: each "
                                   "prompt's chance of a right answer from a Beta law, the long prompts the hard "
                                   "ones (simulate.difficulty, fitted to GSM8K's labelled solutions); not with "
                                   "--valid-share")
    filter_order: bool = _opt(False, "with --difficulty, every over-sampled row hands each batch to the engines "
                                     "likely-kept first, by what the filter did with the same prompts one epoch "
                                     "earlier (lengthsched.integrations.slime's lengthsched_filter_order); the "
                                     "reference is not over-sampled and keeps its order. With --partial-rollout "
                                     "run --steps 20 or more: the order defers the groups it puts last to later "
                                     "steps, which a short run does not charge for")
    selective: bool = _opt(False, "with --difficulty, every over-sampled row skips prompts as GRESO's pre-rollout "
                                  "filter does (lengthsched.SelectiveRollout: a prompt whose group the filter "
                                  "dropped one epoch earlier, all right or all wrong, is skipped with probability "
                                  "one half; lengthsched.integrations.slime's lengthsched_selective_rollout): "
                                  "skipped prompts are not generated; the reference runs every prompt")
    verl_dynamic_sampling: bool = _opt(False, "with --steps and a filter (--valid-share or --difficulty), verl's own "
                                              "dynamic sampling instead of over-sampling (its v1 sync trainer's "
                                              "algorithm.filter_groups: two prompts refilled per dropped group, every "
                                              "group in flight drained, the surplus thrown away, decisions at its 2 s "
                                              "poll; vllm + least_loaded): verl as it ships against the same with "
                                              "lengthsched.integrations.verl_selective's refill by need (the same "
                                              "data), verl_v1's stealing manager alone and with that refill "
                                              "(steal_observed; --poll-seconds and --resubmit-seconds default to its "
                                              "driver's 0.25 and 0.05 s there), and with --selective the skip too; "
                                              "--oversample 1 or none, not with --partial-rollout, --slime-refill, "
                                              "--filter-order or --in-flight")
    max_staleness: str | None = _opt(None, "with --steps N, simulate asynchronous RL as AReaL runs it instead: the "
                                           "engines keep generating while the learner trains, submitting groups "
                                           "while at most (K + version + 1) x --prompts were submitted (AReaL's "
                                           "max_head_offpolicyness K); a comma-separated list of K to compare, e.g. "
                                           "0,1,2 (0: synchronous RL); each update aborts and resumes the requests "
                                           "in flight; reports trained tokens per second and how many of them older "
                                           "weights generated")
    staleness_threshold: str | None = _opt(None, "with --max-staleness, also run verl's fully asynchronous recipe at "
                                                 "each of these staleness_threshold values, comma-separated (a "
                                                 "share of --prompts: the rollouter starts at most (1 + S) x "
                                                 "--prompts groups per weight version, counting those carried "
                                                 "over; 0: every version's groups from its own weights, its local "
                                                 "updates streamed; default 0,0.1, verl's default 0.1)")
    local_steps: int | None = _opt(None, "with --max-staleness, verl's local updates per weight version "
                                         "(trigger_parameter_sync_step; each trains --prompts / N groups as they "
                                         "arrive; default 4, verl's, or 1 where --prompts is not a multiple of 4)")
    train_seconds: float | None = _opt(None, "with --max-staleness, the learner's seconds per step (default: half "
                                             "the mean synchronous rollout of a step, AReaL's with K = 0)")
    update_seconds: float = _opt(1.0, "with --max-staleness, the seconds every engine pauses while the new weights "
                                      "are sent (AReaL's update_weights)")
    max_concurrent: int | None = _opt(None, "with --max-staleness, groups in flight at most (AReaL's "
                                            "max_concurrent_rollouts; default: --prompts, AReaL's default; "
                                            "verl's rows: 16 per replica, verl's default)")
    in_flight: int | None = _opt(None, "in a rollout step, requests the RL framework keeps in flight per replica "
                                       "at most (slime's --sglang-server-concurrency: 512): the rest are sent one "
                                       "as another finishes, in submission order, and routed then; for vllm and "
                                       "sglang behind the least_loaded and cache_aware routers (default: every "
                                       "request sent at once, as verl, OpenRLHF and TRL send them)")
    slots: int | None = _opt(None, "also cap how many sequences decode at once (in a rollout step: on each replica, "
                                   "vLLM's max_num_seqs; verl sets 1024; default: the KV pool alone limits them)")
    gpu: str | None = _opt(None, "GPU preset that prices every step in seconds (lengthsched cost show; default "
                                 "h100); with --cost, the card to move the fitted model to (its datasheet numbers, "
                                 "the fitted efficiencies kept)", choices=["a100", "h100", "h200", "l40s", "b200"])
    cost: str | None = _opt(None, "a fitted step-cost JSON (lengthsched cost fit) instead of the --gpu preset")
    prefill_chunk: int = _opt(8192, "most tokens prefilled in one step (vLLM's max_num_batched_tokens)")
    kv_compression: str | None = _opt(None, "a compressed KV cache (Sparse-RL's sparse rollouts), BUDGET:INTERVAL "
                                            "in tokens (e.g. 512:32): every sequence holds at most BUDGET + "
                                            "INTERVAL generated tokens, the policies admit by that and the rows read "
                                            "that much (the compression's own work is not priced); in a rollout "
                                            "step the default rows are those that run one: "
                                            + ",".join(COMPRESSED_ROLLOUT_POLICIES) + "; also with --steps (a resumed "
                                            "sample holds its partial response in the cache), --max-staleness and "
                                            "--turns (each turn's own tokens compressed, its conversation "
                                            "prefilled again) and --headroom (the oracle placement searched with "
                                            "the cache)")
    refill: str = _opt("sjf", "refill rule of length_aware", choices=[r.value for r in RefillRule])
    seed: int = _opt(0, "seed of the workload sampling, the noisy predictor and the dynamic-slot stream (>= 0)")
    workers: int = _opt(0, "processes to use (0: all cores)")
    sweep: str | None = _opt(None, "sweep one setting instead: group_size=8,16,32 | budget=4GiB,6GiB | "
                                   "spread=0.05,0.2 | sigma=0,0.25,0.5 (noisy predictor error) | "
                                   "max_new_tokens=1024,4096")
    json: bool = _opt(False, "print JSON instead of a table")
    plot: str | None = _opt(None, "write PNG figures into this directory")
    output: str | None = _opt(None, "also write the JSON results to this file (atomically)")


#: Every option's default (None where the mode decides: :func:`resolve`), by field name.
OPTION_DEFAULTS: dict[str, Any] = {f.name: f.default for f in dataclasses.fields(SimulateOptions)}


def rollout_mode(opts: SimulateOptions) -> bool:
    """Whether ``opts`` describe one rollout step (``--prompts`` or ``--replicas`` given)."""
    return opts.prompts is not None or opts.replicas is not None


def resolve(opts: SimulateOptions) -> SimulateOptions:
    """``opts`` with every mode-dependent default (None) filled in for its mode. A trace file keeps its
    groups' logged sizes, so a rollout step on one takes no default group size."""
    from .workloads import WORKLOADS

    defaults = ROLLOUT_DEFAULTS if rollout_mode(opts) else GROUP_DEFAULTS
    if opts.kv_compression is not None and rollout_mode(opts):  # the rows that run a compressed cache
        defaults = {**defaults, "policies": ",".join(COMPRESSED_ROLLOUT_POLICIES)}
    trace = opts.workload is not None and opts.workload not in WORKLOADS
    return dataclasses.replace(opts, **{k: v for k, v in defaults.items()
                                        if getattr(opts, k) is None and not (trace and k == "group_size")})
