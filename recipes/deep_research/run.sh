#!/usr/bin/env bash
# Launch deep_research: the retriever service, then the training run that calls it.
# Everything is configured by environment variables.
#
#   MODE=cpu  (default) the embedded CPU default: SmolLM2-135M-Instruct plays the main agent and
#             the searcher on one embedded engine; the retriever serves the shipped corpus.
#   MODE=gpu  one 8-GPU node (or more) through `kernel launch`: the trainer's ranks (Megatron-
#             core by default) and SGLang servers behind sglang-router on the GPUs and ports the
#             plan gives them, NCCL weight sync; the retriever on RETRIEVER_DEVICE of this node
#             (the rollouts, which call it, run here).
#
#   MODEL (smollm2 | HF path), DATA (train jsonl/parquet), STEPS, OUT, PRESET (cpu | tiny | learn | routed),
#   CORPUS (retriever JSONL, default the shipped one), INDEX (index folder; built if missing),
#   EMBEDDER (retriever model, default minilm), RETRIEVER_DEVICE (cpu), RETRIEVER_PORT (free);
#   gpu: TRAIN_GPUS (default half), BACKEND (megatron | torch), TP, PP, ENGINE_TP, GPUS (per
#   node, 8), NODES (1), RAY_ADDRESS, DRY_RUN (1 | json: print the plan and stop);
#   cpu: COMMAND (train | eval: `kernel eval`, e.g. of a run's checkpoint with --checkpoint DIR);
#   extra arguments go to `kernel train` / `kernel eval` / `kernel launch`.
# It stops only the processes it started, by PID (and `kernel launch` only what it started).
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
[ -x "$PY" ] || { bash scripts/setup.sh dev,retriever,models,megatron,router,ray; }
[ "$MODE" = cpu ] || [ "$MODE" = gpu ] || { echo "MODE must be cpu or gpu, got '$MODE'" >&2; exit 2; }
COMMAND="${COMMAND:-train}"
[ "$COMMAND" = train ] || [ "$COMMAND" = eval ] ||
  { echo "COMMAND must be train or eval, got '$COMMAND'" >&2; exit 2; }

pids=()
cleanup() { for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done; }
trap cleanup EXIT INT TERM
mkdir -p "$OUT/logs"

if [ "$MODE" = gpu ]; then
  MODEL="${MODEL:?set MODEL to an HF checkpoint path for MODE=gpu}"
  GPUS="${GPUS:-8}" NODES="${NODES:-1}"
  train=${TRAIN_GPUS:-$((GPUS * NODES / 2))}
  # the agent's spec places the one model (the searcher shares it): settings over the preset's
  agent=(--agent "agent.backend=${BACKEND:-megatron}" --agent "agent.resources={train_gpus: $train,
    infer_gpus: $((GPUS * NODES - train)), engine_tensor_parallel: ${ENGINE_TP:-1}}")
  # the Megatron trainer's parallel sizes (its trainer section: the one place they are set)
  [ "${BACKEND:-megatron}" = megatron ] &&
    agent+=(--agent "agent.trainer={tensor_parallel: ${TP:-1}, pipeline_parallel: ${PP:-1}}")
  launch=("$PY" -m kernel launch --recipe deep_research --preset "$PRESET" --model "$MODEL"
    --output_dir "$OUT" "${agent[@]}" --cluster.nodes "$NODES" --cluster.gpus_per_node "$GPUS"
    ${RAY_ADDRESS:+--cluster.address "$RAY_ADDRESS"} --optim.dtype bfloat16
    ${DATA:+--data.path "$DATA"} ${STEPS:+--num_steps "$STEPS"})
  # Plan and validate before starting anything (the retriever included).
  case "${DRY_RUN:-}" in
    "") "${launch[@]}" --dry-run "$@" >/dev/null ;;
    json) exec "${launch[@]}" --dry-run --json "$@" ;;
    *) exec "${launch[@]}" --dry-run "$@" ;;
  esac
fi

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
  "$PY" -m kernel "$COMMAND" --recipe deep_research --preset "$PRESET" --output_dir "$OUT" \
    --recipe_args.retriever_url "$RETRIEVER_URL" \
    ${MODEL:+--model "$MODEL"} ${DATA:+--data.path "$DATA"} ${STEPS:+--num_steps "$STEPS"} "$@"
  exit
fi

"${launch[@]}" --recipe_args.retriever_url "$RETRIEVER_URL" "$@"
