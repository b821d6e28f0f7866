#!/usr/bin/env bash
# From SFT to RL on the CPU default, one worked pipeline (docs/reference.md, "From SFT to RL"):
#   1. eval   the base model (SmolLM2-135M-Instruct) on the held-out arith2-12d problems
#   2. collect its answers to training problems, N_SAMPLES each, keeping the best correct one
#      per problem (rejection sampling: collect.min_reward 1)
#   3. sft    the model on those answers (their exact ids and loss masks)
#   4. eval   the SFT model
#   5. rl     GRPO from the SFT model for RL_STEPS steps (scripts/bench_learning.py: held-out
#             before and after, with a bootstrap interval)
# and prints the held-out accuracy after each stage. Every stage writes under OUT; a stage whose
# output exists is skipped, so the same command resumes.
#   bash scripts/sft_to_rl.sh                      # OUT=runs/sft_to_rl
#   COLLECT_PROMPTS=64 RL_STEPS=2 bash scripts/sft_to_rl.sh   # a quick pass
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-runs/sft_to_rl}"
PY="${PY:-.venv/bin/python}"
RECIPE=(--recipe math_solver_verifier --preset learn)
EVAL_PROMPTS="${EVAL_PROMPTS:-256}"
COLLECT_PROMPTS="${COLLECT_PROMPTS:-512}"
N_SAMPLES="${N_SAMPLES:-4}"
EPOCHS="${EPOCHS:-2}"
RL_STEPS="${RL_STEPS:-32}"
[ -x "$PY" ] || bash scripts/setup.sh dev,math,models
mkdir -p "$OUT"

stage() { echo; echo "== $1"; }
evaluate() {  # evaluate NAME [flags]: held-out accuracy into $OUT/eval_NAME/eval.json
  local name="$1"; shift
  [ -f "$OUT/eval_$name/eval.json" ] && { echo "(done: $OUT/eval_$name/eval.json)"; return; }
  "$PY" -m kernel eval "${RECIPE[@]}" --output_dir "$OUT/eval_$name" \
    --eval.max_prompts "$EVAL_PROMPTS" "$@"
}

stage "1. base model, held out"
evaluate base

stage "2. collect: $N_SAMPLES answers to each of $COLLECT_PROMPTS training problems, best correct"
"$PY" -m kernel collect "${RECIPE[@]}" --output_dir "$OUT/collect" \
  --collect.max_prompts "$COLLECT_PROMPTS" --collect.n_samples "$N_SAMPLES" \
  --collect.keep best --collect.min_reward 1
wc -l < "$OUT/collect/trajectories.jsonl" | xargs echo "kept answers:"

stage "3. sft on the kept answers, $EPOCHS epochs"
[ -d "$OUT/sft/model" ] || "$PY" -m kernel sft "${RECIPE[@]}" --output_dir "$OUT/sft" \
  --sft.path "$OUT/collect/trajectories.jsonl" --sft.epochs "$EPOCHS"

stage "4. sft model, held out"
evaluate sft --model "$OUT/sft/model"

stage "5. rl from the sft model, $RL_STEPS steps"
[ -f "$OUT/rl/learning.json" ] || "$PY" scripts/bench_learning.py --recipe math_solver_verifier \
  --steps "$RL_STEPS" --out "$OUT/rl" -- --model "$OUT/sft/model" \
  --eval.max_prompts "$EVAL_PROMPTS"

stage "summary: held-out accuracy of the solver (the learn preset's evaluation, $EVAL_PROMPTS problems)"
"$PY" - "$OUT" <<'EOF'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
def acc(path):
    row = json.loads(path.read_text())
    return next(v for k, v in row.items() if k.startswith("eval/solver/avg@"))
rl = json.loads((out / "rl" / "learning.json").read_text())
kept = sum(1 for _ in (out / "collect" / "trajectories.jsonl").open())
print(f"| stage | accuracy |\n|---|---|")
print(f"| base SmolLM2-135M-Instruct | {acc(out / 'eval_base' / 'eval.json'):.3f} |")
print(f"| + SFT on {kept} kept correct answers | {acc(out / 'eval_sft' / 'eval.json'):.3f} |")
print(f"| + RL ({rl['steps']} steps) | {rl['after']:.3f} (RL's own diff {rl['diff']:+.3f} "
      f"[{rl['ci_low']:+.3f}, {rl['ci_high']:+.3f}]) |")
EOF
