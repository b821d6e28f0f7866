#!/usr/bin/env bash
# From SFT to RL on the CPU default, one worked pipeline (docs/reference.md, "From SFT to RL"):
#   1. eval   the base model (SmolLM2-135M-Instruct) on the held-out arith2-12d problems
#   2. collect its answers to training problems, N_SAMPLES each, keeping the best correct one
#      per problem (rejection sampling: collect.min_reward 1)
#   3. sft    the model on those answers (their exact ids and loss masks)
#   4. eval   the SFT model
#   5. rl     GRPO from the SFT model for RL_STEPS steps, SEEDS seeds (scripts/bench_learning.py:
#             held-out before and after, with a bootstrap interval)
# and prints the held-out accuracy after each stage. Every stage writes under OUT; a stage whose
# output exists is skipped, so the same command resumes. Another recipe's preset goes the same
# way (RECIPE, PRESET; AGENT: the agent whose accuracy is printed, whose answers are kept):
#   bash scripts/sft_to_rl.sh                      # OUT=runs/sft_to_rl
#   COLLECT_PROMPTS=64 RL_STEPS=2 bash scripts/sft_to_rl.sh   # a quick pass
#   RECIPE=gym PRESET=tools AGENT=default OUT=runs/sft_to_rl_gym bash scripts/sft_to_rl.sh
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-runs/sft_to_rl}"
PY="${PY:-.venv/bin/python}"
RECIPE="${RECIPE:-math_solver_verifier}"
PRESET="${PRESET:-learn}"
AGENT="${AGENT:-solver}"
RUN=(--recipe "$RECIPE" --preset "$PRESET")
EVAL_PROMPTS="${EVAL_PROMPTS:-256}"
COLLECT_PROMPTS="${COLLECT_PROMPTS:-512}"
N_SAMPLES="${N_SAMPLES:-4}"
EPOCHS="${EPOCHS:-2}"
RL_STEPS="${RL_STEPS:-32}"
SEEDS="${SEEDS:-1}"
[ -x "$PY" ] || bash scripts/setup.sh dev,math,models
mkdir -p "$OUT"

stage() { echo; echo "== $1"; }
evaluate() {  # evaluate NAME [flags]: held-out accuracy into $OUT/eval_NAME/eval.json
  local name="$1"; shift
  [ -f "$OUT/eval_$name/eval.json" ] && { echo "(done: $OUT/eval_$name/eval.json)"; return; }
  "$PY" -m kernel eval "${RUN[@]}" --output_dir "$OUT/eval_$name" \
    --eval.max_prompts "$EVAL_PROMPTS" "$@"
}

stage "1. base model, held out"
evaluate base

stage "2. collect: $N_SAMPLES answers to each of $COLLECT_PROMPTS training problems, best correct"
"$PY" -m kernel collect "${RUN[@]}" --output_dir "$OUT/collect" \
  --collect.max_prompts "$COLLECT_PROMPTS" --collect.n_samples "$N_SAMPLES" \
  --collect.keep best --collect.min_reward 1 --collect.agents "[$AGENT]"
KEPT=$(wc -l < "$OUT/collect/trajectories.jsonl")
echo "kept answers: $KEPT"
[ "$KEPT" -gt 0 ] || { echo "no rolled-out answer was right: raise COLLECT_PROMPTS or N_SAMPLES" >&2; exit 1; }

stage "3. sft on the kept answers, $EPOCHS epochs"
[ -d "$OUT/sft/model" ] || "$PY" -m kernel sft "${RUN[@]}" --output_dir "$OUT/sft" \
  --sft.path "$OUT/collect/trajectories.jsonl" --sft.agent "$AGENT" --sft.epochs "$EPOCHS"

stage "4. sft model, held out"
evaluate sft --model "$OUT/sft/model"

stage "5. rl from the sft model, $RL_STEPS steps, $SEEDS seed(s)"
[ -f "$OUT/rl/learning.json" ] || "$PY" scripts/bench_learning.py "${RUN[@]}" \
  --steps "$RL_STEPS" --seeds "$SEEDS" --out "$OUT/rl" -- --model "$OUT/sft/model" \
  --eval.max_prompts "$EVAL_PROMPTS"

stage "summary: held-out accuracy of $AGENT ($RECIPE $PRESET's evaluation, $EVAL_PROMPTS items)"
"$PY" - "$OUT" "$AGENT" "$KEPT" <<'EOF' | tee "$OUT/summary.md"
import json, sys
from pathlib import Path
from scripts.bench_learning import item_scores
out, agent, kept = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
def acc(stage):  # right answers (`passed`, not the mean reward), as bench_learning scores them
    passed = item_scores(out / stage / "eval" / "step_0.jsonl")[agent]["passed"]
    return sum(passed.values()) / len(passed)
rl = json.loads((out / "rl" / "learning.json").read_text())
print(f"| stage | accuracy |\n|---|---|")
print(f"| base SmolLM2-135M-Instruct | {acc('eval_base'):.3f} |")
print(f"| + SFT on {kept} kept correct answers | {acc('eval_sft'):.3f} |")
print(f"| + RL ({rl['steps']} steps) | {rl['after']:.3f} (RL's own diff {rl['diff']:+.3f} "
      f"[{rl['ci_low']:+.3f}, {rl['ci_high']:+.3f}]) |")
EOF
