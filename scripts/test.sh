#!/usr/bin/env bash
# Runs Tandem's tests on CPU: sets up .venv (torch first, only if missing), then pytest.
#   bash scripts/test.sh            the fast tier: every test not marked slow (minutes)
#   bash scripts/test.sh --slow     the slow tier: SmolLM2 end-to-end runs, crash and restart
#                                   drills, launches on Ray, the GPU check on CPU
#   bash scripts/test.sh --all      both tiers in one run
# Further arguments go to pytest, e.g. bash scripts/test.sh -k buffer -x. CI runs the fast tier,
# then the slow one.
# Tests run in parallel (pytest-xdist): one worker per core, at most 4 and one per 10 GiB of
# memory (a SmolLM2 two-agent run holds ~6 GiB), each with its share of the cores as torch
# threads. TANDEM_TEST_WORKERS=N sets the count; 1 runs them one after another in this process.
set -euo pipefail
cd "$(dirname "$0")/.."
tier=(-m "not slow")
case "${1:-}" in
  --slow) tier=(-m slow); shift ;;
  --all) tier=(); shift ;;
esac
bash scripts/setup.sh "${TANDEM_EXTRAS:-dev,math,code,dialogue,router,ray,models,logging,megatron,retriever,peers,lora,jobs,gateway}"
cores=$(nproc)
mem_gib=$(awk '/MemTotal/ {print int($2 / 1048576)}' /proc/meminfo)
auto=$(( cores < 4 ? cores : 4 ))
auto=$(( auto < mem_gib / 10 ? auto : mem_gib / 10 ))
workers=${TANDEM_TEST_WORKERS:-$(( auto > 1 ? auto : 1 ))}
parallel=()
if [ "$workers" -gt 1 ]; then
  parallel=(-n "$workers")
  export OMP_NUM_THREADS="${OMP_NUM_THREADS:-$(( cores / workers > 1 ? cores / workers : 1 ))}"
fi
exec .venv/bin/python -m pytest -q "${tier[@]}" "${parallel[@]}" "$@"
