#!/usr/bin/env bash
# Launch takes_two: a doctor and a patient, each its OWN model, trained together.
# Everything is configured by environment variables.
#
#   MODE=cpu  (default) the embedded CPU default: two SmolLM2-135M-Instruct copies, one embedded
#             engine and one torch trainer each (presets/cpu.yaml).
#   MODE=gpu  one GPU node, disaggregated, per agent: SGLang servers on its engine GPUs behind
#             its own sglang-router, its torch trainer on its train GPU, NCCL weight sync.
#
#   cpu: DATA (jsonl/parquet), STEPS, OUT; extra arguments go to `kernel train`.
#   gpu: DOCTOR_MODEL, PATIENT_MODEL (HF checkpoint paths; may be different families),
#        DOCTOR_ENGINE_GPUS ("2 3"), PATIENT_ENGINE_GPUS ("4 5"), DOCTOR_TRAIN_GPU (0),
#        PATIENT_TRAIN_GPU (1), DOCTOR_ROUTER_PORT (30000), PATIENT_ROUTER_PORT (30100),
#        DOCTOR_BASE_PORT (30010), PATIENT_BASE_PORT (30110), PROMETHEUS_PORT (29100; +1 for
#        the patient's router), DATA, STEPS, OUT; TANDEM_JUDGE_URL / TANDEM_JUDGE_MODEL /
#        TANDEM_JUDGE_API_KEY turn on the patient's LLM judge (see README.md).
# It stops only the processes it started, by PID.
set -euo pipefail
cd "$(dirname "$0")/../.."
MODE="${MODE:-cpu}"
OUT="${OUT:-runs/takes_two-$(date +%Y%m%d-%H%M%S)}"
PY="${PY:-.venv/bin/python}"
[ -x "$PY" ] || { bash scripts/setup.sh dev,dialogue,models; }

if [ "$MODE" = cpu ]; then
  exec "$PY" -m kernel train --recipe takes_two --preset cpu --output_dir "$OUT" \
    ${DATA:+--data.path "$DATA"} ${STEPS:+--num_steps "$STEPS"} "$@"
fi

[ "$MODE" = gpu ] || { echo "MODE must be cpu or gpu, got '$MODE'" >&2; exit 2; }
DOCTOR_MODEL="${DOCTOR_MODEL:?set DOCTOR_MODEL to an HF checkpoint path for MODE=gpu}"
PATIENT_MODEL="${PATIENT_MODEL:?set PATIENT_MODEL to an HF checkpoint path for MODE=gpu}"
DOCTOR_ENGINE_GPUS="${DOCTOR_ENGINE_GPUS:-2 3}"
PATIENT_ENGINE_GPUS="${PATIENT_ENGINE_GPUS:-4 5}"
DOCTOR_TRAIN_GPU="${DOCTOR_TRAIN_GPU:-0}"
PATIENT_TRAIN_GPU="${PATIENT_TRAIN_GPU:-1}"
DOCTOR_ROUTER_PORT="${DOCTOR_ROUTER_PORT:-30000}"
PATIENT_ROUTER_PORT="${PATIENT_ROUTER_PORT:-30100}"
DOCTOR_BASE_PORT="${DOCTOR_BASE_PORT:-30010}"
PATIENT_BASE_PORT="${PATIENT_BASE_PORT:-30110}"
PROMETHEUS_PORT="${PROMETHEUS_PORT:-29100}"
pids=()
cleanup() { for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done; }
trap cleanup EXIT INT TERM
mkdir -p "$OUT/logs"

# start_pool NAME MODEL "GPUS" BASE_PORT ROUTER_PORT PROMETHEUS_PORT: SGLang servers (one per
# GPU) and a router in front of them; sets POOL_JSON to the agent's engine override.
start_pool() {
  local name="$1" model="$2" gpus="$3" port="$4" router_port="$5" prom_port="$6"
  local workers=() gpu url urls
  for gpu in $gpus; do
    CUDA_VISIBLE_DEVICES="$gpu" "$PY" -m sglang.launch_server --model-path "$model" \
      --host 127.0.0.1 --port "$port" >"$OUT/logs/sglang-$name-$gpu.log" 2>&1 &
    pids+=("$!")
    workers+=("http://127.0.0.1:$port")
    port=$((port + 1))
  done
  for url in "${workers[@]}"; do
    until curl -sf "$url/health" >/dev/null; do sleep 2; done
  done
  # each router its own metrics port: two routers on one node must not collide
  "$PY" -m sglang_router.launch_router --host 127.0.0.1 --port "$router_port" \
    --prometheus-host 127.0.0.1 --prometheus-port "$prom_port" \
    --worker-urls "${workers[@]}" >"$OUT/logs/router-$name.log" 2>&1 &
  pids+=("$!")
  until curl -sf "http://127.0.0.1:$router_port/health" >/dev/null; do sleep 1; done
  urls=$(printf '"%s",' "${workers[@]}")
  POOL_JSON="{\"urls\":[${urls%,}],\"router_url\":\"http://127.0.0.1:$router_port\"}"
}

start_pool doctor "$DOCTOR_MODEL" "$DOCTOR_ENGINE_GPUS" "$DOCTOR_BASE_PORT" \
  "$DOCTOR_ROUTER_PORT" "$PROMETHEUS_PORT"
doctor_engine="$POOL_JSON"
start_pool patient "$PATIENT_MODEL" "$PATIENT_ENGINE_GPUS" "$PATIENT_BASE_PORT" \
  "$PATIENT_ROUTER_PORT" "$((PROMETHEUS_PORT + 1))"
patient_engine="$POOL_JSON"

# Both trainers live in this process: the two train GPUs are visible as cuda:0 and cuda:1.
# Generation goes through each agent's router; control and weight sync to its engines directly.
agents="[{\"name\":\"doctor\",\"model\":\"$DOCTOR_MODEL\",\"engine\":$doctor_engine,"
agents+="\"trainer\":{\"device\":\"cuda:0\"}},"
agents+="{\"name\":\"patient\",\"model\":\"$PATIENT_MODEL\",\"engine\":$patient_engine,"
agents+="\"trainer\":{\"device\":\"cuda:1\"}}]"
CUDA_VISIBLE_DEVICES="$DOCTOR_TRAIN_GPU,$PATIENT_TRAIN_GPU" "$PY" -m kernel train \
  --recipe takes_two --preset cpu --model "$DOCTOR_MODEL" --output_dir "$OUT" \
  --agents "$agents" --optim.dtype bfloat16 --sync.transport distributed --sync.backend nccl \
  --rollout.max_response_len 512 --rollout.max_context_len 4096 \
  --recipe_args '{"max_turns": 5}' \
  ${DATA:+--data.path "$DATA"} ${STEPS:+--num_steps "$STEPS"} "$@"
