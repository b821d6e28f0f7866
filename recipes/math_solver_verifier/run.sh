#!/usr/bin/env bash
# Launch math_solver_verifier. Everything is configured by environment variables.
#
#   MODE=cpu  (default) the embedded CPU default: SmolLM2-135M-Instruct on an embedded engine.
#   MODE=gpu  one GPU node, disaggregated: `kernel launch --dry-run` plans and validates the
#             placement (which GPU trains, which serves, ports); SGLang servers start on the
#             planned GPUs and ports behind sglang-router; the torch trainer runs on the planned
#             training GPU with NCCL weight sync.
#
#   MODEL (smollm2 | HF path), DATA (jsonl/parquet/HF name), STEPS, OUT,
#   GPUS (GPUs of the node, 8), NUM_ENGINES (SGLang servers, 4), ROUTER_PORT (30000),
#   BASE_PORT (first engine port, 30010); extra arguments go to `kernel train`.
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
NUM_ENGINES="${NUM_ENGINES:-4}"
agents="[{\"name\":\"solver\",\"resources\":{\"train_gpus\":1,\"infer_gpus\":$NUM_ENGINES}},"
agents+="\"rewriter\",\"selector\"]"
plan_args=(--recipe math_solver_verifier --preset cpu --model "$MODEL" --agents "$agents"
  --cluster.gpus_per_node "${GPUS:-8}" --cluster.router_base_port "${ROUTER_PORT:-30000}"
  --cluster.engine_base_port "${BASE_PORT:-30010}")
# Plan and validate before starting anything; print the plan, then read GPUs and ports from it.
"$PY" -m kernel launch "${plan_args[@]}" --dry-run
plan=$("$PY" -m kernel launch "${plan_args[@]}" --dry-run --json)
read -r TRAIN_GPU ROUTER_PORT < <("$PY" -c 'import json,sys; g=json.load(sys.stdin)["groups"][0]
print(g["trainer"][0]["gpu"], g["router_port"])' <<<"$plan")
mapfile -t engines < <("$PY" -c 'import json,sys; g=json.load(sys.stdin)["groups"][0]
for e in g["engines"]: print(e["gpus"][0], e["port"])' <<<"$plan")

pids=()
cleanup() { for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done; }
trap cleanup EXIT INT TERM
mkdir -p "$OUT/logs"

workers=()
for line in "${engines[@]}"; do
  read -r gpu port <<<"$line"
  CUDA_VISIBLE_DEVICES="$gpu" "$PY" -m sglang.launch_server --model-path "$MODEL" \
    --host 127.0.0.1 --port "$port" >"$OUT/logs/sglang-$gpu.log" 2>&1 &
  pids+=("$!")
  workers+=("http://127.0.0.1:$port")
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
CUDA_VISIBLE_DEVICES="$TRAIN_GPU" "$PY" -m kernel train --recipe math_solver_verifier \
  --preset cpu --model "$MODEL" --output_dir "$OUT" --engine.urls "[${urls%,}]" \
  --engine.router_url "http://127.0.0.1:$ROUTER_PORT" \
  --trainer.device cuda --optim.dtype bfloat16 --sync.transport distributed \
  --sync.backend nccl ${DATA:+--data.path "$DATA"} ${STEPS:+--num_steps "$STEPS"} "$@"
