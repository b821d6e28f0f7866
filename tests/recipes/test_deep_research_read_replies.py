"""recipes/deep_research/read_replies.py reads a run's held-out episodes: exact match per hop
count, whether the searcher's information held the gold answer (and exact matches among those),
answers that copy the information, and whether the searcher's query was the question, its
passages held the gold answer and its summary kept it."""

from __future__ import annotations

from kernel.run.results import SeedRun
from recipes.deep_research import read_replies
from tests.recipes.conftest import write_learning_run

CONFIG = {  # the first two rows of the shipped held-out set: Dorbek Garul's town, Quovin's job
    "data": {"metadata_keys": ["hops", "support"]},
    "eval": {
        "path": "recipes/deep_research/data/learn_test.jsonl",
        "n_samples": 2,
        "max_prompts": 2,
    },
}
END = "<|im_end|>\n"
FOUNDED = "The town of Nyquoholm was founded by:"


def _agent(information: str, answer: str | None) -> str:
    text = f"<search>q</search>{END}<|im_start|>user\n<information>{information}</information>{END}"
    return text + ("" if answer is None else f"<|im_start|>assistant\n<answer>{answer}</answer>")


def _logged(em: float) -> dict:
    return {"exact_match": em, "f1": em, "gold_in_answer": em, "searches": 1.0}


EPISODES = [
    {  # found and trimmed; found and copied whole
        "row": 0,
        "agent": "agent",
        "texts": [
            _agent("Dorbek Garul was born in Nyquoholm.", "Nyquoholm"),
            _agent(FOUNDED, FOUNDED),
        ],
        "metrics": [_logged(1.0), _logged(0.0)],
    },
    {  # no answer; a right guess without the fact in sight
        "row": 1,
        "agent": "agent",
        "texts": [_agent("Nothing found.", None), _agent("Nothing found.", "poet")],
        "metrics": [_logged(0.0), _logged(1.0)],
    },
    {  # the question as the query, the fact retrieved and kept (a summary its turn's end closed:
        # a scaffolded turn stops at a line break); another query, nothing retrieved, the fact
        # kept all the same (from the question's own words? the model's guess), in a summary
        # another tag closed
        "row": 0,
        "agent": "searcher",
        "texts": [
            "<query>In which town was Dorbek Garul born?</query>\n<information>[p070] Dorbek "
            "Garul: born in the town of Nyquoholm.</information><summary>Nyquoholm.<|im_end|>\n",
            "<query>Garul</query>\n<information>[p093] Zanka Dorrho</information>"
            "<summary>Born in Nyquoholm.</information>",
        ],
        "metrics": [{}, {}],
    },
]


def test_read_separates_finding_the_fact_from_writing_only_the_fact(tmp_path):
    seed = SeedRun.read(write_learning_run(tmp_path, CONFIG, EPISODES) / "seed0")
    figures = read_replies.read(seed.last, seed.held_out())
    agent, searcher = figures["agent"], figures["searcher"]
    assert agent["n"] == 4 and agent["em"] == 2 / 4 and agent["em_by_hops"] == {1: 2 / 4}
    assert agent["seen"] == 2 / 4 and agent["em_seen"] == 1 / 2
    assert agent["answered"] == 3 / 4 and agent["copies"] == 1 / 3
    assert agent["words"] == (1 + 7 + 1) / 3
    assert agent["top_answer"] == ("nyquoholm", 1)
    assert searcher == {"n": 2, "question": 1 / 2, "retrieved": 1 / 2, "kept": 2 / 2}


def test_cli_prints_every_evaluation_of_every_seed(tmp_path, capsys):
    run = write_learning_run(tmp_path, CONFIG, EPISODES)
    read_replies.main([str(run)])
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1 + 2 * 2  # header, then (step_0, step_32) x (agent, searcher)
    agent_last = next(line for line in lines if "step_32" in line and " agent " in line)
    assert "em 0.500" in agent_last and "em | seen 0.500 copies 0.333" in agent_last
