#!/usr/bin/env bash
# Launch math_solver_verifier. Everything is configured by environment variables.
#
#   MODE=cpu  (default) the embedded CPU default: SmolLM2-135M-Instruct on an embedded engine.
#   MODE=gpu  one 8-GPU node (or more) through `kernel launch`: Ray places everything the plan
#             says -- the trainer's ranks (Megatron-core by default) and SGLang servers behind
#             sglang-router on their GPUs and ports -- then trains; it stops what it started.
#
#   MODEL (smollm2 | HF path), DATA (jsonl/parquet/HF name), STEPS, OUT
#   MODE=gpu:
#     PLACEMENT  split (default): TRAIN_GPUS train, the other GPUs serve; NCCL broadcast sync
#                colocate: every GPU trains and serves; SGLang releases its memory for each
#                training step; weights by tensor. Refused on real SGLang for now: its
#                colocated sync takes CUDA-IPC handles, which Tandem does not send yet
#     BACKEND    megatron (default) | torch;  TP, PP: the trainer's tensor/pipeline-parallel
#                sizes (1, 1; data parallel is the rest);  ENGINE_TP: GPUs per SGLang server (1)
#     GPUS (per node, 8), NODES (1), TRAIN_GPUS (split: GPUS*NODES/2), RAY_ADDRESS (local)
#     DRY_RUN=1 prints and validates the plan and stops (DRY_RUN=json: the plan as JSON)
#   Extra arguments go to `kernel train` / `kernel launch`.
set -euo pipefail
cd "$(dirname "$0")/../.."
MODE="${MODE:-cpu}"
OUT="${OUT:-runs/math-$(date +%Y%m%d-%H%M%S)}"
PY="${PY:-.venv/bin/python}"
[ -x "$PY" ] || { bash scripts/setup.sh dev,math,models,megatron,router,ray; }

if [ "$MODE" = cpu ]; then
  exec "$PY" -m kernel train --recipe math_solver_verifier --preset cpu --output_dir "$OUT" \
    ${MODEL:+--model "$MODEL"} ${DATA:+--data.path "$DATA"} ${STEPS:+--num_steps "$STEPS"} "$@"
fi

[ "$MODE" = gpu ] || { echo "MODE must be cpu or gpu, got '$MODE'" >&2; exit 2; }
MODEL="${MODEL:?set MODEL to an HF checkpoint path for MODE=gpu}"
GPUS="${GPUS:-8}" NODES="${NODES:-1}"
case "${PLACEMENT:-split}" in
  split)
    train=${TRAIN_GPUS:-$((GPUS * NODES / 2))}
    resources="train_gpus: $train, infer_gpus: $((GPUS * NODES - train))" ;;
  colocate) resources="train_gpus: $((GPUS * NODES)), colocate: true" ;;
  *) echo "PLACEMENT must be split or colocate, got '$PLACEMENT'" >&2; exit 2 ;;
esac
# One model plays every role: the solver's spec places it (settings over the preset's spec),
# the other roles share it.
agent=(--agent "solver.backend=${BACKEND:-megatron}"
  --agent "solver.resources={$resources, engine_tensor_parallel: ${ENGINE_TP:-1}}")
# the Megatron trainer's parallel sizes (its trainer section: the one place they are set)
[ "${BACKEND:-megatron}" = megatron ] &&
  agent+=(--agent "solver.trainer={tensor_parallel: ${TP:-1}, pipeline_parallel: ${PP:-1}}")
dry=()
case "${DRY_RUN:-}" in
  "") ;;
  json) dry=(--dry-run --json) ;;
  *) dry=(--dry-run) ;;
esac
# The plan is validated before anything starts; without DRY_RUN it then runs on Ray.
exec "$PY" -m kernel launch --recipe math_solver_verifier --preset cpu --model "$MODEL" \
  --output_dir "$OUT" "${agent[@]}" --cluster.nodes "$NODES" --cluster.gpus_per_node "$GPUS" \
  ${RAY_ADDRESS:+--cluster.address "$RAY_ADDRESS"} --optim.dtype bfloat16 \
  ${DATA:+--data.path "$DATA"} ${STEPS:+--num_steps "$STEPS"} "${dry[@]}" "$@"
