#!/usr/bin/env bash
# Simulated rollout steps replayed on one GPU (benchmarks/gpu_replay.py): for each setting, the steps
# that vLLM + verl routing, vLLM priority, the Seer-like anchor and steal run (simulator, H100 preset of
# Qwen3-1.7B), a sample drawn in proportion to their modelled seconds, each run with a Qwen3-1.7B-shaped
# model (random weights, bfloat16, a CUDA graph per shape), and each policy's measured makespan
# estimated beside its modelled one. Sized for about 8 minutes; the whole script stops within TOTAL
# seconds (default 540).
#
#     bash benchmarks/gpu_replay.sh OUTDIR        # from the repository root, on the GPU machine
#
# Needs python3 with numpy, torch and transformers (the project runs from source, PYTHONPATH=.).
# Reports go to OUTDIR/replay_<card>_<setting>.json (rewritten every 20 draws per policy, so a run cut
# off keeps what it measured), the output to OUTDIR/*.log. SETTINGS lists WORKLOAD:PROMPTS:REPLICAS:POOL
# (POOL in L_max) separated by spaces; each setting gets an equal share of the time. MODEL picks the
# preset (default qwen3-1.7b; qwen3-8b prices and runs the 8B shapes; the report is named ..._<model>).
# POLICIES (POLICY[:ROUTER[@K]], comma-separated, the first the baseline) replaces gpu_replay.py's default
# four; REPORT_SUFFIX is appended to the reports' names (gpu_replay_slime.sh sets _slime).
# LONG_TAIL_PROMPTS (castillo or a number of tokens) gives the long tail's groups prompts (its trace has
# none); the reports are then named ..._prompts<value>. TURNS (N or LO-HI) replays multi-turn steps instead
# (gpu_replay.py --turns; POOL then in 8192-token units; gpu_replay_multiturn.sh sets it); TOOL_SECONDS their
# tools' median seconds (default 0.5).
#
# CPU check of the script itself (tiny model, a minute):
#     DEVICE=cpu QUICK=1 PYTHON=.venv/bin/python bash benchmarks/gpu_replay.sh /tmp/gpu-replay-check
set -u -o pipefail

OUT=${1:?usage: bash benchmarks/gpu_replay.sh OUTDIR}
PY=${PYTHON:-python3}
DEVICE=${DEVICE:-cuda}
TOTAL=${TOTAL:-540}
SETTINGS=${SETTINGS:-castillo:64:4:2 long_tail:64:4:2}
MODEL=${MODEL:-qwen3-1.7b}     # a preset of lengthsched/presets; FITTED: its fitted StepCost JSON
FITTED=${FITTED:-benchmarks/results/stepcost_h100_${MODEL}.json}
POLICY_ARG=()
if [ -n "${POLICIES:-}" ]; then POLICY_ARG=(--policies "$POLICIES"); fi
. "$(dirname "$0")/gpu_common.sh"

{
    echo "== $(date -u +%FT%TZ) $(hostname); device $DEVICE; budget ${TOTAL}s"
    timeout 10 nvidia-smi || echo "(nvidia-smi unavailable)"
} 2>&1 | tee "$OUT/env.log"
CARD=$(timeout 60 "$PY" -c "import torch; n = torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'cpu'; print('h100' if 'H100' in n else 'h200' if 'H200' in n else 'cpu' if n == 'cpu' else 'gpu')")
read -r -a LIST <<< "$SETTINGS"
n=${#LIST[@]}
for i in "${!LIST[@]}"; do
    IFS=: read -r work prompts replicas pool <<< "${LIST[$i]}"
    share=$(( ($(left) - 10) / (n - i) ))   # seconds for this setting: an equal share of what is left
    name="replay_${CARD}_${work}_${prompts}x16_r${replicas}_pool${pool}"
    if [ -n "${QUICK:-}" ]; then name="replay_${CARD}_${work}_16x16_r2_pool${pool}_quick"; fi  # what --quick runs
    if [ "$MODEL" != qwen3-1.7b ]; then name+="_$MODEL"; fi
    name+="${REPORT_SUFFIX:-}"   # e.g. _slime (gpu_replay_slime.sh)
    PROMPT_ARG=()
    if [ -n "${TURNS:-}" ]; then PROMPT_ARG=(--turns "$TURNS" --tool-seconds "${TOOL_SECONDS:-0.5}"); fi
    if [ -n "${LONG_TAIL_PROMPTS:-}" ] && [ "$work" = long_tail ]; then
        PROMPT_ARG+=(--long-tail-prompts "$LONG_TAIL_PROMPTS"); name+="_prompts$LONG_TAIL_PROMPTS"
    fi
    if [ "$share" -lt 60 ]; then echo "== $name: skipped, no time left" | tee -a "$OUT/env.log"; continue; fi
    echo "== $name (timeout ${share}s)" | tee "$OUT/$name.log"
    timeout -k 5 "$share" "$PY" -u benchmarks/gpu_replay.py --device "$DEVICE" --workload "${work//_/ }" \
        --prompts "$prompts" --replicas "$replicas" --factor "$pool" --model "$MODEL" --fitted "$FITTED" --budget-seconds $((share - 45)) \
        --out "$OUT/$name.json" ${POLICY_ARG[@]+"${POLICY_ARG[@]}"} ${PROMPT_ARG[@]+"${PROMPT_ARG[@]}"} ${QUICK_ARG[@]+"${QUICK_ARG[@]}"} 2>&1 | tee -a "$OUT/$name.log"
    echo "== $name: exit ${PIPESTATUS[0]} after $((SECONDS - START)) s" | tee -a "$OUT/$name.log"
done
echo "== done in $((SECONDS - START)) s" | tee -a "$OUT/env.log"
ls -l "$OUT" | tee -a "$OUT/env.log"
