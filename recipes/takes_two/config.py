"""The recipe's settings (``recipe_args`` in a preset or ``--recipe_args '{...}'``): the game's
length, the text-similarity metric, every reward weight and penalty, and the optional judge.

The judge's endpoint is NOT configured here but by environment variables (so secrets stay out
of presets and logs): ``TANDEM_JUDGE_URL`` (an OpenAI-compatible base URL, e.g.
``http://127.0.0.1:8000/v1``; unset: no judge), ``TANDEM_JUDGE_MODEL`` (the model name sent in
the request; default ``judge``), ``TANDEM_JUDGE_API_KEY`` (sent as a Bearer token; optional).
A ``user:password@`` in the URL is sent as basic auth only when no API key is set (a request has
one Authorization header: the key wins); logs show the password as ``***``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields

from rapidfuzz import fuzz

from kernel.hooks import recipe_config

SIMILARITY_METRICS = (
    "ratio",
    "partial_ratio",
    "token_sort_ratio",
    "token_set_ratio",
    "partial_token_sort_ratio",
    "partial_token_set_ratio",
    "WRatio",
    "QRatio",
)
"""rapidfuzz.fuzz scorers a config may name (all return 0..100)"""

DOCTOR = "doctor"
PATIENT = "patient"


@dataclass
class JudgeConfig:
    """The optional LLM judge of the patient (used only when TANDEM_JUDGE_URL is set)."""

    weight: float = 1.0
    """Weight of the judge's score (0..1) in the patient's reward."""
    timeout_s: float = 30.0
    """Timeout of one judge request, seconds."""
    retries: int = 2
    """Extra attempts after a failed request or an unparsable reply (0: one attempt only)."""
    backoff_s: float = 0.5
    """First wait between attempts, doubled each time (capped at 8 s)."""
    max_tokens: int = 64
    """Most tokens the judge may answer with."""
    temperature: float = 0.0
    """Sampling temperature of the judge."""

    def validate(self) -> JudgeConfig:
        if not math.isfinite(self.weight) or self.weight < 0:
            raise ValueError(f"recipe_args.judge.weight must be finite and >= 0, got {self.weight}")
        if self.timeout_s <= 0:
            raise ValueError(f"recipe_args.judge.timeout_s must be > 0, got {self.timeout_s}")
        if self.retries < 0:
            raise ValueError(f"recipe_args.judge.retries must be >= 0, got {self.retries}")
        if self.backoff_s < 0:
            raise ValueError(f"recipe_args.judge.backoff_s must be >= 0, got {self.backoff_s}")
        if self.max_tokens < 1:
            raise ValueError(f"recipe_args.judge.max_tokens must be >= 1, got {self.max_tokens}")
        if self.temperature < 0:
            raise ValueError(f"recipe_args.judge.temperature must be >= 0, got {self.temperature}")
        return self


@dataclass
class RecipeConfig:
    """takes_two settings: a doctor questions a patient, then diagnoses."""

    max_turns: int = 4
    """Doctor turns at most (questions plus the final diagnosis); the episode ends there."""
    min_questions: int = 0
    """Questions (doctor turns with a '?', not the diagnosis) the doctor must ask before it
    diagnoses (the system prompt says so); a diagnosis after fewer is not accepted: its
    diagnosis and recommendation terms score 0 and it costs ``early_diagnosis_penalty``.
    0: the doctor may diagnose at once."""
    show_candidates: bool = False
    """Tell the doctor, in its opening, the conditions the case is one of (the row's
    ``candidates``, e.g. the complaint group of a shared-complaint case): a choice the patient's
    answers decide. Without it SmolLM2-135M named no condition at all in 128 held-out cases."""
    last_turn_notice: bool = True
    """Tell the doctor, with the patient's last answer, that its next turn must be the diagnosis."""
    final_turn_prefix: str = ""
    """Text the doctor's last allowed turn opens with, given and not sampled (in its context, out
    of its loss), e.g. ``"Diagnosis:"`` so that the turn is a diagnosis whatever the doctor would
    have started with; empty: the doctor writes the whole turn. Earlier turns are not touched."""
    max_quote_chars: int = 400
    """A turn quoted to the other agent is cut to this many characters."""
    scripted_patient: bool = False
    """The patient's every answer is its whole self-report, whatever was asked: a rule, not a
    model (its agent never speaks, has no sample and trains nothing). The doctor with a perfect
    informant: the control of how well the doctor reads the facts once it has them all (with
    ``show_candidates``, a doctor that reads them perfectly scores 1.0 on the balanced set)."""
    unknown_reply: str = "I'm not sure about that."
    """What the patient is told to say when asked about something not in its self-report
    (its words count as faithful)."""
    similarity: str = "token_set_ratio"
    """rapidfuzz.fuzz scorer comparing the recommendation with the ground truth (and the
    diagnosis, for the ``diagnosis_similarity`` metric only: the diagnosis term is an exact
    match against the synonym table, which a list of diagnoses cannot game)."""
    word_cutoff: float = 80.0
    """Two words match when rapidfuzz's ratio (0..100) of them is >= this (day ~ days)."""
    reveal_threshold: float = 0.5
    """A self-report fact is revealed by an answer when at least this share of its content words
    occurs in the answer."""
    leak_threshold: float = 0.5
    """An answer leaks the diagnosis when at least this share of the diagnosis words the case
    itself does not contain occurs in it."""
    diagnosis_weight: float = 1.0
    """Doctor: weight of the diagnosis term, 1 when the diagnosis names exactly one condition,
    the true one by the synonym table (``data.diagnosis_matches``), else 0. It also decides
    whether an episode is correct (eval pass@k, asymmetric weighting)."""
    recommendation_weight: float = 0.5
    """Doctor: weight of the recommendation similarity (0..1)."""
    information_weight: float = 1.0
    """Doctor: weight of the mean share of facts newly revealed per answered question."""
    multi_question_penalty: float = 0.5
    """Doctor: subtracted for every question turn that asks several questions (2+ '?')."""
    no_diagnosis_penalty: float = 1.0
    """Doctor: subtracted when the episode ends without a 'Diagnosis:' turn."""
    malformed_penalty: float = 0.5
    """Doctor: subtracted when the final turn lacks a non-empty Diagnosis or Recommendation."""
    early_diagnosis_penalty: float = 1.0
    """Doctor: subtracted when it diagnoses after fewer than ``min_questions`` questions (on top
    of the diagnosis and recommendation terms scoring 0)."""
    faithfulness_weight: float = 1.0
    """Patient: weight of the share of its content words grounded in the case."""
    leak_penalty: float = 1.0
    """Patient: subtracted when any answer leaks the diagnosis."""
    helpfulness_weight: float = 0.0
    """Patient: weight of the share of the self-report's facts its answers revealed to the
    doctor (the episode's ``facts_revealed``): the part of the team's work that is its own."""
    outcome_weight: float = 0.0
    """Patient: weight of the doctor's accepted correct diagnosis (1 or 0), the team's outcome
    shared with the partner that cannot make it alone (a cooperative reward, as MAPPO's)."""
    judge: JudgeConfig = field(default_factory=JudgeConfig)
    """The optional LLM judge of the patient (endpoint from TANDEM_JUDGE_URL etc.)."""

    def __post_init__(self) -> None:
        if isinstance(self.judge, dict):  # from YAML / JSON recipe_args
            self.judge = JudgeConfig(**self.judge)

    def validate(self) -> RecipeConfig:
        if self.max_turns < 1:
            raise ValueError(f"recipe_args.max_turns must be >= 1, got {self.max_turns}")
        if not 0 <= self.min_questions < self.max_turns:
            raise ValueError(
                f"recipe_args.min_questions must be >= 0 and below max_turns={self.max_turns} "
                f"(the diagnosis needs a turn), got {self.min_questions}"
            )
        if self.final_turn_prefix and not self.final_turn_prefix.strip():
            raise ValueError("recipe_args.final_turn_prefix must be empty or contain text")
        if self.max_quote_chars < 1:
            raise ValueError(
                f"recipe_args.max_quote_chars must be >= 1, got {self.max_quote_chars}"
            )
        if self.similarity not in SIMILARITY_METRICS or not hasattr(fuzz, self.similarity):
            raise ValueError(
                f"recipe_args.similarity must be one of {SIMILARITY_METRICS}, "
                f"got {self.similarity!r}"
            )
        if not 0 <= self.word_cutoff <= 100:
            raise ValueError(f"recipe_args.word_cutoff must be in [0, 100], got {self.word_cutoff}")
        for name in ("reveal_threshold", "leak_threshold"):
            value = getattr(self, name)
            if not 0 < value <= 1:
                raise ValueError(f"recipe_args.{name} must be in (0, 1], got {value}")
        weights = [f.name for f in fields(self) if f.name.endswith(("_weight", "_penalty"))]
        for name in weights:
            value = getattr(self, name)
            if not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
                raise ValueError(f"recipe_args.{name} must be a finite number >= 0, got {value!r}")
        self.judge.validate()
        return self


def as_config(value: object) -> RecipeConfig:
    """``ctx.config`` as a RecipeConfig (kernel.hooks.recipe_config)."""
    return recipe_config(value, RecipeConfig)
