"""A tool-use environment (MRLM's tools): a task the agent may solve with a calculator, the
retriever's search, a Python REPL in the kernel's sandbox and a scratch file system of its own.

Each action is one tag: a tool call, whose output is the next observation, or the answer, which
ends the episode and is scored against the row's label::

    <calculator>4821 * 937</calculator>          arithmetic: + - * / // % ** and brackets
    <python>print(sum(range(10)))</python>        a REPL: earlier cells' names stay defined
    <search>capital of Peru</search>              the retriever's top ``search_topk`` passages
    <write path="notes.txt">text</write>          the episode's scratch folder (``max_files``)
    <read>notes.txt</read>
    <answer>4517277</answer>

Rewards: the answer's ``answer_reward`` when it equals the label (numbers compared as numbers,
text case- and space-insensitively), else 0; ``call_reward`` (default 0) for a tool call that
worked, ``error_penalty`` (default 0) for one that failed or names a tool the episode lacks;
``format_penalty`` for an action that is no tag (the episode goes on: the observation says what
it accepts). The first complete tag is the action; with none, the first tag it opens and never
closes runs to the action's end (``parse_action``, one linear pass). Whatever a tool call runs
into -- a refusal, an overflow, an OS error, a retriever answering nonsense -- is an error
observation (``<tool> error: why``) and the episode goes on. ``info`` counts calls per tool and
errors, so a run shows which tools an agent learned to use.

Confinement: the calculator evaluates a parsed expression tree (no names, no calls; its
length, numbers, exponents and results bounded), never ``eval``; Python runs in
``kernel.sandbox`` (its limits, no network, a fresh process per call that replays the earlier
cells with their output muted); the scratch folder is a temporary directory removed on close,
and a path that leaves it (absolute, ``..``, a link) or is too long (over 255 bytes a name,
1024 characters or 16 folders in all) is refused. Search is on only with a
``retriever_url`` (a keyed retriever's key in ``retriever_key_file``, mode 600). Hosted by
``kernel env serve``, every step runs in a worker process under the server's deadline
(``kernel.env.workers``).

The first observation is the task, then the tags of the episode's tools (only those it has) and,
when set, ``example``: a worked call and answer, which a small model needs to find the format.
"""

from __future__ import annotations

import ast
import math
import operator
import re
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

import httpx

from kernel.answers import doubt
from kernel.auth import read_key_file
from kernel.env import BadAction, Observation
from kernel.sandbox import Sandbox, SandboxConfig, parse_python

TAGS = ("calculator", "python", "search", "read", "answer")
# Where a tag opens; a path holds no '"' or '<', so each try stops at the next '<' (the scan is
# linear: an action of thousands of unclosed tags costs one pass, not one per tag).
_OPENS = re.compile(r'<(calculator|python|search|read|answer)>|<write\s+path="([^"<]*)">')


class Action(NamedTuple):
    """The tag an action uses: its name, its body (a write's text) and a write's path."""

    tag: str
    body: str
    path: str | None = None


def parse_action(action: str) -> Action | None:
    """The first complete tag of ``action`` (``<tag>body</tag>``, the body up to the nearest
    closing tag), else the first tag it opens and never closes, its body running to the end (a
    small model often stops at its end-of-turn token instead of writing the closing tag; an
    unclosed write has no end and is no tag); None when it has no tag. Linear in its length."""
    closes = {tag: action.rfind(f"</{tag}>") for tag in (*TAGS, "write")}  # the last of each
    unclosed = None
    for m in _OPENS.finditer(action):
        tag = m[1] or "write"
        if closes[tag] >= m.end():  # closed after it: the nearest close ends its body
            return Action(tag, action[m.end() : action.find(f"</{tag}>", m.end())], m[2])
        if unclosed is None and tag != "write":
            unclosed = Action(tag, action[m.end() :])
    return unclosed


SYNTAX = {
    "calculator": "<calculator>EXPR</calculator>",
    "python": "<python>CODE</python>",
    "search": "<search>QUERY</search>",
    "write": '<write path="FILE">TEXT</write>',
    "read": "<read>FILE</read>",
}
TOOLS = tuple(SYNTAX)  # the tools an episode may have


def help_text(tools: tuple[str, ...]) -> str:
    """What an action may be: the tags of the episode's tools, and the answer."""
    tags = ", ".join(SYNTAX[t] for t in tools)
    return f"Use one tag per turn: {tags} or <answer>ANSWER</answer>."


_OPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
}
MAX_EXPONENT, MAX_MAGNITUDE = 64, 10**40


MAX_EXPRESSION_CHARS = 4000


def calculate(expression: str) -> int | float:
    """The value of an arithmetic ``expression``; ValueError naming what it refuses. Every
    number in it and every result on the way is at most MAX_MAGNITUDE and every exponent at
    most MAX_EXPONENT, so no step takes long; an overflow, a complex result or nesting too
    deep for the parser is refused too."""
    text = expression.strip()
    if len(text) > MAX_EXPRESSION_CHARS:
        raise ValueError(f"an expression has at most {MAX_EXPRESSION_CHARS} characters")
    try:
        tree = parse_python(text, mode="eval").body
    except SyntaxError:
        raise ValueError(f"not an arithmetic expression: {text[:80]!r}") from None
    except (RecursionError, MemoryError):
        raise ValueError("the expression is nested too deeply") from None

    def value(node: ast.AST) -> int | float:
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            if abs(node.value) > MAX_MAGNITUDE:
                raise ValueError("a number in it is too large")
            return node.value
        if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](value(node.operand))
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            left, right = value(node.left), value(node.right)
            if isinstance(node.op, ast.Pow) and abs(right) > MAX_EXPONENT:
                raise ValueError(f"exponent {right} is larger than {MAX_EXPONENT}")
            out = _OPS[type(node.op)](left, right)
            if isinstance(out, complex):
                raise ValueError("the result is not a real number")
            if abs(out) > MAX_MAGNITUDE:
                raise ValueError("the result is too large")
            return out
        raise ValueError(f"only numbers and + - * / // % ** are allowed, not {ast.unparse(node)!r}")

    try:
        return value(tree)
    except ZeroDivisionError:
        raise ValueError("division by zero") from None
    except ArithmeticError:  # OverflowError: 1e300 ** 2
        raise ValueError("the result is too large") from None
    except (RecursionError, MemoryError):
        raise ValueError("the expression is nested too deeply") from None


# a number as an answer: signed, thousands separators only where they separate thousands
# ("4,517,277"; "4,5" is two numbers), maybe a decimal part or an exponent
_NUMBER = re.compile(r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d*)?(?:[eE][-+]?\d+)?")


def _number(text: str) -> int | float | None:
    """``text`` as a number (an int when it is a whole number written without a decimal part or
    an exponent), else None."""
    text = text.strip()
    if _NUMBER.fullmatch(text) is None:
        return None
    plain = text.replace(",", "")
    return int(plain) if plain.lstrip("+-").isdigit() else float(plain)


def same_answer(answer: str, label: str) -> bool:
    """Numbers equal as numbers (``4,517,277`` == ``4517277.0``; two whole numbers exactly,
    others within 1e-9 relative), text up to case and spaces."""
    a, b = _number(answer), _number(label)
    if a is not None and b is not None:
        if isinstance(a, int) and isinstance(b, int):
            return a == b
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-6)
    return " ".join(answer.lower().split()) == " ".join(label.lower().split())


def answer_stands(action: str) -> bool:
    """Whether the action's ``<answer>`` is one answer it commits to: no second ``<answer>``,
    and no negation, hedge or alternative around it or in it ("It is not <answer>5</answer>",
    "Maybe <answer>5</answer>", "<answer>5 or 6</answer>"), as ``kernel.answers`` reads a
    marked answer."""
    start = action.find("<answer>")
    if start < 0 or action.find("<answer>", start + 1) >= 0:
        return False
    close = action.find("</answer>", start)
    end = len(action) if close < 0 else close + len("</answer>")
    body = action[start + len("<answer>") : close if close >= 0 else len(action)]
    return doubt(action, start, body, end) is None


MAX_PATH_CHARS, MAX_PATH_DEPTH = 1024, 16


def _reason(e: Exception) -> str:
    """What went wrong, for the agent: a refusal's own words; an OS error's reason without the
    server's paths (``File name too long``, ``Not a directory``)."""
    if isinstance(e, OSError):
        return e.strerror or type(e).__name__
    if isinstance(e, ValueError):
        return str(e)[:500]
    return f"{type(e).__name__}: {str(e)[:500]}"


_SANDBOXES: dict[str, Sandbox] = {}


def _sandbox(cfg: SandboxConfig) -> Sandbox:
    """One sandbox per distinct settings, shared by every episode (making one probes what
    confinement the machine allows by starting child processes)."""
    if repr(cfg) not in _SANDBOXES:
        _SANDBOXES[repr(cfg)] = Sandbox(cfg)
    return _SANDBOXES[repr(cfg)]


def _bearer(key_file: str | None) -> dict[str, str] | None:
    """The retriever's Authorization header from ``retriever_key_file`` (mode 600, read by
    ``kernel.auth.read_key_file``), None without one. Not the environment: the environment
    server's own key is there, and a retriever must not learn it."""
    if key_file is None:
        return None
    try:
        return {"Authorization": f"Bearer {read_key_file(key_file)}"}
    except ValueError as e:
        raise ValueError(str(e).replace("--api_key_file", "tools: retriever_key_file", 1)) from None


class ToolEnv:
    """One task with tools (keyword args below); see the module docstring."""

    def __init__(
        self,
        tools: list[str] | tuple[str, ...] = ("calculator", "python", "write", "read"),
        retriever_url: str | None = None,
        retriever_key_file: str | None = None,
        search_topk: int = 3,
        answer_reward: float = 1.0,
        format_penalty: float = -0.1,
        call_reward: float = 0.0,
        error_penalty: float = 0.0,
        max_output_chars: int = 1000,
        max_files: int = 16,
        max_file_chars: int = 20000,
        sandbox: Mapping[str, Any] | None = None,
        example: str | None = None,
    ) -> None:
        if unknown := sorted(set(tools) - set(TOOLS)):
            raise ValueError(f"tools: unknown {unknown} (known: {list(TOOLS)})")
        if "search" in tools and not retriever_url:
            raise ValueError("tools: search needs a retriever_url")
        self.tools, self.retriever_url, self.search_topk = tuple(tools), retriever_url, search_topk
        self.retriever_headers = _bearer(retriever_key_file)
        self.answer_reward, self.format_penalty = answer_reward, format_penalty
        self.call_reward, self.error_penalty = call_reward, error_penalty
        self.help = help_text(self.tools)
        self.example = example
        self.max_output_chars, self.max_files = max_output_chars, max_files
        self.max_file_chars = max_file_chars
        self.sandbox_cfg = SandboxConfig(**(sandbox or {})).validate()
        self.label: str | None = None
        self.folder: Path | None = None
        self.cells: list[str] = []
        self.counts: dict[str, float] = {}

    async def reset(self, item: Mapping[str, Any]) -> Observation:
        if not item.get("prompt") or item.get("label") is None:
            raise BadAction("tools: an item needs 'prompt' and 'label' (the answer)")
        self.label = str(item["label"])
        self.folder = Path(tempfile.mkdtemp(prefix="tandem-scratch-"))
        example = f" {self.example}" if self.example else ""
        return Observation(f"{item['prompt']}\n\n{self.help}{example}")

    async def step(self, action: str) -> Observation:
        if self.label is None:
            raise BadAction("tools: step before reset or after the episode ended")
        obs = await self._act(action)
        obs.info = {**self.counts, **obs.info}
        return obs

    async def _act(self, action: str) -> Observation:
        match = parse_action(action)
        if match is None:
            self._count("no_tag")
            return Observation(self.help, self.format_penalty)
        tag = match.tag
        if tag == "answer":
            right = answer_stands(action) and same_answer(match.body, self.label)
            self.label = None
            return Observation("", self.answer_reward if right else 0.0, True, {"correct": right})
        self._count(f"calls_{tag}")
        if tag not in self.tools:
            self._count("errors")
            return Observation(f"{tag} is not available here. {self.help}", self.error_penalty)
        try:
            output = await getattr(self, f"_{tag}")(match)
        except Exception as e:  # whatever a tool call runs into, the agent reads it and goes on
            self._count("errors")
            return Observation(f"{tag} error: {_reason(e)}", self.error_penalty)
        return Observation(output[: self.max_output_chars], self.call_reward)

    def _count(self, key: str) -> None:
        self.counts[key] = self.counts.get(key, 0.0) + 1.0

    async def _calculator(self, match: Action) -> str:
        return str(calculate(match.body))

    async def _python(self, match: Action) -> str:
        cell = match.body.strip("\n")
        replay = "".join(
            "import contextlib as _c, io as _io\nwith _c.redirect_stdout(_io.StringIO()):\n"
            f"    exec(compile({c!r}, '<cell {i}>', 'exec'))\n"
            for i, c in enumerate(self.cells)
        )
        result = await _sandbox(self.sandbox_cfg).run(replay + cell)
        if result.status != "passed":
            raise ValueError(f"{result.status}: {(result.error or result.stderr).strip()[-500:]}")
        self.cells.append(cell)
        return result.stdout or "(no output)"

    async def _search(self, match: Action) -> str:
        body = {"queries": [match.body.strip()], "topk": self.search_topk}
        try:
            async with httpx.AsyncClient(timeout=10.0) as http:
                url = f"{self.retriever_url.rstrip('/')}/retrieve"
                r = await http.post(url, json=body, headers=self.retriever_headers)
                r.raise_for_status()
        except httpx.HTTPError as e:
            raise ValueError(f"the retriever did not answer ({type(e).__name__})") from None
        try:
            docs = r.json()["results"][0]
            return "\n\n".join(f"[{d.get('title', '')}] {d.get('text', '')}" for d in docs)
        except (ValueError, LookupError, TypeError, AttributeError):
            raise ValueError("the retriever answered in an unexpected shape") from None

    def _path(self, name: str) -> Path:
        name = name.strip()
        parts = Path(name).parts
        if len(name) > MAX_PATH_CHARS or any(len(p.encode()) > 255 for p in parts):
            raise ValueError(f"a path has at most {MAX_PATH_CHARS} characters, 255 per name")
        if len(parts) > MAX_PATH_DEPTH:
            raise ValueError(f"a path is at most {MAX_PATH_DEPTH} folders deep")
        path = (self.folder / name).resolve()
        if not name or Path(name).is_absolute() or not path.is_relative_to(self.folder.resolve()):
            raise ValueError(f"{name!r} is outside the scratch folder")
        return path

    async def _write(self, match: Action) -> str:
        path, text = self._path(match.path or ""), match.body
        if len(text) > self.max_file_chars:
            raise ValueError(f"a file holds at most {self.max_file_chars} characters")
        if not path.exists() and len(list(self.folder.rglob("*"))) >= self.max_files:
            raise ValueError(f"the scratch folder holds at most {self.max_files} files")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        return f"wrote {len(text)} characters to {match.path.strip()}"

    async def _read(self, match: Action) -> str:
        path = self._path(match.body)
        if not path.is_file():
            raise ValueError(f"no file {match.body.strip()!r}")
        with path.open() as f:
            return f.read(self.max_file_chars)

    async def close(self) -> None:
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)
        self.folder, self.label, self.cells = None, None, []
