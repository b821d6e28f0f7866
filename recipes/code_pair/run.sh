#!/usr/bin/env bash
# Launch code_pair: a helper agent and a main agent write HumanEval functions together, each its
# OWN model, rewarded by running HumanEval's checks in the sandbox (kernel/sandbox.py).
# Everything is configured by environment variables.
#
#   MODE=cpu  (default) the embedded CPU default: two SmolLM2-135M-Instruct copies, one embedded
#             engine and one torch trainer each (presets/cpu.yaml).
#   MODE=gpu  one 8-GPU node (or more) through `kernel launch`: per agent, its trainer's ranks
#             (Megatron-core by default) and SGLang servers behind its own sglang-router on the
#             GPUs and ports the plan gives it, NCCL weight sync; it stops what it started.
#
#   cpu: ESTIMATOR (magrpo | marloo | ...), STEPS, OUT; extra arguments go to `kernel train`.
#   gpu: HELPER_MODEL, MAIN_MODEL (HF checkpoint paths, e.g. a Qwen2.5-Coder), BACKEND (megatron
#        | torch), TP, PP, GPUS (per node, 8), NODES (1), RAY_ADDRESS, ESTIMATOR, STEPS, OUT;
#        DRY_RUN=1 prints and validates the plan and stops (DRY_RUN=json: as JSON).
#   Extra arguments go to `kernel train` / `kernel launch`.
set -euo pipefail
cd "$(dirname "$0")/../.."
MODE="${MODE:-cpu}"
OUT="${OUT:-runs/code_pair-$(date +%Y%m%d-%H%M%S)}"
PY="${PY:-.venv/bin/python}"
[ -x "$PY" ] || { bash scripts/setup.sh dev,code,models,megatron,router,ray; }

if [ "$MODE" = cpu ]; then
  exec "$PY" -m kernel train --recipe code_pair --preset cpu --output_dir "$OUT" \
    ${ESTIMATOR:+--advantage.estimator "$ESTIMATOR"} ${STEPS:+--num_steps "$STEPS"} "$@"
fi

[ "$MODE" = gpu ] || { echo "MODE must be cpu or gpu, got '$MODE'" >&2; exit 2; }
HELPER_MODEL="${HELPER_MODEL:?set HELPER_MODEL to an HF checkpoint path for MODE=gpu}"
MAIN_MODEL="${MAIN_MODEL:?set MAIN_MODEL to an HF checkpoint path for MODE=gpu}"

# each agent its own model, placed by the plan (an even share): settings over the preset's specs
agent=()
for a in "helper=$HELPER_MODEL" "main=$MAIN_MODEL"; do
  name=${a%%=*}
  agent+=(--agent "$name.model=${a#*=}" --agent "$name.backend=${BACKEND:-megatron}")
  [ "${BACKEND:-megatron}" = megatron ] &&
    agent+=(--agent "$name.trainer={tensor_parallel: ${TP:-1}, pipeline_parallel: ${PP:-1}}")
done
dry=()
case "${DRY_RUN:-}" in
  "") ;;
  json) dry=(--dry-run --json) ;;
  *) dry=(--dry-run) ;;
esac
exec "$PY" -m kernel launch --recipe code_pair --preset cpu --model "$HELPER_MODEL" \
  --output_dir "$OUT" "${agent[@]}" --cluster.nodes "${NODES:-1}" \
  --cluster.gpus_per_node "${GPUS:-8}" ${RAY_ADDRESS:+--cluster.address "$RAY_ADDRESS"} \
  --optim.dtype bfloat16 --rollout.max_response_len 512 --rollout.max_context_len 2048 \
  --recipe_args '{"sandbox": {"concurrency": 16}}' \
  ${ESTIMATOR:+--advantage.estimator "$ESTIMATOR"} ${STEPS:+--num_steps "$STEPS"} \
  "${dry[@]}" "$@"
