#!/usr/bin/env bash
# slime with and without lengthsched, replayed on one GPU (benchmarks/gpu_replay.sh with slime's runs):
# slime as it ships (SGLang's engines behind its cache-aware router, 512 requests per engine in flight),
# slime with lengthsched.integrations.slime (the plan and client queues, simulate.run_slime_planned) and
# steal over SGLang's engines (steal_sglang), the first the baseline. What it checks: that the
# integration's modelled gain over slime holds in measured step seconds (the engines' scheduling is the
# simulator's SGLang model either way: no SGLang runs here). Sized for about 9 minutes (TOTAL, default
# 540 s; each setting an equal share); results as gpu_replay.sh writes them, named ..._slime.
#
#     bash benchmarks/gpu_replay_slime.sh OUTDIR      # from the repository root, on the GPU machine
#     PACK=OUTDIR.tgz bash benchmarks/gpu_replay_slime.sh OUTDIR   # also one archive of OUTDIR at the end
#
# CPU check of the script itself (tiny model, a minute):
#     DEVICE=cpu QUICK=1 TOTAL=200 PYTHON=.venv/bin/python bash benchmarks/gpu_replay_slime.sh /tmp/gpu-slime-check
set -u -o pipefail
export POLICIES=${POLICIES:-sglang:cache_aware@512,sglang:slime_plan@512,steal_sglang}
export SETTINGS=${SETTINGS:-castillo:64:4:2 castillo:256:8:4}
export REPORT_SUFFIX=_slime
exec bash "$(dirname "$0")/gpu_replay.sh" "$@"
