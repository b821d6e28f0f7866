#!/usr/bin/env bash
# Launch math_solver_verifier. Everything is configured by environment variables.
#
#   MODE=cpu  (default) the embedded CPU default: SmolLM2-135M-Instruct on an embedded engine.
#   MODE=gpu  one GPU node, disaggregated: SGLang servers on ENGINE_GPUS behind sglang-router,
#             the torch trainer on TRAIN_GPU, NCCL weight sync. (The Megatron-core backend and
#             Ray placement for TP/PP/DP and colocation arrive with the cluster launcher.)
#
#   MODEL (smollm2 | HF path), DATA (jsonl/parquet/HF name), STEPS, OUT, ENGINE_GPUS ("4 5 6 7"),
#   TRAIN_GPU (0), ROUTER_PORT (30000), BASE_PORT (30010); extra arguments go to `kernel train`.
# It stops only the processes it started, by PID.
set -euo pipefail
cd "$(dirname "$0")/../.."
MODE="${MODE:-cpu}"
OUT="${OUT:-runs/math-$(date +%Y%m%d-%H%M%S)}"
PY="${PY:-.venv/bin/python}"
[ -x "$PY" ] || { bash scripts/setup.sh dev,math,models; }

if [ "$MODE" = cpu ]; then
  exec "$PY" -m kernel train --recipe math_solver_verifier --preset cpu --output_dir "$OUT" \
    ${MODEL:+--model "$MODEL"} ${DATA:+--data.path "$DATA"} ${STEPS:+--num_steps "$STEPS"} "$@"
fi

[ "$MODE" = gpu ] || { echo "MODE must be cpu or gpu, got '$MODE'" >&2; exit 2; }
MODEL="${MODEL:?set MODEL to an HF checkpoint path for MODE=gpu}"
ENGINE_GPUS="${ENGINE_GPUS:-4 5 6 7}"
ROUTER_PORT="${ROUTER_PORT:-30000}"
BASE_PORT="${BASE_PORT:-30010}"
pids=()
cleanup() { for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done; }
trap cleanup EXIT INT TERM
mkdir -p "$OUT/logs"

workers=()
port="$BASE_PORT"
for gpu in $ENGINE_GPUS; do
  CUDA_VISIBLE_DEVICES="$gpu" "$PY" -m sglang.launch_server --model-path "$MODEL" \
    --host 127.0.0.1 --port "$port" >"$OUT/logs/sglang-$gpu.log" 2>&1 &
  pids+=("$!")
  workers+=("http://127.0.0.1:$port")
  port=$((port + 1))
done
for url in "${workers[@]}"; do
  until curl -sf "$url/health" >/dev/null; do sleep 2; done
done
"$PY" -m sglang_router.launch_router --host 127.0.0.1 --port "$ROUTER_PORT" \
  --worker-urls "${workers[@]}" >"$OUT/logs/router.log" 2>&1 &
pids+=("$!")
until curl -sf "http://127.0.0.1:$ROUTER_PORT/health" >/dev/null; do sleep 1; done

# Generation goes through the router; control and weight sync go to every engine directly.
urls=$(printf '"%s",' "${workers[@]}")
CUDA_VISIBLE_DEVICES="${TRAIN_GPU:-0}" "$PY" -m kernel train --recipe math_solver_verifier \
  --preset cpu --model "$MODEL" --output_dir "$OUT" --engine.urls "[${urls%,}]" \
  --engine.router_url "http://127.0.0.1:$ROUTER_PORT" \
  --trainer.device cuda --optim.dtype bfloat16 --sync.transport distributed \
  --sync.backend nccl ${DATA:+--data.path "$DATA"} ${STEPS:+--num_steps "$STEPS"} "$@"
