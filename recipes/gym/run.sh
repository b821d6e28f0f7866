#!/usr/bin/env bash
# Launch gym. Everything is configured by environment variables.
#
#   MODE=cpu     (default) SmolLM2-135M-Instruct on the embedded engine, its environments played
#                in this process (PRESET: tools (default), mix, tiny_mix).
#   MODE=remote  the same run with its environments on an environment server this script starts
#                (`python -m kernel env serve`, log in $OUT/env_server.log) and stops at the end;
#                ENV_URL names one you run instead.
#   MODE=gpu     one 8-GPU node (or more) through `kernel launch` (Megatron-core trains, SGLang
#                serves behind sglang-router); the environments stay in the driver's process.
#
#   PRESET, MODEL (smollm2 | HF path), DATA, STEPS, OUT; MODE=remote: ENV_URL, ENV_PORT (8300);
#   MODE=gpu: BACKEND, TP, PP, GPUS, NODES, TRAIN_GPUS, RAY_ADDRESS, DRY_RUN (1 | json).
#   Extra arguments go to `kernel train` / `kernel launch`.
set -euo pipefail
cd "$(dirname "$0")/../.."
MODE="${MODE:-cpu}" PRESET="${PRESET:-tools}"
OUT="${OUT:-runs/gym-$(date +%Y%m%d-%H%M%S)}"
PY="${PY:-.venv/bin/python}"
[ -x "$PY" ] || { bash scripts/setup.sh dev,math,code,models,megatron,router,ray; }
common=(--recipe gym --preset "$PRESET" --output_dir "$OUT" ${MODEL:+--model "$MODEL"}
  ${DATA:+--data.path "$DATA"} ${STEPS:+--num_steps "$STEPS"})

case "$MODE" in
  cpu) exec "$PY" -m kernel train "${common[@]}" "$@" ;;
  remote)
    # the preset's environments, each pointed at the server (which hosts them with their args)
    mapfile -t hosted < <("$PY" -m kernel config --recipe gym --preset "$PRESET" |
      "$PY" -c 'import sys, yaml, json
envs = yaml.safe_load(sys.stdin)["environments"]
print(",".join(envs)); print(json.dumps({k: v.get("args", {}) for k, v in envs.items()}))')
    url="${ENV_URL:-}"
    if [ -z "$url" ]; then
      mkdir -p "$OUT"
      port="${ENV_PORT:-8300}" url="http://127.0.0.1:${ENV_PORT:-8300}"
      "$PY" -m kernel env serve --environments "${hosted[0]}" --env_args "${hosted[1]}" \
        --port "$port" > "$OUT/env_server.log" 2>&1 &
      server=$!
      trap 'kill "$server" 2> /dev/null' EXIT
      for _ in $(seq 60); do curl -sf "$url/health" > /dev/null && break; sleep 1; done
    fi
    remote=$("$PY" -c 'import sys, json
print(json.dumps({n: {"url": sys.argv[2]} for n in sys.argv[1].split(",")}))' "${hosted[0]}" "$url")
    "$PY" -m kernel train "${common[@]}" --environments "$remote" "$@" ;;
  gpu)
    MODEL="${MODEL:?set MODEL to an HF checkpoint path for MODE=gpu}"
    GPUS="${GPUS:-8}" NODES="${NODES:-1}"
    train=${TRAIN_GPUS:-$((GPUS * NODES / 2))}
    agent=(--agent "default.backend=${BACKEND:-megatron}"
      --agent "default.resources={train_gpus: $train, infer_gpus: $((GPUS * NODES - train))}")
    [ "${BACKEND:-megatron}" = megatron ] &&
      agent+=(--agent "default.trainer={tensor_parallel: ${TP:-1}, pipeline_parallel: ${PP:-1}}")
    dry=()
    case "${DRY_RUN:-}" in "") ;; json) dry=(--dry-run --json) ;; *) dry=(--dry-run) ;; esac
    exec "$PY" -m kernel launch "${common[@]}" "${agent[@]}" --cluster.nodes "$NODES" \
      --cluster.gpus_per_node "$GPUS" ${RAY_ADDRESS:+--cluster.address "$RAY_ADDRESS"} \
      --optim.dtype bfloat16 "${dry[@]}" "$@" ;;
  *) echo "MODE must be cpu, remote or gpu, got '$MODE'" >&2; exit 2 ;;
esac
