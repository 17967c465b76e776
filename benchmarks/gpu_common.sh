# Sourced by benchmarks/gpu_*.sh after they set OUT (and TOTAL): the shared start of a GPU run.
# QUICK=1 gives QUICK_ARG=(--quick); OUT is created and made absolute; the working directory becomes
# the repository root; the project runs from source (PYTHONPATH=.) with the hub offline; START, left
# (seconds of TOTAL left) and min time the run.
QUICK_ARG=()
if [ -n "${QUICK:-}" ]; then QUICK_ARG=(--quick); fi

mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd) || exit 1
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH}
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
START=$SECONDS
left() { echo $((TOTAL - (SECONDS - START))); }
min() { if [ "$1" -lt "$2" ]; then echo "$1"; else echo "$2"; fi; }
