"""Prompts of the main agent (alone, with ``workflow: solo``) and the searcher, and the texts of
tool responses. Rendered through each agent's own chat template by the kernel's token builder;
edit freely when you copy the recipe (the tag names are the protocol parsed by tools.py: keep
them in step)."""

from __future__ import annotations

# No placeholder text inside the tags: a small model copies it verbatim (SmolLM2-135M wrote
# "<search>a sub-question</search>" for every question when the prompt showed that), so the
# tags are described in words and the examples are whole, concrete turns.
AGENT_SYSTEM = (
    "You answer questions about a fictional world by researching them in a library. Each "
    "turn, write exactly one action, optionally after a short thought in <think></think>:\n"
    "- search: put what to look up between <search> and </search>; a research assistant "
    "searches the library and replies with a summary;\n"
    "- read: put a document id between <read> and </read> to get its full text;\n"
    "- answer: put only the short final answer (a name, a place, a number) between <answer> "
    "and </answer>; this ends the task.\n"
    "Replies come back inside <information></information>.\n\n"
    "Example, for the question 'Who founded Acme Works?':\n"
    "<search>Who founded Acme Works?</search>\n"
    "<information>Acme Works was founded by Ann Lee [c004].</information>\n"
    "<answer>Ann Lee</answer>"
)

SOLO_SYSTEM = (
    "You answer questions about a fictional world by researching them in a library. Each "
    "turn, write exactly one action, optionally after a short thought in <think></think>:\n"
    "- search: put search terms between <search> and </search>; the library's search engine "
    "replies with the passages it finds, each as [id] title: text;\n"
    "- read: put a document id between <read> and </read> to get its full text;\n"
    "- answer: put only the short final answer (a name, a place, a number) between <answer> "
    "and </answer>; this ends the task.\n"
    "Replies come back inside <information></information>.\n\n"
    "Example, for the question 'Who founded Acme Works?':\n"
    "<search>Who founded Acme Works?</search>\n"
    '<information>Results for "Who founded Acme Works?":\n'
    "[c004] Acme Works: Acme Works was founded by Ann Lee in 1801.</information>\n"
    "<answer>Ann Lee</answer>"
)

SEARCHER_SYSTEM = (
    "You are a research assistant with a search engine over a library. Each turn, either "
    "search, with search terms between <query> and </query> (one or more queries; results "
    "come back inside <information></information>), or finish with the facts that answer "
    "the question between <summary> and </summary>, citing document ids.\n\n"
    "Example, for 'Research this: Who founded Acme Works?':\n"
    "<query>Who founded Acme Works?</query>\n"
    "<information>[c004] Acme Works: Acme Works was founded by Ann Lee in 1801.</information>\n"
    "<summary>Acme Works was founded by Ann Lee [c004].</summary>"
)


VERIFIER_SYSTEM = (
    "You decide whether the evidence gathered so far answers a question about a fictional "
    "world. Each turn, either ask a research assistant to look something up, by putting it "
    "between <search> and </search> (a summary comes back inside "
    "<information></information>), or, when the evidence is enough to answer, reply "
    "<enough></enough> and a colleague will answer from it.\n\n"
    "Example, for the question 'Who founded Acme Works?':\n"
    "<search>Who founded Acme Works?</search>\n"
    "<information>Acme Works was founded by Ann Lee [c004].</information>\n"
    "<enough></enough>"
)

ANSWERER_SYSTEM = (
    "You answer a question about a fictional world from the evidence researchers gathered. "
    "Put only the short final answer (a name, a place, a number) between <answer> and "
    "</answer>.\n\n"
    "Example:\nQuestion: Who founded Acme Works?\nEvidence:\n- Who founded Acme Works? Acme "
    "Works was founded by Ann Lee [c004].\n<answer>Ann Lee</answer>"
)


def evidence_view(text: str, evidence: list[str]) -> str:
    """The answerer's prompt: the question and every search's summary."""
    listed = "\n".join(f"- {e.strip()}" for e in evidence) or "(none was gathered)"
    return f"Question: {text.strip()}\nEvidence:\n{listed}"


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
