#!/usr/bin/env bash
# README command (1): the main job on the embedded CPU default. Sets up .venv, then runs it.
# Today that is `python -m kernel demo` (a tiny model learns a toy task in-process through the
# kernel's buffer, reward, advantages and loss); it becomes a recipe's CPU preset once the
# training loop with engines and weight sync lands. Extra arguments go to the command.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh "${TANDEM_EXTRAS:-dev,math,router,models}"
exec .venv/bin/python -m kernel demo "$@"
