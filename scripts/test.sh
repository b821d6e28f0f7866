#!/usr/bin/env bash
# Runs Tandem's test suite on CPU: sets up .venv (torch first, only if missing), then pytest.
# Extra arguments go to pytest, e.g. scripts/test.sh -k buffer -x.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh "${TANDEM_EXTRAS:-dev,math,code,dialogue,router,ray,models,logging,megatron,retriever,peers}"
exec .venv/bin/python -m pytest -q "$@"
