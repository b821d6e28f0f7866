#!/usr/bin/env bash
# Runs Tandem's tests on CPU: sets up .venv (torch first, only if missing), then pytest.
#   bash scripts/test.sh            the fast tier: every test not marked slow (minutes)
#   bash scripts/test.sh --slow     the slow tier: SmolLM2 end-to-end runs, crash and restart
#                                   drills, launches on Ray, the GPU check on CPU
#   bash scripts/test.sh --all      both tiers in one run
# Further arguments go to pytest, e.g. bash scripts/test.sh -k buffer -x. CI runs the fast tier,
# then the slow one.
set -euo pipefail
cd "$(dirname "$0")/.."
tier=(-m "not slow")
case "${1:-}" in
  --slow) tier=(-m slow); shift ;;
  --all) tier=(); shift ;;
esac
bash scripts/setup.sh "${TANDEM_EXTRAS:-dev,math,code,dialogue,router,ray,models,logging,megatron,retriever,peers,lora,jobs}"
exec .venv/bin/python -m pytest -q "${tier[@]}" "$@"
