#!/usr/bin/env bash
# GRPO with verl 0.9.1's fully asynchronous recipe on vLLM, lengthsched inside it: each group placed by predicted
# work (whole groups where the KV pools are tight), one StealDriver moving work between the replicas for the
# whole run (lengthsched.integrations.verl_async). For a GPU cluster with verl installed
# (pip install 'lengthsched[verl]' plus verl's GPU stack: vLLM 0.24, flash-attn ...).
# NOT run where lengthsched is developed (no GPU there): the manager, the stealing client and the install hook
# are tested against verl 0.9.1's real classes and Ray's setup hook on a CPU with the engines faked
# (tests/test_verl_async.py). lengthsched must be importable on every node (the hook and the router run in
# Ray workers).
#
#   bash examples/verl_fully_async_lengthsched.sh
#   MODEL=Qwen/Qwen3-8B PRESET=qwen3-8b ROLLOUT_GPUS=8 TRAIN_GPUS=8 bash examples/verl_fully_async_lengthsched.sh
set -euo pipefail

MODEL=${MODEL:-Qwen/Qwen3-1.7B}
PRESET=${PRESET:-qwen3-1.7b}          # the lengthsched memory preset of MODEL
TRAIN_GPUS=${TRAIN_GPUS:-4}           # the trainer's GPUs
ROLLOUT_GPUS=${ROLLOUT_GPUS:-4}       # the rollouter's GPUs (one vLLM replica per TP GPUs)
TP=${TP:-1}
N=${N:-16}                            # completions per prompt (G)
PROMPT_LEN=${PROMPT_LEN:-512}
RESPONSE_LEN=${RESPONSE_LEN:-4096}
GPU_MEMORY_UTILIZATION=${GPU_MEMORY_UTILIZATION:-0.85}
GPU_BYTES=${GPU_BYTES:-85899345920}   # 80 GiB
TRAIN=${TRAIN:-$HOME/data/gsm8k/train.parquet}
VAL=${VAL:-$HOME/data/gsm8k/test.parquet}

# One replica's KV pool in tokens (prompts included): what vLLM keeps after the weights, per the lengthsched
# memory model. Measure it on your engine (vLLM logs "GPU KV cache size: N tokens") and pass POOL_TOKENS=N.
POOL_TOKENS=${POOL_TOKENS:-$(python -c "
import lengthsched as ls
m = ls.ModelMemory.from_preset('$PRESET')
print(int(($GPU_BYTES * $GPU_MEMORY_UTILIZATION * $TP - m.weights_bytes) // m.kv_bytes_per_token))")}

# The router that sends each row to the replica its lengthsched priority names.
echo "router_class: lengthsched.integrations.verl.PlannedLoadBalancer" > lengthsched_router.yaml

# The recipe's settings follow its own launch scripts (verl's recipe/fully_async_policy/shell): a prompt at a time
# (train_batch_size 0, gen_batch_size 1), the raw chat kept (lengthsched keys its predictions by the prompt).
# verl's fully_async_main, with lengthsched.integrations.verl_async.setup_hook as Ray's worker_process_setup_hook:
# it replaces the recipe's FullyAsyncAgentLoopManager and FullyAsyncLLMServerClient in the rollouter's process.
python -m lengthsched.integrations.verl_async \
    algorithm.adv_estimator=grpo \
    data.train_files="$TRAIN" data.val_files="$VAL" \
    data.train_batch_size=0 data.gen_batch_size=1 data.return_raw_chat=True \
    data.max_prompt_length="$PROMPT_LEN" data.max_response_length="$RESPONSE_LEN" \
    actor_rollout_ref.model.path="$MODEL" actor_rollout_ref.hybrid_engine=False \
    actor_rollout_ref.rollout.calculate_log_probs=True \
    actor_rollout_ref.actor.ppo_mini_batch_size=32 actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4 \
    actor_rollout_ref.rollout.name=vllm actor_rollout_ref.rollout.mode=async \
    actor_rollout_ref.rollout.n="$N" \
    actor_rollout_ref.rollout.tensor_model_parallel_size="$TP" \
    actor_rollout_ref.rollout.gpu_memory_utilization="$GPU_MEMORY_UTILIZATION" \
    actor_rollout_ref.rollout.prompt_length="$PROMPT_LEN" actor_rollout_ref.rollout.response_length="$RESPONSE_LEN" \
    actor_rollout_ref.rollout.router_config_path=lengthsched_router.yaml \
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4 \
    actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4 \
    async_training.staleness_threshold=0.1 async_training.trigger_parameter_sync_step=4 \
    async_training.require_batches=1 async_training.partial_rollout=True \
    trainer.n_gpus_per_node="$TRAIN_GPUS" trainer.nnodes=1 trainer.logger=console \
    rollout.n_gpus_per_node="$ROLLOUT_GPUS" rollout.nnodes=1 rollout.n="$N" rollout.total_rollout_steps=12800 \
    +lengthsched.steal.pool_tokens="$POOL_TOKENS" +lengthsched.steal.poll_interval=0.25 \
    "$@"
