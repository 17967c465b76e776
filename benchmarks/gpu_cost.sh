#!/usr/bin/env bash
# Step-cost calibration on one GPU (benchmarks/gpu_cost.py): time decode and prefill steps of
# Qwen3-1.7B- and Qwen3-8B-shaped models with random weights (bfloat16, no download; MODELS picks
# the presets), fit lengthsched.cost's overhead and efficiencies on half of the steps of each, report
# the held-out error and the unfitted preset's error. Sized for about 5 minutes; the whole script
# stops within TOTAL seconds (default 570, under 10 minutes).
#
#     bash benchmarks/gpu_cost.sh OUTDIR        # from the repository root, on the GPU machine
#
# The project need not be installed: it runs with PYTHONPATH=. and needs python3 with numpy, torch
# and transformers. The measured steps go to OUTDIR/cost_gpu_<card>[_<model>].jsonl as they are
# measured (a run cut off keeps them), the report to OUTDIR/cost_gpu_<card>[_<model>].json (no
# suffix for qwen3-1.7b), the output to OUTDIR/*.log. Each model's gpu_cost.py stops measuring after
# T_MEASURE / (number of models) seconds and then fits, well inside its timeout.
#
# COMPILE=1 measures with every decoder layer compiled (gpu_cost.py --compile: fused kernels, closer to
# an engine's; reports named ..._compiled); ARGS adds arguments to gpu_cost.py (a smaller grid, say).
#
# CPU check of the script itself (tiny model and grid, seconds):
#     DEVICE=cpu QUICK=1 PYTHON=.venv/bin/python bash benchmarks/gpu_cost.sh /tmp/gpu-cost-check
set -u -o pipefail

OUT=${1:?usage: bash benchmarks/gpu_cost.sh OUTDIR}
PY=${PYTHON:-python3}
DEVICE=${DEVICE:-cuda}
TOTAL=${TOTAL:-570}            # seconds for the whole script
T_MEASURE=${T_MEASURE:-360}    # seconds of measuring inside gpu_cost.py, all models (model build and fit come on top)
MODELS=${MODELS:-qwen3-1.7b qwen3-8b}
read -r -a EXTRA <<< "${ARGS:-}"
if [ -n "${COMPILE:-}" ]; then EXTRA+=(--compile); fi
. "$(dirname "$0")/gpu_common.sh"

{
    echo "== $(date -u +%FT%TZ) $(hostname); device $DEVICE; budget ${TOTAL}s"
    timeout 10 nvidia-smi || echo "(nvidia-smi unavailable)"
    timeout 60 "$PY" -c "
import platform, numpy, torch, transformers
print('python', platform.python_version(), '| numpy', numpy.__version__, '| torch', torch.__version__,
      '| cuda', torch.version.cuda, '| transformers', transformers.__version__)
if torch.cuda.is_available():
    print('card:', torch.cuda.get_device_name(0), '| memory GiB', round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1))
"
} 2>&1 | tee "$OUT/env.log"

read -r -a MODEL_LIST <<< "$MODELS"
N=${#MODEL_LIST[@]}
I=0
for MODEL in "${MODEL_LIST[@]}"; do
    # each model gets an equal share of what is left, so the first cannot starve the second
    LEFT=$(( ($(left) - 5) / (N - I) ))
    I=$((I + 1))
    if [ "$LEFT" -lt 20 ]; then echo "== gpu_cost $MODEL: skipped, no time left" | tee -a "$OUT/gpu_cost.log"; continue; fi
    echo "== gpu_cost $MODEL (timeout ${LEFT}s)" | tee -a "$OUT/gpu_cost.log"
    timeout -k 5 "$LEFT" "$PY" -u benchmarks/gpu_cost.py --device "$DEVICE" --model "$MODEL" \
        --budget-seconds $((T_MEASURE / N)) --out-dir "$OUT" ${QUICK_ARG[@]+"${QUICK_ARG[@]}"} ${EXTRA[@]+"${EXTRA[@]}"} 2>&1 | tee -a "$OUT/gpu_cost.log"
    RC=${PIPESTATUS[0]}
    NOTE=""
    if [ "$RC" -eq 124 ] || [ "$RC" -eq 137 ]; then NOTE=" (TIMED OUT: the .jsonl keeps the measured steps)"; fi
    echo "== gpu_cost $MODEL: exit $RC after $((SECONDS - START)) s$NOTE" | tee -a "$OUT/gpu_cost.log"
done
echo "== done in $((SECONDS - START)) s; results in $OUT:" | tee -a "$OUT/env.log"
ls -l "$OUT" | tee -a "$OUT/env.log"
