"""A writer and a critic, written for any OpenAI-compatible server: it imports only ``openai``.

The writer drafts an answer to the task, the critic reviews the draft, the writer revises it
with the review. ``model`` names the agent ("writer" or "critic"); a server with one model
answers both. The score is checkable in the row: the share of its ``keywords`` the final text
contains (whole words, any case), or, for a row without keywords, the share of the final text's
characters that are digits (what the tiny preset's character models learn in minutes).

Trained by Tandem as it is:

    python -m kernel train --recipe writer_critic --preset cpu   # agent_program: this run()

and run against any server (no training) with ``python -m recipes.writer_critic.program
BASE_URL [KEY]``, e.g. the embedded engine's ``http://127.0.0.1:30000/v1``.
"""

from __future__ import annotations

import json
import re
import sys

from openai import DefaultHttpxClient, OpenAI

HTTP = DefaultHttpxClient()  # one connection pool for every episode's client (building one
# per client costs ~20 ms of CPU: its TLS context)
WRITER = "You are a writer. Answer the task in one or two sentences."
CRITIC = "You are a critic. Say in one sentence what the draft misses from the task."


QUOTED = re.compile(r"""(?<!\w)(['"‘“])[^'"‘’“”]*['"’”](?!\w)""")  # 'red', "red", “red”
MIN_WORDS, MAX_WORDS = 4, 60  # a sentence or two, not a bare list of words nor a dump
ECHO = 6  # this many words of the task in a row: the task copied, not answered


def _words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9]+", text.lower())


def score(text: str, row: dict) -> float:
    """The share of the row's keywords ``text`` uses (whole words, any case, each once);
    without keywords, its share of digits. A keyword in quotes is mentioned, not used; a text
    of fewer than 4 or more than 60 words, or one that repeats 6 words of the task in a row,
    scores 0."""
    keywords = row.get("keywords") or []
    if not keywords:
        return sum(c.isdigit() for c in text) / len(text) if text else 0.0
    words = _words(text)
    if not MIN_WORDS <= len(words) <= MAX_WORDS or _echoes(words, _words(row.get("prompt", ""))):
        return 0.0
    used = set(_words(QUOTED.sub(" ", text)))
    return sum(k.lower() in used for k in keywords) / len(keywords)


def _echoes(words: list[str], task: list[str]) -> bool:
    """Whether ``words`` hold ECHO consecutive words of the task."""
    spans = {tuple(task[i : i + ECHO]) for i in range(len(task) - ECHO + 1)}
    return any(tuple(words[i : i + ECHO]) in spans for i in range(len(words) - ECHO + 1))


def run(base_url: str, api_key: str, episode_id: str, row: dict) -> dict[str, float]:
    """One episode: draft, review, revision; both agents get the final text's score."""
    client = OpenAI(
        base_url=base_url, api_key=api_key, max_retries=0, timeout=600, http_client=HTTP
    )

    def say(model: str, messages: list[dict]) -> str:
        reply = client.chat.completions.create(model=model, messages=messages)
        return reply.choices[0].message.content or ""

    task = row["prompt"]
    writer = [{"role": "system", "content": WRITER}, {"role": "user", "content": task}]
    draft = say("writer", writer)
    review = say(
        "critic",
        [
            {"role": "system", "content": CRITIC},
            {"role": "user", "content": f"Task: {task}\nDraft: {draft}"},
        ],
    )
    writer += [
        {"role": "assistant", "content": draft},
        {"role": "user", "content": f"Review: {review}\nWrite the final version."},
    ]
    final = say("writer", writer)
    reward = score(final, row)
    return {"writer": reward, "critic": reward}


if __name__ == "__main__":
    url, key = sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "none"
    row = {"prompt": "Name three colours of the rainbow.", "keywords": ["red", "green", "blue"]}
    print(json.dumps(run(url, key, "local", row)))
