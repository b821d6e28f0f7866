"""Reading model-written Python: the code in a reply, the functions it defines, HumanEval's
tests as separate checks, and the facts the collaboration reward asks about (does ``main``
call ``aux``, is it only a wrapper, does it drop what ``aux`` returns). Pure functions over
text and ``ast``; golden-tested in tests/recipes/test_code_pair.py."""

from __future__ import annotations

import ast
import re

_FENCE = re.compile(r"```(?:python|py)?[ \t]*\n(.*?)(?:```|$)", re.DOTALL)


def extract_code(reply: str) -> str:
    """The code of a reply: the first fenced block if there is one (an unclosed fence runs to
    the end), else the whole reply; surrounding blank lines stripped."""
    m = _FENCE.search(reply)
    return (m.group(1) if m else reply).strip("\n")


def parse(code: str) -> ast.Module | None:
    """The module's syntax tree, or None when it does not parse."""
    try:
        return ast.parse(code)
    except (SyntaxError, ValueError):
        return None


def find_function(code: str, name: str) -> str | None:
    """The source of the top-level ``def name`` in ``code`` (the last one if redefined), or
    None when it does not parse or has none."""
    tree = parse(code)
    if tree is None:
        return None
    found = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name]
    return ast.get_source_segment(code, found[-1]) if found else None


def returns_something(function: str) -> bool:
    """Whether the function (its source) has a ``return`` with a value (a bare ``pass`` or a
    docstring alone is no implementation)."""
    tree = parse(function)
    return tree is not None and any(
        isinstance(n, ast.Return) and n.value is not None for n in ast.walk(tree)
    )


def context_of(prompt: str, entry_point: str) -> str:
    """What a problem's prompt gives the solution besides the function to write: its top-level
    imports (HumanEval's ``from typing import List``) and the other functions it defines in
    full (``is_palindrome`` beside ``make_palindrome``), so a solution that uses them runs."""
    tree = parse(prompt)
    if tree is None:
        return ""
    kept = [
        n
        for n in tree.body
        if isinstance(n, ast.Import | ast.ImportFrom)
        or (isinstance(n, ast.FunctionDef) and n.name != entry_point)
    ]
    return "\n\n".join(ast.get_source_segment(prompt, n) for n in kept)


def split_tests(test_code: str, entry_point: str) -> tuple[str, list[str]]:
    """HumanEval's ``def check(candidate)`` as (setup, checks): each top-level statement of
    its body that asserts (an ``assert``, or a loop or block holding one) is one check; the
    other statements, and the module's own lines before ``check`` (imports, METADATA), are
    setup that runs first, with ``candidate`` bound to ``entry_point``. A test module without
    ``check`` is one check that runs whole."""
    tree = parse(test_code)
    if tree is None:
        return "", [test_code]
    check = next(
        (n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "check"), None
    )
    if check is None:
        return "", [test_code]
    setup = [ast.get_source_segment(test_code, n) for n in tree.body if n is not check]
    setup.append(f"candidate = {entry_point}")
    checks = []
    for node in check.body:
        text = ast.get_source_segment(test_code, node)
        if any(isinstance(n, ast.Assert) for n in ast.walk(node)):
            checks.append(text)
        elif not (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)):
            setup.append(text)  # not the docstring
    return "\n".join(setup), checks


def _calls(tree: ast.AST, name: str) -> list[ast.Call]:
    return [
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == name
    ]


def calls(function: str, name: str) -> bool:
    """Whether the function's source calls ``name(...)``."""
    tree = parse(function)
    return tree is not None and bool(_calls(tree, name))


def is_wrapper(function: str, name: str) -> bool:
    """Whether the function does nothing but return ``name(...)``: its body (docstring aside)
    is one ``return`` of a call to ``name``."""
    tree = parse(function)
    if tree is None or not tree.body or not isinstance(tree.body[0], ast.FunctionDef):
        return False
    body = [
        n
        for n in tree.body[0].body
        if not (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant))
    ]
    return (
        len(body) == 1
        and isinstance(body[0], ast.Return)
        and isinstance(body[0].value, ast.Call)
        and isinstance(body[0].value.func, ast.Name)
        and body[0].value.func.id == name
    )


def drops_result(function: str, name: str) -> bool:
    """Whether some call of ``name`` is a statement of its own, its result thrown away."""
    tree = parse(function)
    return tree is not None and any(
        isinstance(n, ast.Expr)
        and isinstance(n.value, ast.Call)
        and isinstance(n.value.func, ast.Name)
        and n.value.func.id == name
        for n in ast.walk(tree)
    )
