"""Cases for takes_two: the row format, a converter for DoctorAgent-RL's MTMedDialog, the
synonym table the diagnosis is scored against, what makes two cases the same, and the seeded
synthetic case set shipped in data/. The synthetic conditions (their facts, synonyms, shared
complaints and which are held out) are data, ``data/conditions.yaml``, read once at import.

A row (one JSON object per line; the kernel's DataBuffer reads ``prompt`` and ``label``, and
copies ``facts`` and ``self_report`` into every sample's metadata via
``data.metadata_keys: [facts, self_report]``)::

    {"prompt": "<chief complaint: what the patient says first>",
     "label": {"diagnosis": "...", "recommendation": "...",
               "synonyms": ["...", ...]},            # optional: names that count as the diagnosis
     "facts": ["<one self-report fact>", ...],       # what only the patient knows
     "self_report": "<the facts as one paragraph>",
     "source": "synthetic" | "mtmeddialog", ...,
     "unseen_condition": true | false}               # held-out files: condition not in training

A doctor's diagnosis is correct when it names exactly one condition, the true one
(``diagnosis_matches``): its normal form equals a name the case's synonyms list, and it holds
no question mark, negation or approximation sign ("X？", "¬X", "~X"). A synthetic
row's synonyms are its condition's entry in ``CONDITIONS`` (``DIAGNOSIS_SYNONYMS``); an
MTMedDialog row carries ``label.synonyms: [its own label]``, i.e. an exact normalised match. A
label with neither is refused, naming it.

Held-out files are kept apart from their training files by ``canonical_key`` (condition plus
the set of facts: age, sex, duration and the order of facts do not make another case), and the
synthetic held-out files also hold conditions no training file has (``HELD_OUT_CONDITIONS``).
The balanced synthetic cases (``balanced_cases``) are the exception: only their facts give
their answer (each condition of a group equally often, the true one at each place of the
candidate list equally often, facts from ``BALANCED_FACTS``, held-out cases on trained
conditions); ``facts_oracle`` shows the facts decide them.

MTMedDialog (``MTMedDialog_RL.parquet`` of DoctorAgent-RL, or its JSONL export) rows look like::

    {"prompt": [{"role": "user", "content": "... Patient's description: <chief complaint>
                 \\n\\n\\nDecide next action: ..."}],     # sometimes wrapped in ChatML markers
     "reward_model": {"ground_truth": {"diagnosis": "...", "recommendation": "..."},
                      "enhanced_description": "<self-report paragraph>",
                      "patient_information": [...]},
     "extra_info": {"index": ...}}

MrlX's converted JSONL (``messages`` plus ``extra_info.{chief_complaint, self_report,
solution}``) is read too. The self-report paragraph is split into sentences: the facts.
"""

from __future__ import annotations

import json
import math
import os
import random
import re
import unicodedata
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import yaml

from kernel.buffer import DataError, RowError

Row = dict[str, Any]

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+|\n+")
_CHATML_USER = re.compile(r"<\|im_start\|>user\n(.*?)<\|im_end\|>", re.DOTALL)
_DESCRIPTION = re.compile(
    r"Patient's description:\s*(.*?)\s*(?:Decide next action:|$)", re.DOTALL | re.IGNORECASE
)


def split_facts(self_report: str) -> list[str]:
    """A self-report paragraph as a list of sentences (its facts)."""
    return [s.strip() for s in _SENTENCE_END.split(self_report) if s and s.strip()]


@dataclass
class Case:
    """One hidden case: what the patient says first, what only it knows, and the truth."""

    chief_complaint: str
    facts: list[str]
    diagnosis: str
    recommendation: str
    synonyms: tuple[str, ...] = ()
    """The row's own ``label.synonyms`` (empty: the synonym table's entry for the diagnosis)."""
    candidates: tuple[str, ...] = ()
    """The conditions the case is one of (the row's ``candidates``: a synthetic case's complaint
    group, ``SHARED_COMPLAINTS``), shown to the doctor with ``recipe_args.show_candidates``."""

    @classmethod
    def from_sample(cls, sample) -> Case:
        """From a buffer sample: prompt = chief complaint, label = {diagnosis, recommendation,
        optional synonyms} (or the diagnosis as a string, with metadata["recommendation"]),
        metadata["facts"] (or metadata["self_report"], split into sentences)."""
        where = f"sample {sample.key}"
        prompt = sample.prompt
        if isinstance(prompt, list):  # chat messages: the last user message is the complaint
            users = [m.get("content", "") for m in prompt if m.get("role") == "user"]
            prompt = users[-1] if users else ""
        if not isinstance(prompt, str) or not prompt.strip():
            raise ValueError(f"{where}: prompt (the chief complaint) must be a non-empty string")
        label, meta = sample.label, sample.metadata
        synonyms: Any = ()
        if isinstance(label, Mapping):
            diagnosis, recommendation = label.get("diagnosis"), label.get("recommendation")
            synonyms = label.get("synonyms") or ()
        else:
            diagnosis, recommendation = label, meta.get("recommendation")
        if not isinstance(diagnosis, str) or not diagnosis.strip():
            raise ValueError(f"{where}: label.diagnosis must be a non-empty string")
        if not isinstance(recommendation, str):
            raise ValueError(f"{where}: label.recommendation must be a string")
        if not isinstance(synonyms, list | tuple) or not all(isinstance(x, str) for x in synonyms):
            raise ValueError(f"{where}: label.synonyms must be a list of strings")
        facts = meta.get("facts")
        if facts is None and isinstance(meta.get("self_report"), str):
            facts = split_facts(meta["self_report"])
        candidates = meta.get("candidates") or ()
        if not isinstance(candidates, list | tuple) or not all(
            isinstance(c, str) for c in candidates
        ):
            raise ValueError(f"{where}: metadata 'candidates' must be a list of strings")
        if not isinstance(facts, list) or not all(isinstance(f, str) for f in facts):
            raise ValueError(
                f"{where}: metadata needs 'facts' (list of strings) or 'self_report' (string); "
                "set data.metadata_keys: [facts, self_report]"
            )
        return cls(
            prompt.strip(),
            list(facts),
            diagnosis.strip(),
            recommendation.strip(),
            tuple(x.strip() for x in synonyms if x.strip()),
            tuple(candidates),
        )


def make_row(
    chief_complaint: str,
    facts: Sequence[str],
    diagnosis: str,
    recommendation: str,
    synonyms: Sequence[str] = (),
    **extra: Any,
) -> Row:
    """A buffer row of this recipe (``synonyms``, when given, go into the label)."""
    label = {"diagnosis": diagnosis, "recommendation": recommendation}
    if synonyms:
        label["synonyms"] = list(synonyms)
    return {
        "prompt": chief_complaint,
        "label": label,
        "facts": list(facts),
        "self_report": " ".join(facts),
        **extra,
    }


# ---- MTMedDialog -----------------------------------------------------------------------------


def _field(obj: Any, path: str) -> Any:
    """``obj["a"]["b"]`` for path "a.b"; RowError naming the path when a level is missing."""
    for part in path.split("."):
        if not isinstance(obj, Mapping) or obj.get(part) is None:
            raise RowError(f"field {path!r} is missing")
        obj = obj[part]
    return obj


def _text(obj: Any, path: str) -> str:
    value = _field(obj, path)
    if not isinstance(value, str) or not value.strip():
        raise RowError(f"field {path!r} must be a non-empty string, got {value!r:.60}")
    return value.strip()


def chief_complaint_from_prompt(prompt: Any) -> str:
    """The "Patient's description: ..." part of an MTMedDialog doctor prompt (a string or chat
    messages, possibly with ChatML markers inside the content)."""
    if isinstance(prompt, list):
        users = [m.get("content") for m in prompt if isinstance(m, Mapping)]
        users = [u for u in users if isinstance(u, str)]
        if not users:
            raise RowError("field 'prompt' has no message with a string 'content'")
        prompt = users[0]
    if not isinstance(prompt, str):
        raise RowError(f"field 'prompt' must be a string or chat messages, got {prompt!r:.60}")
    if m := _CHATML_USER.search(prompt):
        prompt = m.group(1)
    m = _DESCRIPTION.search(prompt)
    if m is None or not m.group(1).strip():
        raise RowError("field 'prompt' has no \"Patient's description: ...\" text")
    return m.group(1).strip()


def map_mtmeddialog(row: Mapping[str, Any]) -> Row:
    """One MTMedDialog (or MrlX-converted) row as a row of this recipe. Its label's synonyms
    are the label alone: MTMedDialog's thousands of free-text diagnoses have no synonym table,
    so a doctor's diagnosis must match the label exactly after ``normalise_diagnosis``."""
    extra = row.get("extra_info") or {}
    if isinstance(extra, Mapping) and extra.get("chief_complaint"):
        chief = _text(extra, "chief_complaint")
    else:
        chief = chief_complaint_from_prompt(row.get("prompt", row.get("messages")))
    if isinstance(row.get("reward_model"), Mapping):
        truth_path, report_path = "reward_model.ground_truth", "reward_model.enhanced_description"
    else:
        truth_path, report_path = "extra_info.solution", "extra_info.self_report"
    diagnosis = _text(row, f"{truth_path}.diagnosis")
    recommendation = _text(row, f"{truth_path}.recommendation")
    facts = split_facts(_text(row, report_path))
    index = extra.get("index") if isinstance(extra, Mapping) else None
    return make_row(
        chief,
        facts,
        diagnosis,
        recommendation,
        synonyms=[diagnosis],
        source="mtmeddialog",
        index=str(index or ""),
    )


def _records(path: str) -> Iterable[tuple[int, Any]]:
    """(row number as the user sees it, record) of a .jsonl (line numbers), .json (a list) or
    .parquet file."""
    ext = os.path.splitext(path)[1].lower()
    if not os.path.isfile(path):
        raise DataError(f"{path}: no such file")
    if ext == ".jsonl":
        with open(path, encoding="utf-8") as f:
            for line_no, line in enumerate(f, start=1):
                if line.strip():
                    try:
                        yield line_no, json.loads(line)
                    except json.JSONDecodeError as e:
                        raise DataError(f"{path}: row {line_no}: not valid JSON: {e.msg}") from e
    elif ext == ".json":
        with open(path, encoding="utf-8") as f:
            records = json.load(f)
        if not isinstance(records, list):
            raise DataError(f"{path}: expected a JSON list of rows")
        yield from enumerate(records, start=1)
    elif ext == ".parquet":
        import datasets

        try:
            dataset = datasets.load_dataset("parquet", data_files=path, split="train")
        except Exception as e:
            raise DataError(f"{path}: cannot be read as parquet: {e}") from e
        yield from enumerate(dataset, start=1)
    else:
        raise DataError(f"{path}: expected a .jsonl, .json or .parquet file")


def load_mtmeddialog(path: str) -> list[Row]:
    """Every row of an MTMedDialog file converted; a bad row raises DataError naming the file,
    the row (JSONL: its line) and the field."""
    out = []
    for row_no, record in _records(path):
        if not isinstance(record, Mapping):
            raise DataError(f"{path}: row {row_no}: not a JSON object")
        try:
            out.append(map_mtmeddialog(record))
        except RowError as e:
            raise DataError(f"{path}: row {row_no}: {e}") from e
    if not out:
        raise DataError(f"{path}: has no rows")
    return out


# ---- diagnoses: normal form, synonyms, one case's identity -----------------------------------

_APOSTROPHES = re.compile(r"['’`]")
_NON_WORD = re.compile(r"[^0-9a-z]+")
_ARTICLES = frozenset({"a", "an", "the"})


def normalise_text(text: str) -> str:
    """Lower case, apostrophes dropped ("Crohn's" -> "crohns"), every other run of
    non-alphanumerics (punctuation, hyphens, white space) one space."""
    return _NON_WORD.sub(" ", _APOSTROPHES.sub("", text.lower())).strip()


def normalise_diagnosis(text: str) -> str:
    """A diagnosis as it is compared with the synonym table: ``normalise_text`` without a
    leading article ("The flu." -> "flu", "Type-2 diabetes" -> "type 2 diabetes"; the "a" of
    "influenza a" stays)."""
    words = normalise_text(text).split()
    while words and words[0] in _ARTICLES:
        words.pop(0)
    return " ".join(words)


def synonyms_for(diagnosis: str, row_synonyms: Sequence[str] = ()) -> frozenset[str]:
    """The normalised names that count as ``diagnosis`` (a case's true condition): the row's
    own ``label.synonyms`` when it gives some (MTMedDialog rows give their label: an exact
    normalised match), else the condition's entry in ``DIAGNOSIS_SYNONYMS``. The label itself
    always counts. A label with neither raises ValueError naming it: a scorer cannot guess which
    names mean the same condition."""
    if row_synonyms:
        names = [diagnosis, *row_synonyms]
    else:
        names = DIAGNOSIS_SYNONYMS.get(normalise_diagnosis(diagnosis))
        if names is None:
            raise ValueError(
                f"condition {diagnosis!r} has no entry in recipes.takes_two.data"
                ".DIAGNOSIS_SYNONYMS and its row gives no label.synonyms: add one of the two "
                "(a list of the names that count as this diagnosis)"
            )
    return frozenset(normalise_diagnosis(n) for n in names)


# Signs that doubt a name the normal form would drop with the other punctuation: a question
# mark in any script ("migraine？", "migraine‽"), a negation ("¬migraine", "≠ migraine") or an
# approximation ("~migraine", "≈ migraine"). Read after NFKC, which folds full-width forms.
_DOUBT_SIGNS = re.compile(r"[?¿‽⸮؟¬≠~∼≈≃]")


def diagnosis_matches(stated: str, diagnosis: str, row_synonyms: Sequence[str] = ()) -> bool:
    """Whether the doctor's ``stated`` diagnosis names exactly one condition, the true one:
    its normal form (after Unicode NFKC: "ｍｉｇｒａｉｎｅ" is "migraine") equals one of
    ``synonyms_for(diagnosis)``, and it holds no question mark, negation or approximation sign
    (``_DOUBT_SIGNS``: "X?", "X？", "X‽", "¬X", "≠ X", "~X"). A list ("migraine, influenza",
    "X or Y") or a hedge ("possibly migraine", "could be X", "not sure, X", "not X") never
    matches: the words it adds are in no synonym. A broader name ("anemia" for iron deficiency
    anemia) matches only where the table lists it."""
    synonyms = synonyms_for(diagnosis, row_synonyms)  # raises first for an unknown label
    stated = unicodedata.normalize("NFKC", stated)
    return _DOUBT_SIGNS.search(stated) is None and normalise_diagnosis(stated) in synonyms


def _diagnosis_of(row: Mapping[str, Any]) -> str:
    label = row.get("label")
    return str(label.get("diagnosis", "") if isinstance(label, Mapping) else label or "")


def _fact_key(fact: str) -> str:
    """A fact with its duration (``DURATIONS``) as a placeholder: the seeded duration is a
    detail like the age, not another case."""
    text = normalise_text(fact)
    for duration in DURATIONS:
        text = re.sub(rf"\b{duration}\b", "<duration>", text)
    return text


def canonical_key(row: Mapping[str, Any]) -> str:
    """What makes two rows the same case, for keeping a held-out file apart from its training
    file: the condition (``normalise_diagnosis`` of the label) and the SET of facts
    (``normalise_text``, durations as a placeholder, sorted, repeats dropped). Age, sex, the
    opening complaint, the duration and the order of the facts do not count, so a held-out case
    whose fact combination occurs in training for its condition has the training case's key.
    Facts come from ``facts``, else ``self_report`` split into sentences.
    tests/recipes/test_data_leaks.py checks every shipped split by it."""
    facts = row.get("facts")
    if not isinstance(facts, list):
        facts = split_facts(str(row.get("self_report") or ""))
    keys = sorted({_fact_key(str(f)) for f in facts})
    return normalise_diagnosis(_diagnosis_of(row)) + " | " + " + ".join(keys)


def mark_unseen(rows: Iterable[Row], train: Iterable[Mapping[str, Any]]) -> list[Row]:
    """``rows`` (held-out cases), each with ``unseen_condition``: whether its condition
    (normalised) is absent from the ``train`` rows."""
    trained = {normalise_diagnosis(_diagnosis_of(r)) for r in train}
    return [
        {**r, "unseen_condition": normalise_diagnosis(_diagnosis_of(r)) not in trained}
        for r in rows
    ]


# ---- synthetic cases -------------------------------------------------------------------------


class Condition(NamedTuple):
    """One synthetic condition: the truth, how a patient opens, what it may report, and the
    names a doctor may give it."""

    diagnosis: str
    recommendation: str
    complaint: str
    facts: tuple[str, ...]
    """Seven self-report facts, of which a case gets ``facts_per_case``; none names the
    diagnosis; "{d}" is a duration."""
    synonyms: tuple[str, ...]
    """Every name (the label first) that counts as this diagnosis; a broader or neighbouring
    name ("anemia", "conjunctivitis", "back pain") is left out on purpose."""


CONDITIONS_FILE = Path(__file__).with_name("data") / "conditions.yaml"
"""The synthetic case table (conditions, durations, held-out conditions, shared complaints),
read once at import; its comments say what each part is for."""


BALANCED_KEY = "balanced_facts"
"""The part of ``CONDITIONS_FILE`` that says what a balanced case may report
(``load_balanced_facts``); ``load_conditions`` leaves it alone."""


class ConditionTable(NamedTuple):
    """``CONDITIONS_FILE`` as read: the values of the four constants below."""

    conditions: tuple[Condition, ...]
    durations: tuple[str, ...]
    held_out_conditions: tuple[str, ...]
    shared_complaints: dict[str, tuple[str, ...]]


def _strings(value: Any, where: str) -> tuple[str, ...]:
    """``value``, a list of non-empty strings, as a tuple; else a ValueError naming ``where``."""
    if not isinstance(value, list) or not all(isinstance(x, str) and x for x in value):
        raise ValueError(f"{where} must be a list of non-empty strings")
    return tuple(value)


def load_conditions(path: str | os.PathLike = CONDITIONS_FILE) -> ConditionTable:
    """Read a condition table file (YAML, as ``data/conditions.yaml``); a ValueError names the
    file and the entry that is not as this module expects."""

    def strings(value: Any, where: str) -> tuple[str, ...]:
        return _strings(value, f"{path}: {where}")

    table = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    parts = ("conditions", "durations", "held_out_conditions", "shared_complaints")
    if not isinstance(table, dict) or set(table) - {BALANCED_KEY} != set(parts):
        raise ValueError(
            f"{path}: the table must have exactly the keys {parts} (and may have "
            f"{BALANCED_KEY!r}: load_balanced_facts)"
        )
    conditions = []
    for i, entry in enumerate(table["conditions"] or ()):
        if not isinstance(entry, dict) or set(entry) != set(Condition._fields):
            raise ValueError(f"{path}: conditions[{i}] must have the keys {Condition._fields}")
        for key in Condition._fields[:3]:
            if not isinstance(entry[key], str) or not entry[key]:
                raise ValueError(f"{path}: conditions[{i}].{key} must be a non-empty string")
        facts = strings(entry["facts"], f"conditions[{i}].facts")
        synonyms = strings(entry["synonyms"], f"conditions[{i}].synonyms")
        conditions.append(Condition(*(entry[k] for k in Condition._fields[:3]), facts, synonyms))
    groups = table["shared_complaints"]
    if not isinstance(groups, dict) or not all(isinstance(k, str) for k in groups):
        raise ValueError(f"{path}: shared_complaints must map complaints to conditions")
    names = {c.diagnosis for c in conditions}
    held_out = strings(table["held_out_conditions"], "held_out_conditions")
    shared = {k: strings(v, f"shared_complaints[{k!r}]") for k, v in groups.items()}
    unknown = sorted({*held_out, *(d for g in shared.values() for d in g)} - names)
    if not conditions or unknown:
        raise ValueError(f"{path}: conditions must list every condition named; missing {unknown}")
    durations = strings(table["durations"], "durations")
    return ConditionTable(tuple(conditions), durations, held_out, shared)


CONDITIONS, DURATIONS, HELD_OUT_CONDITIONS, SHARED_COMPLAINTS = load_conditions()
"""``CONDITIONS``: the synthetic conditions, in table order. ``DURATIONS``: what a fact's
"{d}" becomes. ``HELD_OUT_CONDITIONS``: conditions no training file has (``--conditions
train``): a held-out file's cases on them carry ``unseen_condition: true``.
``SHARED_COMPLAINTS`` (``complaints="shared"``): complaint -> the conditions that open with it,
so only the patient's facts tell them apart."""

TRAIN_CONDITIONS: tuple[str, ...] = tuple(
    c.diagnosis for c in CONDITIONS if c.diagnosis not in HELD_OUT_CONDITIONS
)

DIAGNOSIS_SYNONYMS: dict[str, tuple[str, ...]] = {
    normalise_diagnosis(c.diagnosis): c.synonyms for c in CONDITIONS
}
"""Normalised label -> the names that count as it (``diagnosis_matches``); the scorer refuses a
label that is neither here nor gives its own ``label.synonyms``."""

COMPLAINTS = ("specific", "shared")


class BalancedFacts(NamedTuple):
    """``CONDITIONS_FILE``'s ``balanced_facts`` as read (``load_balanced_facts``)."""

    pools: dict[str, tuple[str, ...]]
    """Condition (each of the table) -> what a balanced case on it may report: its facts less
    those with a duration ("{d}") and less its ``drop``, plus its ``add``. No two conditions of
    a group share one (tests/recipes/test_takes_two_balanced.py)."""
    added: dict[str, tuple[str, ...]]
    """Condition -> its ``add`` (empty for none)."""


def load_balanced_facts(path: str | os.PathLike = CONDITIONS_FILE) -> BalancedFacts:
    """Read the ``balanced_facts`` part of a condition table file (as ``data/conditions.yaml``:
    condition -> {drop: [its facts a balanced case leaves out], add: [new facts]}); a ValueError
    names the file and the entry that is not as this module expects."""
    known = {c.diagnosis: c for c in load_conditions(path).conditions}  # a table: a dict
    entries = yaml.safe_load(Path(path).read_text(encoding="utf-8")).get(BALANCED_KEY) or {}
    if not isinstance(entries, dict):
        raise ValueError(f"{path}: {BALANCED_KEY} must map conditions to {{drop, add}}")
    unknown = sorted(set(entries) - set(known))
    if unknown:
        raise ValueError(f"{path}: {BALANCED_KEY} names conditions the table lacks: {unknown}")
    pools, added = {}, {}
    for name, condition in known.items():
        where = f"{path}: {BALANCED_KEY}[{name!r}]"
        entry = entries.get(name) or {}
        if not isinstance(entry, dict) or not set(entry) <= {"drop", "add"}:
            raise ValueError(f"{where} may have the keys 'drop' and 'add' only")
        drop = _strings(entry.get("drop") or [], f"{where}.drop")
        add = _strings(entry.get("add") or [], f"{where}.add")
        if missing := [f for f in drop if f not in condition.facts]:
            raise ValueError(f"{where}.drop: not facts of {name!r}: {missing}")
        kept = tuple(f for f in condition.facts if "{d}" not in f and f not in drop)
        pools[name], added[name] = kept + add, add
    return BalancedFacts(pools, added)


BALANCED_FACTS, ADDED_FACTS = load_balanced_facts()
"""``BALANCED_FACTS``: condition -> what a balanced case on it may report
(``BalancedFacts.pools``). ``ADDED_FACTS``: condition -> the facts the table adds for them."""


def facts_of(diagnosis: str) -> tuple[str, ...]:
    """Every fact the table gives a condition ("{d}" for a duration): its seven facts and
    those added for the balanced set; a ValueError for a condition the table lacks."""
    for condition in CONDITIONS:
        if condition.diagnosis == diagnosis:
            return condition.facts + ADDED_FACTS[diagnosis]
    raise ValueError(f"condition {diagnosis!r} is not in {CONDITIONS_FILE.name}")


def facts_oracle(row: Mapping[str, Any]) -> float:
    """The expected score of the facts oracle on a synthetic row: given ALL the row's facts, it
    names the candidate (``candidates``) whose table facts (``facts_of``; compared as
    ``_fact_key``s, so the duration does not count) hold the most of them, a random one of the
    tied when several hold as many. 1.0 where every case's facts decide it."""
    candidates = list(row.get("candidates") or ())
    if not candidates:
        raise ValueError("the facts oracle picks among the row's candidates: it has none")
    told = {_fact_key(str(f)) for f in row.get("facts") or ()}
    held = {
        c: len(told & {_fact_key(f.format(d=DURATIONS[0])) for f in facts_of(c)})
        for c in candidates
    }
    tied = [c for c, k in held.items() if k == max(held.values())]
    label = row.get("label")
    synonyms = (label.get("synonyms") if isinstance(label, Mapping) else None) or ()
    return sum(diagnosis_matches(c, _diagnosis_of(row), synonyms) for c in tied) / len(tied)


def _opening(rng: random.Random, complaint: str) -> str:
    """A synthetic case's opening: an age, then a sex, drawn from ``rng`` in that order, before
    its ``complaint`` ("I am a 34-year-old woman. I have a headache.")."""
    age = rng.randint(18, 80)
    sex = rng.choice(("man", "woman"))
    return f"I am a {age}-year-old {sex}. {complaint}"


def _synthetic_row(
    cond: Condition, case: int, chief: str, facts: Sequence[str], candidates: Sequence[str]
) -> Row:
    """Synthetic case number ``case``'s row: ``chief`` (its ``_opening``), its ``facts`` and the
    ``candidates`` it is one of, on condition ``cond``."""
    return make_row(
        chief,
        facts,
        cond.diagnosis,
        cond.recommendation,
        source="synthetic",
        case=case,
        candidates=candidates,
    )


def generate_synthetic(
    n: int,
    seed: int = 0,
    facts_per_case: int = 4,
    exclude: Iterable[Mapping[str, Any]] = (),
    complaints: str = "specific",
    conditions: Sequence[str] | None = None,
    balanced: bool = False,
) -> list[Row]:
    """``n`` synthetic cases, deterministic in ``seed``; case i is on condition
    ``conditions[i % len(conditions)]`` (default: every condition of ``CONDITIONS``, in table
    order), so any prefix mixes them. No two cases share a ``canonical_key`` (condition and
    fact set), nor does any case share one with a row of ``exclude`` (e.g. the training file);
    with ``exclude`` given, every row also gets ``unseen_condition`` (``mark_unseen``).
    ``complaints``: "specific" (each condition its own opening complaint) or "shared" (a group's
    conditions open alike: ``SHARED_COMPLAINTS``). Every row names the conditions of its
    condition's group as ``candidates`` (what a doctor may be told the case is one of).
    ``balanced``: the cases of ``balanced_cases`` instead (with ``complaints="shared"``)."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    if not 1 <= facts_per_case <= 7:
        raise ValueError(f"facts_per_case must be in 1..7, got {facts_per_case}")
    if complaints not in COMPLAINTS:
        raise ValueError(f"complaints must be one of {COMPLAINTS}, got {complaints!r}")
    table = {c.diagnosis: c for c in CONDITIONS}
    names = list(table) if conditions is None else list(conditions)
    unknown = [c for c in names if c not in table]
    if unknown or not names:
        raise ValueError(f"conditions: unknown {unknown} (known: {list(table)})")
    shared = {d: c for c, group in SHARED_COMPLAINTS.items() for d in group}
    groups = {d: list(group) for group in SHARED_COMPLAINTS.values() for d in group}
    exclude = list(exclude)
    seen = {canonical_key(r) for r in exclude}
    if balanced:
        if complaints != "shared":
            raise ValueError(
                "balanced cases open with their group's shared complaint: "
                "complaints must be 'shared'"
            )
        rows = balanced_cases(n, seed, facts_per_case, names, seen)
        return mark_unseen(rows, exclude) if exclude else rows
    rng = random.Random(seed)
    rows: list[Row] = []
    for i in range(n):
        cond = table[names[i % len(names)]]
        complaint = shared[cond.diagnosis] if complaints == "shared" else cond.complaint
        prefix = normalise_diagnosis(cond.diagnosis) + " | "
        taken = sum(k.startswith(prefix) and k.count(" + ") == facts_per_case - 1 for k in seen)
        if taken >= math.comb(len(cond.facts), facts_per_case):
            raise ValueError(
                f"n: only {len(rows)} distinct new cases could be made, {n} asked (every "
                f"combination of {facts_per_case} of the {len(cond.facts)} facts of "
                f"{cond.diagnosis!r} is taken)"
            )
        while True:  # a combination is left, so this ends
            chief = _opening(rng, complaint)
            duration = rng.choice(DURATIONS)
            facts = [f.format(d=duration) for f in rng.sample(cond.facts, facts_per_case)]
            row = _synthetic_row(cond, i, chief, facts, groups[cond.diagnosis])
            if canonical_key(row) not in seen:
                break
        seen.add(canonical_key(row))
        rows.append(row)
    return mark_unseen(rows, exclude) if exclude else rows


def _new_facts(
    diagnosis: str, facts_per_case: int, rng: random.Random, seen: set[str], made: int, n: int
) -> list[str]:
    """``facts_per_case`` of ``BALANCED_FACTS[diagnosis]``, drawn with ``rng`` until their
    ``canonical_key`` is not in ``seen``; a ValueError when every combination is taken."""
    pool = BALANCED_FACTS[diagnosis]
    prefix = normalise_diagnosis(diagnosis) + " | "
    keys = {_fact_key(f) for f in pool}

    def taken(key: str) -> bool:  # a case on this condition with as many of these facts
        facts = key[len(prefix) :].split(" + ")
        return key.startswith(prefix) and len(facts) == facts_per_case and set(facts) <= keys

    if sum(map(taken, seen)) >= math.comb(len(pool), facts_per_case):
        raise ValueError(
            f"n: only {made} distinct new cases could be made, {n} asked (every combination "
            f"of {facts_per_case} of the {len(pool)} balanced facts of {diagnosis!r} is taken)"
        )
    while True:  # a combination is left, so this ends
        facts = rng.sample(pool, facts_per_case)
        if canonical_key({"label": {"diagnosis": diagnosis}, "facts": facts}) not in seen:
            return facts


def balanced_cases(
    n: int, seed: int, facts_per_case: int, conditions: Sequence[str], seen: set[str]
) -> list[Row]:
    """``n`` cases whose answer only their facts give (``generate_synthetic(balanced=True)``):
    case i is on ``conditions[i % len(conditions)]``, so ``n`` must be a multiple of their
    number and each occurs equally often (a group's most common answer is any of its
    conditions). Each case has its own RNG (seeded by ``seed`` and i) and draws from it, in
    turn, the opening (age and sex, then its group's shared complaint: nothing of the
    condition), ``facts_per_case`` of its condition's ``BALANCED_FACTS`` (each tells it apart
    from every other condition of its group; its ``canonical_key`` not in ``seen``, which
    gains it) and the order of the other ``candidates`` (its group's conditions among
    ``conditions``). The true one's place among them is dealt so that, within a group, each
    place is taken equally often (exactly), and within a condition within one: the j-th case
    of the c-th condition of a k-condition group takes place ``turn[(c + j) % k]``, ``turn``
    a seeded shuffle of the group's places."""
    if n % len(conditions) or len(set(conditions)) != len(conditions):
        raise ValueError(
            f"n: balanced cases take each of the {len(conditions)} conditions equally often: "
            f"n must be a multiple of {len(conditions)} (and no condition named twice), got {n}"
        )
    if facts_per_case < 2:
        raise ValueError("facts_per_case: a balanced case tells its condition apart twice over")
    table = {c.diagnosis: c for c in CONDITIONS}
    complaint_of = {d: c for c, group in SHARED_COMPLAINTS.items() for d in group}
    members = {c: [d for d in g if d in conditions] for c, g in SHARED_COMPLAINTS.items()}
    turn = {
        c: random.Random(f"takes_two balanced {seed} {c}").sample(range(len(g)), len(g))
        for c, g in members.items()
    }
    rows: list[Row] = []
    for i in range(n):
        cond = table[conditions[i % len(conditions)]]
        complaint = complaint_of[cond.diagnosis]
        group = members[complaint]
        rng = random.Random(f"takes_two balanced {seed} {i}")
        chief = _opening(rng, complaint)
        facts = _new_facts(cond.diagnosis, facts_per_case, rng, seen, len(rows), n)
        others = rng.sample([d for d in group if d != cond.diagnosis], len(group) - 1)
        place = turn[complaint][(group.index(cond.diagnosis) + i // len(conditions)) % len(group)]
        candidates = [*others[:place], cond.diagnosis, *others[place:]]
        row = _synthetic_row(cond, i, chief, facts, candidates)
        seen.add(canonical_key(row))
        rows.append(row)
    return rows
