#!/usr/bin/env bash
# Downloads into .gpu_wheels/ (ignored) the wheels that scripts/gpu_check.py needs and the lent
# GPU machine lacks, for its Python 3.12 on x86-64 Linux: that machine has no network, and its
# python3 already holds torch, numpy, safetensors, huggingface-hub, tokenizers, aiohttp, httpx,
# rich, PyYAML, matplotlib, triton, packaging, anyio, click, h11, pyarrow, pandas, xxhash and
# fsspec (the device tool's KINDS.md lists them). `SYSTEM_PYTHON=1 bash scripts/gpu_check.sh`
# installs these there, offline (scripts/README.md). The versions are those .venv tests with.
# typing-extensions is there too, but pydantic needs >= 4.16 and that machine's version was
# never read: the copy here shadows it. The working tree and the wheels travel together, 64 MiB
# at most: this prints both sizes.
#   bash scripts/gpu_bundle.sh
set -euo pipefail
cd "$(dirname "$0")/.."
dest=.gpu_wheels
wheels=(
  # That machine's transformers (5.17) slices logits with a 1-D logits_to_keep only; the torch
  # trainer passes a 2-D one (transformers' slice_logits_to_keep, 5.21 and later). This copy
  # shadows it; its requirements (huggingface-hub, tokenizers, safetensors) are met there.
  "transformers==5.24.0"
  "megatron-core==0.19.2"         # the megatron check; cp312 wheel, one small C++ extension
  "jsonargparse==4.53.0"          # kernel's CLI, with its [signatures] extra:
  "docstring-parser==0.18.0"
  "typeshed-client==2.15.0"
  "pydantic==2.14.4"              # config validation, the engine's request models
  "pydantic-core==2.50.5"         # cp312 manylinux wheel
  "annotated-types==0.8.0"
  "typing-inspection==0.4.5"
  "typing-extensions==4.16.0"
  "fastapi==0.165.0"              # the embedded engine
  "starlette==1.10.0"
  "opentelemetry-api==1.45.2"     # a requirement of this fastapi
  "uvicorn==0.54.0"
  "tenacity==9.2.1"               # the engine client's retries
  "datasets==5.2.0"               # the prompt buffer reads its JSONL file with it
  "dill==0.4.1"
  "multiprocess==0.70.19"
)
rm -rf "$dest"
mkdir -p "$dest"
platforms=()
for p in manylinux_2_28_x86_64 manylinux_2_24_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64; do
  platforms+=(--platform "$p")
done
"${PYTHON:-python3}" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp "${platforms[@]}" \
  -d "$dest" "${wheels[@]}" 2> >(grep -v "^WARNING: Location" >&2)

mib() { awk '{printf "%.1f MiB", $1 / 1048576}'; }
bundle=$(cat "$dest"/*.whl | wc -c)
# Tracked files, and untracked ones that git does not ignore (what the device tool sends).
tree=$( (git ls-files -z; git ls-files -z --others --exclude-standard) \
  | xargs -0 -r cat -- 2>/dev/null | wc -c || true)
ls -1 "$dest"
echo "[gpu_bundle] $(ls "$dest"/*.whl | wc -l) wheels, $(mib <<<"$bundle") in $dest;" \
  "working tree $(mib <<<"$tree"); together $(mib <<<"$((bundle + tree))") of the 64 MiB"
if ((bundle > 50 * 1048576)); then
  echo "[gpu_bundle] over 50 MiB: leave room for the working tree" >&2
  exit 1
fi
