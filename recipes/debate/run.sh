#!/usr/bin/env bash
# Launch debate. Everything is configured by environment variables.
#
#   MODE=cpu  (default) the embedded CPU default: SmolLM2-135M-Instruct debating itself (alice
#             and bob share one model, engine and trainer; presets/cpu.yaml).
#   MODE=gpu  one 8-GPU node (or more) through `kernel launch`: Ray places the plan's trainer
#             ranks (Megatron-core by default) and SGLang servers behind sglang-router on their
#             GPUs and ports, then trains; it stops what it started. One model plays both
#             debaters (self-play), as on CPU.
#
#   MODEL (smollm2 | HF path), DATA (jsonl/parquet), STEPS, OUT
#   MODE=gpu: BACKEND (megatron | torch), TP, PP (the trainer's tensor/pipeline-parallel sizes),
#     ENGINE_TP (GPUs per SGLang server, 1), GPUS (per node, 8), NODES (1), TRAIN_GPUS (half),
#     RAY_ADDRESS (local); DRY_RUN=1 prints and validates the plan and stops (DRY_RUN=json: as
#     JSON).
#   Extra arguments go to `kernel train` / `kernel launch`.
set -euo pipefail
cd "$(dirname "$0")/../.."
MODE="${MODE:-cpu}"
OUT="${OUT:-runs/debate-$(date +%Y%m%d-%H%M%S)}"
PY="${PY:-.venv/bin/python}"
[ -x "$PY" ] || { bash scripts/setup.sh dev,math,models,megatron,router,ray; }

if [ "$MODE" = cpu ]; then
  exec "$PY" -m kernel train --recipe debate --preset cpu --output_dir "$OUT" \
    ${MODEL:+--model "$MODEL"} ${DATA:+--data.path "$DATA"} ${STEPS:+--num_steps "$STEPS"} "$@"
fi

[ "$MODE" = gpu ] || { echo "MODE must be cpu or gpu, got '$MODE'" >&2; exit 2; }
MODEL="${MODEL:?set MODEL to an HF checkpoint path for MODE=gpu}"
GPUS="${GPUS:-8}" NODES="${NODES:-1}"
train=${TRAIN_GPUS:-$((GPUS * NODES / 2))}
# alice's spec places the one model (bob shares it): settings over the preset's spec
agent=(--agent "alice.backend=${BACKEND:-megatron}" --agent "alice.resources={train_gpus: $train,
  infer_gpus: $((GPUS * NODES - train)), engine_tensor_parallel: ${ENGINE_TP:-1}}")
# the Megatron trainer's parallel sizes (its trainer section: the one place they are set)
[ "${BACKEND:-megatron}" = megatron ] &&
  agent+=(--agent "alice.trainer={tensor_parallel: ${TP:-1}, pipeline_parallel: ${PP:-1}}")
dry=()
case "${DRY_RUN:-}" in
  "") ;;
  json) dry=(--dry-run --json) ;;
  *) dry=(--dry-run) ;;
esac
exec "$PY" -m kernel launch --recipe debate --preset cpu --model "$MODEL" \
  --output_dir "$OUT" "${agent[@]}" --cluster.nodes "$NODES" --cluster.gpus_per_node "$GPUS" \
  ${RAY_ADDRESS:+--cluster.address "$RAY_ADDRESS"} --optim.dtype bfloat16 \
  ${DATA:+--data.path "$DATA"} ${STEPS:+--num_steps "$STEPS"} "${dry[@]}" "$@"
