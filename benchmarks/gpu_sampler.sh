#!/usr/bin/env bash
# The reference-sampler benchmarks on one GPU with a real-size model and no weights to download:
# random-qwen3-1.7b (the shapes of Qwen/Qwen3-1.7B, random weights: gibberish text, real compute
# and memory), bfloat16. Sized for about 2 minutes on an H200; the whole script stops within
# TOTAL seconds (default 145).
#
#     bash benchmarks/gpu_sampler.sh OUTDIR        # from the repository root, on the GPU machine
#
# The project need not be installed: it runs with PYTHONPATH=. and needs python3 with numpy, torch
# and transformers (scipy / numba if present). Each benchmark runs under `timeout` with its own JSON
# (--out, rewritten after every section, so a run cut off keeps the sections it finished) and its
# output in OUTDIR/*.log; one timing out does not stop the next.
#
# CPU check of the script itself (tiny model, --quick; a minute or two):
#     MODEL=tiny-qwen3 DEVICE=cpu DTYPE=float32 QUICK=1 PYTHON=.venv/bin/python bash benchmarks/gpu_sampler.sh /tmp/gpu-check
set -u -o pipefail

OUT=${1:?usage: bash benchmarks/gpu_sampler.sh OUTDIR}
PY=${PYTHON:-python3}
MODEL=${MODEL:-random-qwen3-1.7b}
DEVICE=${DEVICE:-cuda}
DTYPE=${DTYPE:-bfloat16}
TOTAL=${TOTAL:-145}              # seconds for the whole script
T_SAMPLER=${T_SAMPLER:-80}       # most seconds for bench_sampler
T_COMPANIONS=${T_COMPANIONS:-55} # seconds kept for bench_companions
. "$(dirname "$0")/gpu_common.sh"

run() {  # run NAME SECONDS CMD...: CMD under timeout, output to the screen and OUT/NAME.log
    local name=$1 secs=$2
    shift 2
    if [ "$secs" -lt 5 ]; then
        echo "== $name: skipped, no time left" | tee "$OUT/$name.log"
        return
    fi
    echo "== $name (timeout ${secs}s): $*" | tee "$OUT/$name.log"
    local t0=$SECONDS
    timeout -k 3 "$secs" "$@" 2>&1 | tee -a "$OUT/$name.log"
    local rc=${PIPESTATUS[0]}
    local note=""
    if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then note=" (TIMED OUT: the JSON keeps the finished sections)"; fi
    echo "== $name: exit $rc after $((SECONDS - t0)) s$note" | tee -a "$OUT/$name.log"
}

{
    echo "== $(date -u +%FT%TZ) $(hostname); model $MODEL, $DTYPE on $DEVICE; budget ${TOTAL}s"
    timeout 10 nvidia-smi || echo "(nvidia-smi unavailable)"
} 2>&1 | tee "$OUT/env.log"
run versions 20 "$PY" -c "
import platform, sys, numpy, torch, transformers
print('python', platform.python_version(), '| numpy', numpy.__version__, '| torch', torch.__version__,
      '| cuda', torch.version.cuda, '| transformers', transformers.__version__)
if torch.cuda.is_available():
    print('device:', torch.cuda.get_device_name(0), '| memory GiB', round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1))
for m in ('scipy', 'numba'):
    try:
        print(m, __import__(m).__version__)
    except ImportError:
        print(m, 'missing')
"

# (a) policies (1 CASTILLO group of G = 32, lengths / 16: ~120 steps of 8 rows per slotted policy,
# 30 steps of 32 rows for full), the Prefix Grouper learner (G = 16, P = 512, l = 32), prompt KV
# shared vs copied (32 x 8 tokens after a 2048-token prompt), and the sampler vs model.generate
# (32 x 8 tokens); most important first.
run bench_sampler "$(min "$T_SAMPLER" $(($(left) - T_COMPANIONS)))" \
    "$PY" -u benchmarks/bench_sampler.py --model "$MODEL" --dtype "$DTYPE" --device "$DEVICE" \
    --groups 1 --scale 16 --short-new 8 --reps 2 --sections policies,learner,prompt_kv,generate \
    --out "$OUT/sampler.json" ${QUICK_ARG[@]+"${QUICK_ARG[@]}"}

# (b) sparse rollouts (8 sequences x 80 tokens, dense then KV budgets 24 / 48 + 8), the same caches under
# a memory budget of 2 x 80 KV tokens (G = 8, fixed_slot and length_aware admitting by the compressed KV:
# measured speed against dense, schedule against the simulator) and one Prefix Grouper point in
# separate processes (G = 8, P = 1024, l = 64). sGPO and the simulated sections are CPU-only: not run here.
run bench_companions "$(min 65 $(($(left) - 2)))" \
    "$PY" -u benchmarks/bench_companions.py --model "$MODEL" --dtype "$DTYPE" --device "$DEVICE" \
    --sections sparse,sparse_budget,learner --sparse-new 80 --sparse-group 8 --sparse-budgets 24,48 --sparse-interval 8 \
    --budget-group 8 \
    --learner-groups 8 --learner-prompts 1024 --learner-new 64 --reps 2 \
    --out "$OUT/companions.json" ${QUICK_ARG[@]+"${QUICK_ARG[@]}"}

echo "== done in $((SECONDS - START)) s; results in $OUT:" | tee -a "$OUT/env.log"
ls -l "$OUT" | tee -a "$OUT/env.log"
