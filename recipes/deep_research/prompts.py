"""Prompts of the main agent and the searcher, and the texts of tool responses. Rendered
through each agent's own chat template by the kernel's token builder; edit freely when you copy
the recipe (the tag names are the protocol parsed by tools.py: keep them in step)."""

from __future__ import annotations

AGENT_SYSTEM = (
    "You answer questions by researching them in a library. Every turn, think briefly inside "
    "<think>...</think>, then do exactly one of:\n"
    "<search>a sub-question</search> - a research assistant searches the library and sends "
    "back a summary;\n"
    "<read>document id</read> - returns the full text of one document, e.g. <read>p017</read>;\n"
    "<answer>final answer</answer> - ends the task; write only the short answer (a name, a "
    "place, a number).\n"
    "Results come back inside <information>...</information>.\n\n"
    "Example turns:\n"
    "<think>I do not know who founded it.</think><search>Who founded Acme Works?</search>\n"
    "<think>The summary says Ann Lee.</think><answer>Ann Lee</answer>"
)

SEARCHER_SYSTEM = (
    "You are a research assistant with a search engine over a library. Every turn, either "
    "search with one or more <query>search terms</query> (results come back inside "
    "<information>...</information>), or finish with <summary>the facts that answer the "
    "question, citing document ids like [p017]</summary>.\n\n"
    "Example turns:\n"
    "<query>Acme Works founder</query>\n"
    "<summary>Acme Works was founded by Ann Lee [c004].</summary>"
)


def question(text: str) -> str:
    return f"Question: {text.strip()}"


def research(sub_question: str) -> str:
    return f"Research this: {sub_question.strip()}"


def information(text: str) -> str:
    """A tool response as the agent sees it."""
    return f"<information>{text.strip()}</information>"


def passage(doc: dict, max_chars: int) -> str:
    """One document: ``[id] title: text`` (text cut to ``max_chars``)."""
    return f"[{doc['id']}] {doc['title']}: {doc['text'][:max_chars].strip()}"


def results(queries: list[str], hits: list[list[dict]], max_chars: int) -> str:
    """The searcher's view of one retrieval round."""
    blocks = []
    for q, docs in zip(queries, hits, strict=True):
        lines = [passage(d, max_chars) for d in docs] or ["(no documents)"]
        blocks.append(f'Results for "{q}":\n' + "\n".join(lines))
    return "\n\n".join(blocks)


def no_summary(seen: dict[str, str]) -> str:
    """What the main agent gets from a searcher that never wrote a <summary>: the documents it
    found (so the agent may <read> them), or that it found none."""
    if not seen:
        return "The assistant found nothing."
    listing = "\n".join(f"[{i}] {title}" for i, title in seen.items())
    return f"The assistant wrote no summary. Documents it found:\n{listing}"


def format_error(why: str, tags: str) -> str:
    return f"Invalid turn: {why}. Use exactly one of {tags}."


def tool_error(why: str) -> str:
    return f"The search engine failed: {why}"
