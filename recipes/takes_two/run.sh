#!/usr/bin/env bash
# Launch takes_two: a doctor and a patient, each its OWN model, trained together.
# Everything is configured by environment variables.
#
#   MODE=cpu  (default) the embedded CPU default: two SmolLM2-135M-Instruct copies, one embedded
#             engine and one torch trainer each (presets/cpu.yaml).
#   MODE=jobs the cpu preset as TWO jobs (MrlX's shape, kernel/run/jobs.py): a Redis server (durable,
#             data in $OUT/redis; or QUEUE_URL of one you run), the patient's job (trains on the
#             batches the doctor's job commits, serves the patient's turns) and the doctor's job
#             (rolls out, trains the doctor); logs in $OUT/{doctor,patient}.log. Either job can
#             be restarted on its own: RESUME=1 continues both from their checkpoints.
#   MODE=gpu  one 8-GPU node (or more) through `kernel launch`: per agent, its trainer's ranks
#             (Megatron-core by default) and SGLang servers behind its own sglang-router on the
#             GPUs and ports the plan gives it, NCCL weight sync; it stops what it started.
#
#   cpu: DATA (jsonl/parquet), STEPS, OUT; extra arguments go to `kernel train`.
#   jobs: as cpu, and QUEUE_URL, QUEUE_NAME (default takes_two-<OUT's name>), MAX_LAG (0: the
#        patient stays on policy), RESUME; extra arguments go to both jobs.
#   gpu: DOCTOR_MODEL, PATIENT_MODEL (HF checkpoint paths; may be different families),
#        DOCTOR_TRAIN_GPUS / DOCTOR_INFER_GPUS, PATIENT_TRAIN_GPUS / PATIENT_INFER_GPUS (default:
#        an even share, half to train and half to serve: 2 + 2 each on 8 GPUs), BACKEND
#        (megatron | torch), TP, PP (each trainer's tensor/pipeline-parallel sizes), GPUS (per
#        node, 8), NODES (1), RAY_ADDRESS, DATA, STEPS, OUT; DRY_RUN=1 prints and validates the
#        plan and stops (DRY_RUN=json: as JSON). TANDEM_JUDGE_URL / TANDEM_JUDGE_MODEL /
#        TANDEM_JUDGE_API_KEY turn on the patient's LLM judge (see README.md).
#   Extra arguments go to `kernel train` / `kernel launch`.
set -euo pipefail
cd "$(dirname "$0")/../.."
MODE="${MODE:-cpu}"
OUT="${OUT:-runs/takes_two-$(date +%Y%m%d-%H%M%S)}"
PY="${PY:-.venv/bin/python}"
[ -x "$PY" ] || { bash scripts/setup.sh dev,dialogue,models,megatron,router,ray; }

if [ "$MODE" = cpu ]; then
  exec "$PY" -m kernel train --recipe takes_two --preset cpu --output_dir "$OUT" \
    ${DATA:+--data.path "$DATA"} ${STEPS:+--num_steps "$STEPS"} "$@"
fi

if [ "$MODE" = jobs ]; then
  [ -x .venv/bin/redis-server ] || command -v redis-server > /dev/null ||
    bash scripts/setup.sh dev,dialogue,models,jobs
  mkdir -p "$OUT/redis"
  url="${QUEUE_URL:-}"
  pids=()
  trap 'kill "${pids[@]}" 2> /dev/null' EXIT
  if [ -z "$url" ]; then  # a durable Redis of this run's own (kernel.run.jobs.redis_command)
    port=$("$PY" -c 'from kernel.engine.launch import free_port; print(free_port())')
    mapfile -t redis < <("$PY" -c 'import sys; from kernel.run.jobs import redis_command
print("\n".join(redis_command(sys.argv[1], int(sys.argv[2]))))' "$OUT/redis" "$port")
    "${redis[@]}" > "$OUT/redis/redis.log" 2>&1 &
    pids+=($!)
    url="redis://127.0.0.1:$port/0"
  fi
  common=(--recipe takes_two --preset cpu --queue.url "$url" --eval.every 0 --eval.path ""
    --queue.name "${QUEUE_NAME:-takes_two-$(basename "$OUT")}" --queue.max_lag "${MAX_LAG:-0}"
    --resume "$([ -n "${RESUME:-}" ] && echo true || echo false)"
    ${DATA:+--data.path "$DATA"} ${STEPS:+--num_steps "$STEPS"})
  "$PY" -m kernel train "${common[@]}" --output_dir "$OUT/patient" --queue.consume true \
    --agents '[{"name": "patient"}]' "$@" > "$OUT/patient.log" 2>&1 &
  jobs_=($!)
  "$PY" -m kernel train "${common[@]}" --output_dir "$OUT/doctor" \
    --agents '[{"name": "doctor"}, {"name": "patient", "remote": true}]' "$@" \
    > "$OUT/doctor.log" 2>&1 &
  jobs_+=($!)
  pids+=("${jobs_[@]}")
  echo "takes_two as two jobs: Redis at $url; logs in $OUT/doctor.log and $OUT/patient.log"
  for _ in 1 2; do  # the first job to fail stops the other (and Redis, on exit)
    wait -n "${jobs_[@]}" || { echo "a job failed: see $OUT/doctor.log, $OUT/patient.log" >&2; exit 1; }
  done
  exit
fi

[ "$MODE" = gpu ] || { echo "MODE must be cpu, jobs or gpu, got '$MODE'" >&2; exit 2; }
DOCTOR_MODEL="${DOCTOR_MODEL:?set DOCTOR_MODEL to an HF checkpoint path for MODE=gpu}"
PATIENT_MODEL="${PATIENT_MODEL:?set PATIENT_MODEL to an HF checkpoint path for MODE=gpu}"

# place NAME MODEL TRAIN_GPUS INFER_GPUS: one agent with its own model, placed by the plan
# (settings over the preset's spec; a GPU count left empty is the plan's even share)
agent=()
place() {
  agent+=(--agent "$1.model=$2" --agent "$1.backend=${BACKEND:-megatron}")
  [ -n "$3" ] && agent+=(--agent "$1.resources.train_gpus=$3")
  [ -n "$4" ] && agent+=(--agent "$1.resources.infer_gpus=$4")
  # the Megatron trainer's parallel sizes (its trainer section: the one place they are set)
  [ "${BACKEND:-megatron}" = megatron ] &&
    agent+=(--agent "$1.trainer={tensor_parallel: ${TP:-1}, pipeline_parallel: ${PP:-1}}")
  return 0
}
place doctor "$DOCTOR_MODEL" "${DOCTOR_TRAIN_GPUS:-}" "${DOCTOR_INFER_GPUS:-}"
place patient "$PATIENT_MODEL" "${PATIENT_TRAIN_GPUS:-}" "${PATIENT_INFER_GPUS:-}"
dry=()
case "${DRY_RUN:-}" in
  "") ;;
  json) dry=(--dry-run --json) ;;
  *) dry=(--dry-run) ;;
esac
# The plan is validated before anything starts; without DRY_RUN it then runs on Ray.
exec "$PY" -m kernel launch --recipe takes_two --preset cpu --model "$DOCTOR_MODEL" \
  --output_dir "$OUT" "${agent[@]}" --cluster.nodes "${NODES:-1}" \
  --cluster.gpus_per_node "${GPUS:-8}" ${RAY_ADDRESS:+--cluster.address "$RAY_ADDRESS"} \
  --optim.dtype bfloat16 --rollout.max_response_len 512 --rollout.max_context_len 4096 \
  --recipe_args '{"max_turns": 5}' \
  ${DATA:+--data.path "$DATA"} ${STEPS:+--num_steps "$STEPS"} "${dry[@]}" "$@"
