#!/usr/bin/env bash
# The GPU path in one command, on a CUDA machine: torch and Megatron trainers for a few steps,
# engine-vs-trainer logprobs, the flattened_bucket payload over CUDA IPC, NCCL weight sync and
# the weight-sync benchmark, then a summary table (scripts/gpu_check.py says what each check
# does). No model hub or internet needed. DEVICE=cpu runs the same checks on CPU.
#   bash scripts/gpu_check.sh            # DEVICE=cuda
#   DEVICE=cpu bash scripts/gpu_check.sh --skip sync_bench
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || bash scripts/setup.sh dev,models,megatron
exec .venv/bin/python scripts/gpu_check.py --device "${DEVICE:-cuda}" "$@"
