#!/usr/bin/env bash
# GRPO training of the Qwen3-4B reasoning-state policy on ONE 8-GPU node: the policy trains on some GPUs (default
# 0-3, accelerate + DeepSpeed ZeRO-3, vLLM rollouts colocated) and the frozen responder (Qwen/Qwen3-8B, vLLM's
# OpenAI-compatible server, one data-parallel replica per GPU) serves on the others (default 4-7), on localhost.
#
# Run it on the node itself from the repository root, or submit it: it needs no srun.
#   bash configs/slurm/train_1node.sh --max_steps 200                   # extra args go to `memstate train`
#   sbatch --nodes=1 --gpus-per-node=8 --exclusive --time=48:00:00 --signal=B:USR1@1800 --requeue \
#     configs/slurm/train_1node.sh                                     # requeues itself at the time limit
#   TRAIN_GPUS=0,1 RESPONDER_GPUS=2,3 bash configs/slurm/train_1node.sh # other splits; the dry run checks them
#
# Order, as in train_qwen3_4b.sbatch: the dry run for the training GPU count first (completions_per_step keeps
# 1,024 completions per optimizer step: accumulation 16 on 4 GPUs; a 6 + 2 split does not divide and is refused
# before anything loads), then the responder and its /health, then training. Whichever of the two dies first ends
# the other; the trainer is first asked to checkpoint and stop (STOP_FILE), as on SIGUSR1 (SLURM's signal before the
# time limit); under sbatch the job then requeues itself, and `--resume auto` (the default) continues from it.
set -euo pipefail

# --- settings ---------------------------------------------------------------------------------------------------
REPO=${SLURM_SUBMIT_DIR:-$PWD}
VENV=${VENV:-$REPO/.venv}
MEMSTATE=${MEMSTATE:-$VENV/bin/memstate}
VLLM_PYTHON=${VLLM_PYTHON:-$VENV/bin/python}
TRAIN_CONFIG=${TRAIN_CONFIG:-configs/train/qwen3_4b_8gpu.yaml}
ACCELERATE_CONFIG=${ACCELERATE_CONFIG:-configs/accelerate/zero3_1node_8gpu.yaml}  # --num_processes overrides its 8
TRAIN_GPUS=${TRAIN_GPUS:-0,1,2,3}
RESPONDER_GPUS=${RESPONDER_GPUS:-4,5,6,7}
MAIN_PROCESS_PORT=${MAIN_PROCESS_PORT:-29500}
RESPONDER_MODEL=${RESPONDER_MODEL:-Qwen/Qwen3-8B}
RESPONDER_PORT=${RESPONDER_PORT:-8000}
RESPONDER_MAX_LEN=${RESPONDER_MAX_LEN:-12288}
HEALTH_TIMEOUT_S=${HEALTH_TIMEOUT_S:-1800}
MONITOR_INTERVAL_S=${MONITOR_INTERVAL_S:-30}
RESPONDER_FAILURES=${RESPONDER_FAILURES:-4}
TRAINER_GRACE_S=${TRAINER_GRACE_S:-}  # empty: the dry run's stop_grace_s (responder_round_deadline + step and save)
LOG_DIR=${LOG_DIR:-$REPO/runs/slurm/${SLURM_JOB_ID:-1node-$(date +%Y%m%d-%H%M%S)}}
STOP_FILE=${STOP_FILE:-$LOG_DIR/stop-requested}
REQUEUE=${REQUEUE:-1}  # under sbatch: after a time-limit checkpoint, requeue the job (0: just end it)

export WANDB_MODE=${WANDB_MODE:-offline}        # offline under output_dir unless WANDB_MODE=online
# Offline by default (download the models first; HF_HOME as you set it): train_qwen3_4b.sbatch says why and how.
export HF_HUB_OFFLINE=${HF_HUB_OFFLINE:-1}
export TRANSFORMERS_OFFLINE=${TRANSFORMERS_OFFLINE:-$HF_HUB_OFFLINE}
export TOKENIZERS_PARALLELISM=false
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-8}

cd "$REPO"
# shellcheck source=configs/slurm/watch.sh
source configs/slurm/watch.sh
for f in "$TRAIN_CONFIG" "$ACCELERATE_CONFIG" "$VENV/bin/accelerate" "$MEMSTATE" "$VLLM_PYTHON"; do
  [[ -e $f ]] || { echo "error: $f not found (run from the repository root; see the header)" >&2; exit 2; }
done
IFS=, read -ra train_gpus <<<"$TRAIN_GPUS"
IFS=, read -ra responder_gpus <<<"$RESPONDER_GPUS"
NUM_PROCESSES=${#train_gpus[@]}
RESPONDER_DP=${#responder_gpus[@]}
RESPONDER_URL=http://127.0.0.1:$RESPONDER_PORT
mkdir -p "$LOG_DIR"
rm -f "$STOP_FILE"
echo "responder: GPUs $RESPONDER_GPUS ($RESPONDER_URL); training: GPUs $TRAIN_GPUS ($NUM_PROCESSES processes)"

# --- launch arithmetic, before anything starts ------------------------------------------------------------------
TRAIN_ARGS=(--config "$TRAIN_CONFIG" --responder_url "$RESPONDER_URL" --responder_model "$RESPONDER_MODEL"
            --stop_file "$STOP_FILE" --resume auto "$@")  # a resubmitted job continues; your args come last
# --launch-checks: a model that does not resolve offline or a disk too small for the kept saves is refused here too.
if ! "$MEMSTATE" train "${TRAIN_ARGS[@]}" --dry-run --world-size "$NUM_PROCESSES" --launch-checks \
    >"$LOG_DIR/dry-run.txt" 2>&1; then
  reason=$(grep -m 1 "error:" "$LOG_DIR/dry-run.txt" || tail -n 1 "$LOG_DIR/dry-run.txt")
  echo "error: the dry run refused the launch on $NUM_PROCESSES training GPUs ($TRAIN_GPUS): ${reason#*error: }" >&2
  exit 2
fi
# How long a trainer asked to stop may take (the reward round's budget, the step, the save): from the config.
TRAINER_GRACE_S=${TRAINER_GRACE_S:-$(awk '$1 == "stop_grace_s" {print $2}' "$LOG_DIR/dry-run.txt")}
echo "launch arithmetic for $NUM_PROCESSES processes (memstate train --dry-run):"
cat "$LOG_DIR/dry-run.txt"

# --- responder on its GPUs --------------------------------------------------------------------------------------
CUDA_VISIBLE_DEVICES=$RESPONDER_GPUS "$VLLM_PYTHON" -m vllm.entrypoints.cli.main serve "$RESPONDER_MODEL" \
  --served-model-name "$RESPONDER_MODEL" --host 127.0.0.1 --port "$RESPONDER_PORT" \
  --data-parallel-size "$RESPONDER_DP" --api-server-count "$RESPONDER_DP" \
  --dtype bfloat16 --max-model-len "$RESPONDER_MAX_LEN" --enable-prefix-caching --seed 0 --disable-log-stats \
  >"$LOG_DIR/responder.log" 2>&1 &
RESPONDER_PID=$!
TRAIN_PID=""

stop_all() {
  for pid in $TRAIN_PID $RESPONDER_PID; do
    if kill -0 "$pid" 2>/dev/null; then
      kill -TERM "$pid" 2>/dev/null || true
      wait "$pid" 2>/dev/null || true
    fi
  done
}
trap stop_all EXIT
trap 'exit 143' TERM INT
trap 'echo "stop requested (SIGUSR1): asking the trainer to checkpoint and stop"; TIME_LIMIT_STOP=1; touch "$STOP_FILE"' USR1

wait_for_responder

# --- baselines: what the dry run found missing from baseline_cache is scored now, once, by this host -------------
# (node-local, then renamed onto the shared path: memstate train --precompute-baselines; training's ranks only read it)
MISSING_BASELINES=$(awk '$1 == "baseline_cache_missing" {print $2}' "$LOG_DIR/dry-run.txt")
if [[ $MISSING_BASELINES =~ ^[0-9]+$ ]] && ((MISSING_BASELINES > 0)); then
  echo "baseline_cache lacks $MISSING_BASELINES baselines: precomputing them (log: $LOG_DIR/precompute.txt)"
  if ! "$MEMSTATE" train "${TRAIN_ARGS[@]}" --precompute-baselines >"$LOG_DIR/precompute.txt" 2>&1; then
    echo "error: precomputing the baselines failed; last lines of $LOG_DIR/precompute.txt:" >&2
    tail -n 20 "$LOG_DIR/precompute.txt" >&2
    exit 1
  fi
  tail -n 1 "$LOG_DIR/precompute.txt"
fi

# --- training on its GPUs ---------------------------------------------------------------------------------------
CUDA_VISIBLE_DEVICES=$TRAIN_GPUS "$VENV/bin/accelerate" launch --config_file "$ACCELERATE_CONFIG" \
  --num_machines 1 --num_processes "$NUM_PROCESSES" --main_process_port "$MAIN_PROCESS_PORT" \
  -m memstate.cli train "${TRAIN_ARGS[@]}" &
TRAIN_PID=$!

watch_until_done
