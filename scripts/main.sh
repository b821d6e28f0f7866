#!/usr/bin/env bash
# README command (1): the main job on the embedded CPU default. Sets up .venv, then runs it.
# Two agents, two models, trained together through the full path: a doctor and a patient, each
# a tiny model built from a config, each served by its own embedded SGLang-compatible engine
# and trained by its own trainer (generate -> bilateral reward -> advantages per agent ->
# train -> weight sync per model). About a minute on 2 cores; extra arguments go to
# `kernel train` (e.g. --num_steps 80). The recipes' CPU presets (SmolLM2-135M) run with
# `python -m kernel train --recipe <name> --preset cpu`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh "${TANDEM_EXTRAS:-dev,math,dialogue,router,models,logging}"
exec .venv/bin/python -m kernel train --preset toy_duo \
  --output_dir "runs/toy_duo-$(date +%Y%m%d-%H%M%S)" "$@"
