#!/usr/bin/env bash
# README command (1): the main job on the embedded CPU default. Sets up .venv, then runs it.
# Today that is the kernel's toy task through the full path (an embedded engine serves a tiny
# model built from a config; generate -> reward -> advantages -> train -> weight sync); it
# becomes a recipe's CPU preset once a recipe lands. Extra arguments go to `kernel train`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh "${TANDEM_EXTRAS:-dev,math,router,models,logging}"
exec .venv/bin/python -m kernel train --preset toy \
  --output_dir "runs/toy-$(date +%Y%m%d-%H%M%S)" "$@"
