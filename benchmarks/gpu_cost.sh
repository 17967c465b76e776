#!/usr/bin/env bash
# Step-cost calibration on one GPU (benchmarks/gpu_cost.py): time decode and prefill steps of a
# Qwen3-1.7B-shaped model with random weights (bfloat16, no download), fit lengthsched.cost's
# overhead and efficiencies on half of the steps, report the held-out error and the unfitted
# preset's error. Sized for about 5 minutes; the whole script stops within TOTAL seconds
# (default 570, under 10 minutes).
#
#     bash benchmarks/gpu_cost.sh OUTDIR        # from the repository root, on the GPU machine
#
# The project need not be installed: it runs with PYTHONPATH=. and needs python3 with numpy, torch
# and transformers. The measured steps go to OUTDIR/cost_gpu_<card>.jsonl as they are measured (a
# run cut off keeps them), the report to OUTDIR/cost_gpu_<card>.json, the output to OUTDIR/*.log.
# gpu_cost.py stops measuring after T_MEASURE seconds and then fits, well inside its timeout.
#
# CPU check of the script itself (tiny model and grid, seconds):
#     DEVICE=cpu QUICK=1 PYTHON=.venv/bin/python bash benchmarks/gpu_cost.sh /tmp/gpu-cost-check
set -u -o pipefail

OUT=${1:?usage: bash benchmarks/gpu_cost.sh OUTDIR}
PY=${PYTHON:-python3}
DEVICE=${DEVICE:-cuda}
TOTAL=${TOTAL:-570}            # seconds for the whole script
T_MEASURE=${T_MEASURE:-360}    # seconds of measuring inside gpu_cost.py (model build and fit come on top)
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

LEFT=$(($(left) - 5))
echo "== gpu_cost (timeout ${LEFT}s)" | tee "$OUT/gpu_cost.log"
timeout -k 5 "$LEFT" "$PY" -u benchmarks/gpu_cost.py --device "$DEVICE" --budget-seconds "$T_MEASURE" \
    --out-dir "$OUT" ${QUICK_ARG[@]+"${QUICK_ARG[@]}"} 2>&1 | tee -a "$OUT/gpu_cost.log"
RC=${PIPESTATUS[0]}
NOTE=""
if [ "$RC" -eq 124 ] || [ "$RC" -eq 137 ]; then NOTE=" (TIMED OUT: the .jsonl keeps the measured steps)"; fi
echo "== gpu_cost: exit $RC after $((SECONDS - START)) s$NOTE" | tee -a "$OUT/gpu_cost.log"
echo "== done in $((SECONDS - START)) s; results in $OUT:" | tee -a "$OUT/env.log"
ls -l "$OUT" | tee -a "$OUT/env.log"
