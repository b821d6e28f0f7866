#!/usr/bin/env bash
# The GPU path in one command, on a CUDA machine: torch and Megatron trainers for a few steps,
# engine-vs-trainer logprobs, the flattened_bucket payload over CUDA IPC, process-group weight
# sync (NCCL with two GPUs, gloo with one) and the weight-sync benchmark, then a summary table
# (scripts/gpu_check.py says what each check does). No model hub or internet needed. DEVICE=cpu
# runs the same checks on CPU.
#   bash scripts/gpu_check.sh            # DEVICE=cuda
#   DEVICE=cpu bash scripts/gpu_check.sh --skip sync_bench
# SYSTEM_PYTHON=1 uses the machine's own python3 (torch already there) instead of .venv, plus the
# wheels that scripts/gpu_bundle.sh put in .gpu_wheels/, installed offline into a temporary
# folder; Tandem is imported from this working tree. GPU_CHECK_OUT=DIR writes the table, a JSON
# of the results and the whole log there (the lent GPU machine: scripts/README.md).
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
if [ "${SYSTEM_PYTHON:-0}" = 1 ]; then
  python="${PYTHON:-python3}"
  site=$(mktemp -d "${TMPDIR:-/tmp}/gpu_check-site.XXXXXX")
  trap 'rm -rf "$site"' EXIT
  shopt -s nullglob
  wheels=(.gpu_wheels/*.whl)
  if [ ${#wheels[@]} -eq 0 ]; then
    echo "gpu_check: no wheels in .gpu_wheels/: run bash scripts/gpu_bundle.sh first" >&2
    exit 2
  fi
  "$python" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
    --disable-pip-version-check --target "$site" "${wheels[@]}"
  export PYTHONPATH="$PWD:$site${PYTHONPATH:+:$PYTHONPATH}"
else
  [ -x .venv/bin/python ] || bash scripts/setup.sh dev,models,megatron
  python=.venv/bin/python
fi
args=(scripts/gpu_check.py --device "${DEVICE:-cuda}")
if [ -n "${GPU_CHECK_OUT:-}" ]; then
  mkdir -p "$GPU_CHECK_OUT"
  "$python" "${args[@]}" --out "$GPU_CHECK_OUT" "$@" 2>&1 | tee "$GPU_CHECK_OUT/gpu_check.log"
else
  "$python" "${args[@]}" "$@"
fi
