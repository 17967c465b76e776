#!/usr/bin/env bash
# KV transfer against recomputation on one GPU (benchmarks/gpu_kv_transfer.py): offload a request's
# paged KV to pinned host memory, load it back into another paged cache, and a copy on the device,
# for Qwen3-1.7B and Qwen3-8B KV shapes, beside the modelled seconds of recomputing the same tokens.
# About a minute on an H100; the whole script stops within TOTAL seconds (default 240).
#
#     bash benchmarks/gpu_kv_transfer.sh OUTDIR        # from the repository root, on the GPU machine
#
# Needs python3 with numpy and torch (the project runs from source, PYTHONPATH=.). The report goes to
# OUTDIR/kv_transfer_<card>.json (rewritten after each model), the output to OUTDIR/*.log.
#
# CPU check of the script itself (seconds):
#     DEVICE=cpu QUICK=1 PYTHON=.venv/bin/python bash benchmarks/gpu_kv_transfer.sh /tmp/gpu-kv-check
set -u -o pipefail

OUT=${1:?usage: bash benchmarks/gpu_kv_transfer.sh OUTDIR}
PY=${PYTHON:-python3}
DEVICE=${DEVICE:-cuda}
TOTAL=${TOTAL:-240}
. "$(dirname "$0")/gpu_common.sh"

{
    echo "== $(date -u +%FT%TZ) $(hostname); device $DEVICE; budget ${TOTAL}s"
    timeout 10 nvidia-smi || echo "(nvidia-smi unavailable)"
} 2>&1 | tee "$OUT/env.log"
CARD=$(timeout 60 "$PY" -c "import torch; n = torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'cpu'; print('h100' if 'H100' in n else 'h200' if 'H200' in n else 'cpu' if n == 'cpu' else 'gpu')")
echo "== gpu_kv_transfer on $CARD (timeout $(( $(left) - 5 ))s)" | tee "$OUT/gpu_kv_transfer.log"
timeout -k 5 $(( $(left) - 5 )) "$PY" -u benchmarks/gpu_kv_transfer.py --device "$DEVICE" \
    --out "$OUT/kv_transfer_${CARD}.json" ${QUICK_ARG[@]+"${QUICK_ARG[@]}"} 2>&1 | tee -a "$OUT/gpu_kv_transfer.log"
echo "== gpu_kv_transfer: exit ${PIPESTATUS[0]} after $((SECONDS - START)) s" | tee -a "$OUT/gpu_kv_transfer.log"
ls -l "$OUT"
