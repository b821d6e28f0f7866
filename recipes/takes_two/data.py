"""Cases for takes_two: the row format, a converter for DoctorAgent-RL's MTMedDialog, and the
seeded synthetic case set shipped in data/.

A row (one JSON object per line; the kernel's DataBuffer reads ``prompt`` and ``label``, and
copies ``facts`` and ``self_report`` into every sample's metadata via
``data.metadata_keys: [facts, self_report]``)::

    {"prompt": "<chief complaint: what the patient says first>",
     "label": {"diagnosis": "...", "recommendation": "..."},
     "facts": ["<one self-report fact>", ...],       # what only the patient knows
     "self_report": "<the facts as one paragraph>",
     "source": "synthetic" | "mtmeddialog", ...}

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
import os
import random
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kernel.buffer import DataError

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

    @classmethod
    def from_sample(cls, sample) -> Case:
        """From a buffer sample: prompt = chief complaint, label = {diagnosis, recommendation}
        (or the diagnosis as a string, with metadata["recommendation"]), metadata["facts"]
        (or metadata["self_report"], split into sentences)."""
        where = f"sample {sample.key}"
        prompt = sample.prompt
        if isinstance(prompt, list):  # chat messages: the last user message is the complaint
            users = [m.get("content", "") for m in prompt if m.get("role") == "user"]
            prompt = users[-1] if users else ""
        if not isinstance(prompt, str) or not prompt.strip():
            raise ValueError(f"{where}: prompt (the chief complaint) must be a non-empty string")
        label, meta = sample.label, sample.metadata
        if isinstance(label, Mapping):
            diagnosis, recommendation = label.get("diagnosis"), label.get("recommendation")
        else:
            diagnosis, recommendation = label, meta.get("recommendation")
        if not isinstance(diagnosis, str) or not diagnosis.strip():
            raise ValueError(f"{where}: label.diagnosis must be a non-empty string")
        if not isinstance(recommendation, str):
            raise ValueError(f"{where}: label.recommendation must be a string")
        facts = meta.get("facts")
        if facts is None and isinstance(meta.get("self_report"), str):
            facts = split_facts(meta["self_report"])
        if not isinstance(facts, list) or not all(isinstance(f, str) for f in facts):
            raise ValueError(
                f"{where}: metadata needs 'facts' (list of strings) or 'self_report' (string); "
                "set data.metadata_keys: [facts, self_report]"
            )
        return cls(prompt.strip(), list(facts), diagnosis.strip(), recommendation.strip())


def make_row(
    chief_complaint: str, facts: Sequence[str], diagnosis: str, recommendation: str, **extra: Any
) -> Row:
    """A buffer row of this recipe."""
    return {
        "prompt": chief_complaint,
        "label": {"diagnosis": diagnosis, "recommendation": recommendation},
        "facts": list(facts),
        "self_report": " ".join(facts),
        **extra,
    }


# ---- MTMedDialog -----------------------------------------------------------------------------


class RowError(ValueError):
    """One row cannot be converted; the loader adds the file and row number."""


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
    """One MTMedDialog (or MrlX-converted) row as a row of this recipe."""
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
        chief, facts, diagnosis, recommendation, source="mtmeddialog", index=str(index or "")
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


# ---- synthetic cases -------------------------------------------------------------------------

# (diagnosis, recommendation, complaint, facts). Facts never name the diagnosis; "{d}" is a
# duration. Ages, sexes, durations and which facts a case gets vary with the seed.
CONDITIONS: tuple[tuple[str, str, str, tuple[str, ...]], ...] = (
    (
        "migraine",
        "Rest in a dark quiet room, take a pain reliever early in an attack, keep a diary.",
        "I keep getting bad headaches.",
        (
            "The headache is on one side of my head.",
            "Bright light makes it worse.",
            "I feel sick to my stomach during attacks.",
            "I see flashing zigzag lines before it starts.",
            "The attacks started {d} ago.",
        ),
    ),
    (
        "influenza",
        "Rest, drink plenty of fluids, take paracetamol for the fever, stay home until it is gone.",
        "I feel terrible and feverish.",
        (
            "My temperature was 39 degrees.",
            "My whole body aches.",
            "I have a dry cough.",
            "It came on suddenly {d} ago.",
            "Several people at work were sick.",
        ),
    ),
    (
        "strep throat",
        "A throat swab test, and penicillin antibiotics if it is positive.",
        "My throat really hurts.",
        (
            "It hurts a lot to swallow.",
            "I have a fever.",
            "There are white patches on my tonsils.",
            "The glands in my neck are swollen.",
            "I have no cough.",
        ),
    ),
    (
        "urinary tract infection",
        "A urine test, a short course of antibiotics, and plenty of water.",
        "It burns when I pee.",
        (
            "I need to pee very often.",
            "My pee is cloudy and smells strong.",
            "I have a dull ache low in my belly.",
            "I have no fever.",
            "It started {d} ago.",
        ),
    ),
    (
        "acute appendicitis",
        "Go to the emergency department now for blood tests, a scan and likely surgery.",
        "I have a sharp pain in my belly.",
        (
            "The pain started around my belly button and moved to the lower right side.",
            "It hurts more when I walk or cough.",
            "I have lost my appetite.",
            "I vomited once.",
            "I have a mild fever.",
        ),
    ),
    (
        "gastroesophageal reflux disease",
        "Eat smaller meals, nothing before bed, raise the head of the bed, try an acid reducer.",
        "I get a burning feeling in my chest.",
        (
            "It is worse after big meals.",
            "It gets worse when I lie down at night.",
            "I get a sour taste in my mouth.",
            "Antacids help a little.",
            "It has been going on for {d}.",
        ),
    ),
    (
        "asthma",
        "Lung function tests and inhalers: a reliever plus a daily inhaled steroid.",
        "I get short of breath.",
        (
            "I wheeze when I breathe out.",
            "It is worse at night and early in the morning.",
            "Exercise and cold air set it off.",
            "My chest feels tight.",
            "I had eczema as a child.",
        ),
    ),
    (
        "iron deficiency anemia",
        "A blood count and iron tests, iron tablets, and finding the cause of the blood loss.",
        "I have been very tired lately.",
        (
            "I get out of breath climbing stairs.",
            "People say I look pale.",
            "I bruise easily.",
            "I feel dizzy when I stand up.",
            "My nails break easily.",
        ),
    ),
    (
        "hypothyroidism",
        "A thyroid blood test and thyroid hormone tablets (levothyroxine).",
        "I feel tired and cold all the time.",
        (
            "I have gained weight without eating more.",
            "My skin is very dry.",
            "I am constipated.",
            "My hair is thinning.",
            "It has been like this for {d}.",
        ),
    ),
    (
        "allergic rhinitis",
        "Avoid the triggers, take a non-drowsy antihistamine, use a steroid nasal spray.",
        "My nose is always runny.",
        (
            "I sneeze a lot in the morning.",
            "My eyes itch and water.",
            "It is worse in spring.",
            "I have no fever.",
            "It has gone on for {d}.",
        ),
    ),
    (
        "kidney stone",
        "Pain relief, plenty of fluids, a urine test and a CT scan.",
        "I have terrible pain in my side.",
        (
            "The pain comes in waves.",
            "It spreads down to my groin.",
            "My pee looked pink.",
            "I cannot sit still.",
            "It started {d} ago.",
        ),
    ),
    (
        "pneumonia",
        "A chest x-ray and antibiotics; go to hospital if breathing gets harder.",
        "I have a bad cough and a fever.",
        (
            "I cough up green phlegm.",
            "It hurts in my chest when I breathe in deeply.",
            "I feel short of breath.",
            "I have shaking chills.",
            "It started {d} ago.",
        ),
    ),
    (
        "gout",
        "Anti-inflammatory painkillers, rest and ice, and later a uric acid blood test.",
        "My big toe is swollen and very painful.",
        (
            "It started suddenly during the night.",
            "The toe is red and hot.",
            "Even the bedsheet touching it hurts.",
            "I drank a lot of beer at a party.",
            "I had a similar attack last year.",
        ),
    ),
    (
        "bacterial conjunctivitis",
        "Clean the eye, use antibiotic eye drops, and do not share towels.",
        "My eye is red and sticky.",
        (
            "I woke up with my eyelids stuck together.",
            "There is yellow discharge.",
            "My vision is normal.",
            "My child had the same thing last week.",
            "It feels gritty.",
        ),
    ),
    (
        "type 2 diabetes",
        "A fasting blood glucose or HbA1c test, diet and exercise changes, and metformin.",
        "I am thirsty all the time.",
        (
            "I pee a lot, also at night.",
            "I have lost weight without trying.",
            "Cuts heal slowly.",
            "My vision is sometimes blurry.",
            "It has been going on for {d}.",
        ),
    ),
    (
        "lumbar muscle strain",
        "Keep moving gently, use heat and pain relief, see a doctor if it lasts over six weeks.",
        "My lower back hurts.",
        (
            "It started after I lifted a heavy box.",
            "The pain does not go down my legs.",
            "Bending forward makes it worse.",
            "I have no numbness.",
            "It has lasted {d}.",
        ),
    ),
)
DURATIONS = ("two days", "three days", "a week", "two weeks", "a month")

# ``complaints="shared"``: conditions in one group open with the same complaint, so only the
# patient's facts tell them apart: a doctor has to ask, and a patient that answers with its
# facts helps it diagnose (the co-training ablation needs this; with ``"specific"`` complaints
# the opening alone names the condition).
SHARED_COMPLAINTS: dict[str, tuple[str, ...]] = {
    "I have been very tired lately.": (
        "iron deficiency anemia",
        "hypothyroidism",
        "type 2 diabetes",
    ),
    "I have a fever and feel awful.": ("influenza", "strep throat", "pneumonia"),
    "I have bad pain in my belly.": (
        "acute appendicitis",
        "urinary tract infection",
        "kidney stone",
    ),
    "I have an uncomfortable feeling in my chest.": ("asthma", "gastroesophageal reflux disease"),
    "My eyes bother me.": ("allergic rhinitis", "bacterial conjunctivitis"),
    "I am in a lot of pain.": ("migraine", "gout", "lumbar muscle strain"),
}
COMPLAINTS = ("specific", "shared")


def generate_synthetic(
    n: int,
    seed: int = 0,
    facts_per_case: int = 4,
    exclude: Iterable[str] = (),
    complaints: str = "specific",
) -> list[Row]:
    """``n`` distinct synthetic cases, conditions taken in turn (so any prefix mixes them),
    deterministic in ``seed``; prompts in ``exclude`` (e.g. the train set) are skipped.
    ``complaints``: "specific" (each condition its own opening complaint) or "shared" (a
    group's conditions open alike: ``SHARED_COMPLAINTS``)."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    if not 1 <= facts_per_case <= 5:
        raise ValueError(f"facts_per_case must be in 1..5, got {facts_per_case}")
    if complaints not in COMPLAINTS:
        raise ValueError(f"complaints must be one of {COMPLAINTS}, got {complaints!r}")
    shared = {d: c for c, group in SHARED_COMPLAINTS.items() for d in group}
    rng = random.Random(seed)
    seen, rows = set(exclude), []
    for attempt in range(50 * n):
        if len(rows) == n:
            break
        diagnosis, recommendation, complaint, pool = CONDITIONS[attempt % len(CONDITIONS)]
        complaint = shared[diagnosis] if complaints == "shared" else complaint
        age, sex = rng.randint(18, 80), rng.choice(("man", "woman"))
        duration = rng.choice(DURATIONS)
        facts = [f.format(d=duration) for f in rng.sample(pool, facts_per_case)]
        chief = f"I am a {age}-year-old {sex}. {complaint}"
        if chief in seen:
            continue
        seen.add(chief)
        rows.append(
            make_row(chief, facts, diagnosis, recommendation, source="synthetic", case=attempt)
        )
    if len(rows) < n:
        raise ValueError(f"n: only {len(rows)} distinct new cases could be made, {n} asked")
    return rows
