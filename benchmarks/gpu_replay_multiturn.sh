#!/usr/bin/env bash
# Multi-turn (agentic) rollout steps replayed on one GPU (benchmarks/gpu_replay.sh with --turns): the steps
# simulate.run_multiturn says vLLM FCFS with verl's sticky session routing (the baseline), vLLM priority with
# every turn's session priority, steal blind to later turns and following them, and vLLM FCFS behind a
# cache-aware router (later turns rebalanced by load) run (sessions of 2-5 turns,
# tools of median 0.5 s, conversations prefilled from each replica's prefix cache where it still holds them),
# a sample drawn in proportion to their modelled seconds and run with a Qwen3-1.7B-shaped model. What it
# checks: that the modelled gains of following the turns hold in measured step seconds, and how the model
# prices multi-turn steps (long conversations read every step, prefills after a cached prefix, which the
# replay runs as one sequence: see gpu_replay.py). Not checked: the engines' scheduling and prefix cache
# themselves (the simulator's model either way). Sized for about 9 minutes (TOTAL, default 540 s; each
# setting an equal share); results as gpu_replay.sh writes them, named ..._multiturn.
#
#     bash benchmarks/gpu_replay_multiturn.sh OUTDIR      # from the repository root, on the GPU machine
#     PACK=OUTDIR.tgz bash benchmarks/gpu_replay_multiturn.sh OUTDIR   # also one archive of OUTDIR at the end
#
# CPU check of the script itself (tiny model, a minute):
#     DEVICE=cpu QUICK=1 TOTAL=200 PYTHON=.venv/bin/python bash benchmarks/gpu_replay_multiturn.sh /tmp/gpu-mt-check
set -u -o pipefail
export TURNS=${TURNS:-2-5}
export SETTINGS=${SETTINGS:-castillo:64:4:2 castillo:256:8:2}
export REPORT_SUFFIX=_multiturn
exec bash "$(dirname "$0")/gpu_replay.sh" "$@"
