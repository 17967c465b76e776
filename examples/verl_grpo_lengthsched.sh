#!/usr/bin/env bash
# GRPO with verl 0.9.1 on vLLM, each rollout batch planned by lengthsched. For a GPU cluster with
# verl installed (pip install 'lengthsched[verl]' plus verl's GPU stack: vLLM, flash-attn ...).
# NOT run where lengthsched is developed (no GPU there): the planner, the router and the manager
# are tested against verl 0.9.1's real classes on a CPU with the engine calls faked
# (tests/test_verl.py), and examples/verl_config.py, which computes the settings below, runs in the
# tests. lengthsched must be importable on every node (the router runs as a Ray actor).
#
#   bash examples/verl_grpo_lengthsched.sh                      # GSM8K parquet files from verl's recipe
#   MODEL=Qwen/Qwen3-8B GPUS=8 bash examples/verl_grpo_lengthsched.sh
set -euo pipefail

MODEL=${MODEL:-Qwen/Qwen3-1.7B}
PRESET=${PRESET:-qwen3-1.7b}          # the lengthsched memory preset of MODEL
GPUS=${GPUS:-8}
TP=${TP:-1}
N=${N:-16}                            # completions per prompt (G)
PROMPTS=${PROMPTS:-256}               # prompts per step (B)
PROMPT_LEN=${PROMPT_LEN:-512}
RESPONSE_LEN=${RESPONSE_LEN:-2048}
TRAINER=${TRAINER:-v1}                # verl's trainer: v1 (its default) or legacy
STEAL=${STEAL:-0}                     # 1: the stealing manager (replicas that drain take waiting requests)
SELECTIVE=${SELECTIVE:-0}             # 1 (v1): verl_selective's replay buffer, for DAPO's filter (pass
                                      # algorithm.filter_groups.enable=true yourself): refills only what is needed
SGPO=${SGPO:-0}                       # 1 (v1): online sGPO, each prompt's group size from its latest groups' rewards
SGPO_STATE=${SGPO_STATE:-}            # with SGPO=1: where its budget is kept (an absolute path in this run's
                                      # checkpoint directory); empty: in memory only
TRAIN=${TRAIN:-$HOME/data/gsm8k/train.parquet}
VAL=${VAL:-$HOME/data/gsm8k/test.parquet}

REPLICAS=$((GPUS / TP))
GROUPS_PER_REPLICA=$(((PROMPTS + REPLICAS - 1) / REPLICAS))

# The rollout settings: scheduling_policy=priority, max_num_seqs, gpu_memory_utilization and
# engine_kwargs.vllm.kv_cache_memory_bytes from the plan; the manager and the router by name, for verl's
# default v1 trainer (trainer.use_v1=true; TRAINER=legacy: the legacy trainer and its manager; STEAL=1: the
# trainer's stealing manager, its pool, and for v1 Ray's worker_process_setup_hook; SELECTIVE=1: the custom replay
# buffer of lengthsched.integrations.verl_selective; SGPO=1: the manager's online sGPO, its budget in SGPO_STATE).
FLAGS=()
if [ "$STEAL" = 1 ]; then FLAGS=(--steal); fi
if [ "$SELECTIVE" = 1 ]; then FLAGS+=(--selective); fi
if [ "$SGPO" = 1 ]; then FLAGS+=(--sgpo); fi
if [ "$SGPO" = 1 ] && [ -n "$SGPO_STATE" ]; then FLAGS+=(--sgpo-state "$SGPO_STATE"); fi
mapfile -t LENGTHSCHED < <(python examples/verl_config.py --preset "$PRESET" --group-size "$N" --slots "$N" \
    --groups-per-replica "$GROUPS_PER_REPLICA" --prompt-tokens "$PROMPT_LEN" --max-new-tokens "$RESPONSE_LEN" \
    --tensor-parallel-size "$TP" --router-yaml lengthsched_router.yaml --trainer "$TRAINER" "${FLAGS[@]}")

python -m verl.trainer.main_ppo \
    algorithm.adv_estimator=grpo \
    data.train_files="$TRAIN" data.val_files="$VAL" \
    data.train_batch_size="$PROMPTS" data.max_prompt_length="$PROMPT_LEN" data.max_response_length="$RESPONSE_LEN" \
    actor_rollout_ref.model.path="$MODEL" \
    actor_rollout_ref.actor.ppo_mini_batch_size=64 actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4 \
    actor_rollout_ref.rollout.n="$N" \
    actor_rollout_ref.rollout.prompt_length="$PROMPT_LEN" actor_rollout_ref.rollout.response_length="$RESPONSE_LEN" \
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4 \
    actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4 \
    trainer.n_gpus_per_node="$GPUS" trainer.nnodes=1 trainer.total_epochs=1 trainer.logger=console \
    "${LENGTHSCHED[@]}" "$@"
