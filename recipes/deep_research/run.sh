#!/usr/bin/env bash
# Launch deep_research: the retriever service, then the training run that calls it.
# Everything is configured by environment variables.
#
#   MODE=cpu  (default) the embedded CPU default: SmolLM2-135M-Instruct plays the main agent and
#             the searcher on one embedded engine; the retriever serves the shipped corpus.
#   MODE=gpu  one GPU node, disaggregated: SGLang servers on ENGINE_GPUS behind sglang-router,
#             the torch trainer on TRAIN_GPU, NCCL weight sync; the retriever on RETRIEVER_DEVICE.
#
#   MODEL (smollm2 | HF path), DATA (train jsonl/parquet), STEPS, OUT, PRESET (cpu | tiny),
#   CORPUS (retriever JSONL, default the shipped one), INDEX (index folder; built if missing),
#   EMBEDDER (retriever model, default minilm), RETRIEVER_DEVICE (cpu), RETRIEVER_PORT (free),
#   ENGINE_GPUS ("4 5 6 7"), TRAIN_GPU (0), ROUTER_PORT (30000), BASE_PORT (30010);
#   extra arguments go to `kernel train`.
# It stops only the processes it started, by PID.
set -euo pipefail
cd "$(dirname "$0")/../.."
MODE="${MODE:-cpu}"
OUT="${OUT:-runs/deep_research-$(date +%Y%m%d-%H%M%S)}"
PY="${PY:-.venv/bin/python}"
PRESET="${PRESET:-cpu}"
CORPUS="${CORPUS:-recipes/deep_research/data/corpus.jsonl}"
EMBEDDER="${EMBEDDER:-minilm}"
INDEX="${INDEX:-runs/deep_research-index/$(basename "$CORPUS" .jsonl)-$EMBEDDER}"
RETRIEVER_DEVICE="${RETRIEVER_DEVICE:-cpu}"
[ -x "$PY" ] || { bash scripts/setup.sh dev,retriever,models; }
[ "$MODE" = cpu ] || [ "$MODE" = gpu ] || { echo "MODE must be cpu or gpu, got '$MODE'" >&2; exit 2; }

pids=()
cleanup() { for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done; }
trap cleanup EXIT INT TERM
mkdir -p "$OUT/logs"

free_port() { "$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# The retriever: build the index once, serve it on 127.0.0.1.
if [ ! -f "$INDEX/meta.json" ]; then
  "$PY" -m retriever build --corpus "$CORPUS" --out "$INDEX" --model "$EMBEDDER" \
    --device "$RETRIEVER_DEVICE"
fi
RETRIEVER_PORT="${RETRIEVER_PORT:-$(free_port)}"
RETRIEVER_URL="http://127.0.0.1:$RETRIEVER_PORT"
"$PY" -m retriever serve --index "$INDEX" --model "$EMBEDDER" --device "$RETRIEVER_DEVICE" \
  --host 127.0.0.1 --port "$RETRIEVER_PORT" >"$OUT/logs/retriever.log" 2>&1 &
pids+=("$!")
until curl -sf "$RETRIEVER_URL/health" >/dev/null; do
  kill -0 "${pids[0]}" 2>/dev/null || { echo "retriever failed, see $OUT/logs/retriever.log" >&2; exit 1; }
  sleep 1
done

if [ "$MODE" = cpu ]; then
  "$PY" -m kernel train --recipe deep_research --preset "$PRESET" --output_dir "$OUT" \
    --recipe_args.retriever_url "$RETRIEVER_URL" \
    ${MODEL:+--model "$MODEL"} ${DATA:+--data.path "$DATA"} ${STEPS:+--num_steps "$STEPS"} "$@"
  exit
fi

MODEL="${MODEL:?set MODEL to an HF checkpoint path for MODE=gpu}"
ENGINE_GPUS="${ENGINE_GPUS:-4 5 6 7}"
ROUTER_PORT="${ROUTER_PORT:-30000}"
BASE_PORT="${BASE_PORT:-30010}"
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
CUDA_VISIBLE_DEVICES="${TRAIN_GPU:-0}" "$PY" -m kernel train --recipe deep_research \
  --preset "$PRESET" --model "$MODEL" --output_dir "$OUT" --engine.urls "[${urls%,}]" \
  --engine.router_url "http://127.0.0.1:$ROUTER_PORT" \
  --recipe_args.retriever_url "$RETRIEVER_URL" \
  --trainer.device cuda --optim.dtype bfloat16 --sync.transport distributed \
  --sync.backend nccl ${DATA:+--data.path "$DATA"} ${STEPS:+--num_steps "$STEPS"} "$@"
