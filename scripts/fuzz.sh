#!/usr/bin/env bash
# The long mode of the fuzz suite (issue 21): the property-based fuzz of the embedded engine
# and the retriever with many more generated bodies than CI's 150 per endpoint, plus the
# hostile-request regression tests. Usage: scripts/fuzz.sh [EXAMPLES] [pytest args...]
#   scripts/fuzz.sh            # 5000 bodies per endpoint (about 20 minutes on 2 cores)
#   scripts/fuzz.sh 20000 -x
set -euo pipefail
cd "$(dirname "$0")/.."
examples="${1:-5000}"
shift || true
export TANDEM_FUZZ_EXAMPLES="$examples"
exec .venv/bin/python -m pytest -q -s "$@" tests/engine/test_engine_fuzz.py \
  tests/engine/test_engine_edge.py tests/retrieval/test_retriever_fuzz.py
