# Sourced by benchmarks/gpu_*.sh after they set OUT (and TOTAL): the shared start of a GPU run.
# QUICK=1 gives QUICK_ARG=(--quick); OUT is created and made absolute; the working directory becomes
# the repository root; the project runs from source (PYTHONPATH=.) with the hub offline; START, left
# (seconds of TOTAL left) and min time the run. PACK=FILE.tgz: when the script exits (finished, failed or
# cut off), everything under OUT is packed into FILE.tgz too: a machine that hands back only a few files
# (the device tool returns at most 8 per call) then returns one.
QUICK_ARG=()
if [ -n "${QUICK:-}" ]; then QUICK_ARG=(--quick); fi

mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd) || exit 1
if [ -n "${PACK:-}" ]; then
    mkdir -p "$(dirname "$PACK")" && PACK=$(cd "$(dirname "$PACK")" && pwd)/$(basename "$PACK") || exit 1
    trap 'tar czf "$PACK" -C "$(dirname "$OUT")" "$(basename "$OUT")" && echo "== packed $OUT into $PACK"' EXIT
fi
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH}
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
START=$SECONDS
left() { echo $((TOTAL - (SECONDS - START))); }
min() { if [ "$1" -lt "$2" ]; then echo "$1"; else echo "$2"; fi; }
