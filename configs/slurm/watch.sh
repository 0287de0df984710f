#!/usr/bin/env bash
# Functions both launch scripts source (train_qwen3_4b.sbatch, train_1node.sh): wait for the responder's /health,
# then watch the responder and the trainer until one of them ends. They read RESPONDER_PID, TRAIN_PID, RESPONDER_URL,
# LOG_DIR, STOP_FILE, HEALTH_TIMEOUT_S, MONITOR_INTERVAL_S, RESPONDER_FAILURES, TRAINER_GRACE_S, and (set by the
# scripts' USR1 trap) TIME_LIMIT_STOP with REQUEUE and SLURM_JOB_ID.

# Wait up to HEALTH_TIMEOUT_S for /health; exit 1 with the server log's tail if it exits or never answers.
wait_for_responder() {
  echo "waiting up to ${HEALTH_TIMEOUT_S}s for $RESPONDER_URL/health (log: $LOG_DIR/responder.log)"
  local deadline=$((SECONDS + HEALTH_TIMEOUT_S))
  until curl --silent --fail --max-time 5 "$RESPONDER_URL/health" >/dev/null; do
    if ! kill -0 "$RESPONDER_PID" 2>/dev/null; then
      echo "error: the responder exited before it answered /health; last lines of its log:" >&2
      tail -n 40 "$LOG_DIR/responder.log" >&2
      exit 1
    fi
    if ((SECONDS >= deadline)); then
      echo "error: the responder did not answer $RESPONDER_URL/health within ${HEALTH_TIMEOUT_S}s; last log lines:" >&2
      tail -n 40 "$LOG_DIR/responder.log" >&2
      exit 1
    fi
    sleep 10
  done
  echo "responder healthy after ${SECONDS}s"
}

# Until the trainer ends: a responder that exits or fails RESPONDER_FAILURES health checks in a row makes the trainer
# checkpoint and stop (STOP_FILE; the trainer's own failure policy may stop it first), then the script exits 1 after
# at most TRAINER_GRACE_S. The trainer ending: exit with its status (0: done).
watch_until_done() {
  local failures=0 grace status=0
  while kill -0 "$TRAIN_PID" 2>/dev/null; do
    sleep "$MONITOR_INTERVAL_S"
    if ! kill -0 "$RESPONDER_PID" 2>/dev/null; then
      failures=$RESPONDER_FAILURES
    elif curl --silent --fail --max-time 10 "$RESPONDER_URL/health" >/dev/null; then
      failures=0
    else
      failures=$((failures + 1))
    fi
    if ((failures >= RESPONDER_FAILURES)); then
      echo "error: the responder is gone (exited, or $RESPONDER_FAILURES failed /health checks); last log lines:" >&2
      tail -n 40 "$LOG_DIR/responder.log" >&2
      echo "asking the trainer to checkpoint and stop (up to ${TRAINER_GRACE_S}s), then ending the job" >&2
      touch "$STOP_FILE"
      grace=$((SECONDS + TRAINER_GRACE_S))
      while kill -0 "$TRAIN_PID" 2>/dev/null && ((SECONDS < grace)); do sleep 1; done
      exit 1                                    # the EXIT trap stops a trainer still running
    fi
  done
  wait "$TRAIN_PID" || status=$?
  TRAIN_PID=""
  # Stopped with a checkpoint (status 2) on the time-limit signal, inside a SLURM job: requeue it; the next run
  # continues from the checkpoint (--resume auto).
  if ((status == 2)) && [[ -n ${TIME_LIMIT_STOP:-} && ${REQUEUE:-0} == 1 && -n ${SLURM_JOB_ID:-} ]]; then
    if scontrol requeue "$SLURM_JOB_ID"; then
      echo "checkpoint saved before the time limit; job $SLURM_JOB_ID requeued: it continues from the checkpoint" >&2
      exit 0
    fi
    echo "error: scontrol requeue $SLURM_JOB_ID failed: submit the same command again to continue" >&2
  fi
  if ((status != 0)); then
    echo "training exited with status $status; see above (and stopped.json in the output dir: --resume continues)" >&2
    exit "$status"
  fi
  echo "training finished"
}
