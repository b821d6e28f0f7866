"""code_pair's reward: the program the agents wrote, run in the kernel's sandbox and judged
against the problem's checks in this process, on plain data (checks.py: the program never
holds an expected value), with CoMLRL-style partial credit (``RecipeConfig`` holds every
amount).

Pair (the helper writes ``aux``, main writes the entry point)::

    define_helper  if the helper's code defines aux and returns a value
  + define_main    if main's code defines the entry point and returns a value (else: stop here)
  + parses         if the prompt's context + aux + entry point parse together (else: stop)
  + tests * (checks passed / checks)
  + uses_helper    if some check passed and main calls aux
  + not_wrapper    ... and main is more than ``return aux(...)``
  - drops_helper_result  if main calls aux and throws the result away

Both agents get that one team reward (MAGRPO / MARLOO take it from there). Single (one coder,
test feedback): define_main + parses + tests * share, of its last try.

Every outcome is a scored sample with a status, never an error in the rollout: ``missing``
(no entry point), ``syntax_error`` (the reply's code does not parse), and the sandbox's
``passed``, ``failed``, ``timeout``, ``memory``, ``output_limit``, ``crashed``. The
``metadata["metrics"]`` of the main (or coder) sample carry ``status_<status>`` (1 for its
status), ``checks_passed`` (share) and each credit earned, so the step's metrics count them;
``metadata["correct"]`` is every check passing.
"""

from __future__ import annotations

from dataclasses import dataclass

from kernel.hooks import RolloutContext
from kernel.sample import Sample
from kernel.sandbox import STATUSES
from recipes.code_pair import checks, code
from recipes.code_pair.config import CODER, HELPER, MAIN, RecipeConfig, as_config

STATUS_NAMES = ("missing", *STATUSES)


@dataclass
class Outcome:
    """One program's run: its status, checks passed and total, first error, credits."""

    status: str
    passed: int = 0
    total: int = 0
    error: str | None = None
    terms: dict[str, float] | None = None

    @property
    def share(self) -> float:
        return self.passed / self.total if self.total else 0.0

    @property
    def reward(self) -> float:
        return sum((self.terms or {}).values())

    def metrics(self) -> dict[str, float]:
        out = {f"status_{s}": float(s == self.status) for s in STATUS_NAMES}
        return out | {"checks_passed": self.share} | (self.terms or {})


async def run_program(
    cfg: RecipeConfig, problem: str, tests: str, entry_point: str, parts: list[str]
) -> tuple[str, int, int, str | None]:
    """Run the prompt's context (imports, the functions it gives) + ``parts`` in the sandbox
    against the problem's checks, judged in this process (checks.py): (status, passed, total,
    first error)."""
    plan = await checks.plan_for(cfg, problem, tests, entry_point)
    program = "\n\n".join(p for p in (code.context_of(problem, entry_point), *parts) if p)
    if code.parse(program) is None:
        return "syntax_error", 0, plan.total, "the program does not parse"
    judged = await checks.run_checks(cfg, program, entry_point, plan)
    return judged.status, judged.passed, judged.total, judged.error


def _entry(reply: str, entry_point: str) -> tuple[str, str | None]:
    """The entry point's source in a reply, or the status of its absence: ``syntax_error``
    (the reply's code defines something but does not parse) or ``missing`` (no such function
    returning a value; prose without a ``def`` is missing, not a syntax error)."""
    written = code.extract_code(reply)
    if code.parse(written) is None:
        return "", "syntax_error" if "def " in written else "missing"
    body = code.find_function(written, entry_point)
    if body is None or not code.returns_something(body):
        return "", "missing"
    return body, None


async def score_pair(
    cfg: RecipeConfig, problem: str, tests: str, entry_point: str, helper: str, main: str
) -> Outcome:
    """The pair's team reward (module docstring) for the helper's and main's replies."""
    aux = code.find_function(code.extract_code(helper), cfg.helper_name)
    terms = {"define_helper": cfg.define_helper if aux and code.returns_something(aux) else 0.0}
    body, failed = _entry(main, entry_point)
    if failed:
        return Outcome(failed, terms=terms | {"define_main": 0.0})
    terms["define_main"] = cfg.define_main
    status, passed, total, error = await run_program(
        cfg, problem, tests, entry_point, [aux or "", body]
    )
    out = Outcome(status, passed, total, error, terms)
    if status == "syntax_error":
        return out
    terms["parses"] = cfg.parses
    terms["tests"] = cfg.tests * out.share
    uses = aux is not None and code.calls(body, cfg.helper_name)
    terms["uses_helper"] = cfg.uses_helper if uses and passed else 0.0
    wrapper = code.is_wrapper(body, cfg.helper_name)
    terms["not_wrapper"] = cfg.not_wrapper if uses and passed and not wrapper else 0.0
    dropped = uses and code.drops_result(body, cfg.helper_name)
    terms["drops_helper_result"] = -cfg.drops_helper_result if dropped else 0.0
    return out


async def score_single(
    cfg: RecipeConfig, problem: str, tests: str, entry_point: str, reply: str
) -> Outcome:
    """One coder's reply: define_main + parses + tests * share."""
    body, failed = _entry(reply, entry_point)
    if failed:
        return Outcome(failed, terms={"define_main": 0.0})
    terms = {"define_main": cfg.define_main}
    status, passed, total, error = await run_program(cfg, problem, tests, entry_point, [body])
    if status != "syntax_error":
        terms |= {"parses": cfg.parses, "tests": cfg.tests * passed / total if total else 0.0}
    return Outcome(status, passed, total, error, terms)


def problem_of(sample: Sample) -> tuple[str, str, str]:
    """(problem prompt, test code, entry point) of a data row's sample."""
    entry = sample.metadata.get("entry_point")
    if not isinstance(entry, str) or not isinstance(sample.label, str):
        raise ValueError(
            f"sample {sample.key}: code_pair needs the test code as label and "
            "metadata['entry_point'] (data.metadata_keys: [entry_point])"
        )
    return str(sample.prompt), sample.label, entry


async def reward(ctx: RolloutContext, samples: list[Sample]) -> dict[str, float | None]:
    """The recipe's reward hook: the pair's team reward to both agents, or the coder's own
    (its last try was already run by generate: ``metadata["outcome"]``)."""
    cfg = as_config(ctx.config)
    by_agent = {s.agent: s for s in samples}
    if cfg.workflow == "single":
        coder = by_agent[CODER]
        outcome: Outcome = coder.metadata.pop("outcome")
        carrier, rewards = coder, {CODER: outcome.reward}
    else:
        carrier = by_agent.get(MAIN) or by_agent[HELPER]
        problem, tests, entry = problem_of(carrier)
        helper_text = by_agent[HELPER].metadata["text"] if HELPER in by_agent else ""
        main_text = by_agent[MAIN].metadata["text"] if MAIN in by_agent else ""
        outcome = await score_pair(cfg, problem, tests, entry, helper_text, main_text)
        rewards = {HELPER: outcome.reward, MAIN: outcome.reward}
    carrier.metadata.setdefault("metrics", {}).update(outcome.metrics())
    for s in samples:
        s.metadata["correct"] = outcome.total > 0 and outcome.passed == outcome.total
        s.metadata["status"] = outcome.status
    return rewards
