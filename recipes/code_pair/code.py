"""Reading model-written Python: the code in a reply, the functions it defines, HumanEval's
tests as separate checks (and each check's asserts as calls with an expected value, for
checks.py), and the facts the collaboration reward asks about (does ``main`` call ``aux``, is
it only a wrapper, does it drop what ``aux`` returns). Pure functions over text and ``ast``;
golden-tested in tests/recipes/test_code_pair.py."""

from __future__ import annotations

import ast
import re

from kernel.sandbox import parse_python

_FENCE = re.compile(r"```(?:python|py)?[ \t]*\n(.*?)(?:```|$)", re.DOTALL)


def extract_code(reply: str) -> str:
    """The code of a reply: the first fenced block if there is one (an unclosed fence runs to
    the end), else the whole reply; surrounding blank lines stripped."""
    m = _FENCE.search(reply)
    return (m.group(1) if m else reply).strip("\n")


def parse(code: str) -> ast.Module | None:
    """The module's syntax tree, or None when it does not parse."""
    try:
        return parse_python(code)
    except (SyntaxError, ValueError, RecursionError, MemoryError):  # nested past the parser
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


def split_tests(test_code: str) -> tuple[str, list[str]]:
    """A test module as (setup, checks): each top-level statement of ``def check(candidate)``'s
    body that asserts (an ``assert``, or a loop or block holding one) is one check; the other
    statements, and the module's own lines besides ``check`` (imports, METADATA), are setup
    that runs first. A module without ``check`` is read the same way at its top level (its
    checks then call the entry point by name). Code that does not parse is one check."""
    tree = parse(test_code)
    if tree is None:
        return "", [test_code]
    check = next(
        (n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "check"), None
    )
    if check is None:
        setup, body = [], tree.body
    else:
        setup = [ast.get_source_segment(test_code, n) for n in tree.body if n is not check]
        body = check.body
    checks = []
    for node in body:
        text = ast.get_source_segment(test_code, node)
        if any(isinstance(n, ast.Assert) for n in ast.walk(node)):
            checks.append(text)
        elif not (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)):
            setup.append(text)  # not the docstring
    return "\n".join(setup), checks


# The name the converted checks call in place of each assert on the candidate (checks.py binds
# it in the trusted process that computes the expected values).
RECORD = "__tandem_check__"
CONVERTED, NO_CALL, UNCONVERTIBLE = "converted", "no_call", "unconvertible"
_OPS = {ast.Eq: "==", ast.NotEq: "!=", ast.Is: "is", ast.IsNot: "is not"}
_CLOSE = {ast.Lt: "abs<", ast.LtE: "abs<="}


def convert_check(check: str, entry_point: str) -> tuple[str, str]:
    """One check as (kind, text): ``converted`` with the check's code where each assert on the
    candidate is a call ``__tandem_check__(op, wrappers, negate, args, kwargs, expected,
    extra)`` (so the trusted process that runs it records each call's arguments and expected
    value instead of calling anything), ``no_call`` when it never names the candidate
    (``assert True``), or ``unconvertible`` with the reason.

    The asserts converted (``candidate`` or the entry point by name; W a chain of one-argument
    calls such as ``tuple(...)``, checked later to be builtins; E any expression that does not
    name the candidate; each may be under ``not``)::

        assert W(candidate(args)) == E      (also !=, is, is not; E on either side)
        assert W(candidate(args))           (truth)
        assert abs(W(candidate(args)) - E) < T    (also <=, math.fabs, E - ... )
        assert math.isclose(W(candidate(args)), E, rel_tol=..., abs_tol=...)

    A check is unconvertible when it names the candidate anywhere else: its result kept in a
    variable and tested by other code (HumanEval/32's ``poly(coeffs, solution)``), or the entry
    point on the expected side (HumanEval/33 compares ``candidate(x)`` with ``sort_third(x)``,
    the function itself)."""
    tree = parse(check)
    if tree is None:
        return UNCONVERTIBLE, "the check does not parse"
    names = {"candidate", entry_point}
    if not _names(tree, names):
        return NO_CALL, "the check never calls the candidate"
    converted = _Converter(names).visit(tree)
    if _names(converted, names):
        return UNCONVERTIBLE, "the candidate's result is used other than in a comparison"
    return CONVERTED, ast.unparse(ast.fix_missing_locations(converted))


def _names(tree: ast.AST, names: set[str]) -> bool:
    return any(isinstance(n, ast.Name) and n.id in names for n in ast.walk(tree))


class _Converter(ast.NodeTransformer):
    """Each assert of a convertible shape (``convert_check``) as a record call; others kept."""

    def __init__(self, names: set[str]) -> None:
        self.names = names

    def free(self, node: ast.AST) -> bool:
        return not _names(node, self.names)

    def unwrap(self, node: ast.expr) -> tuple[list[ast.expr], ast.Call] | None:
        """(wrappers outermost first, the candidate's call) of ``W(candidate(args))``."""
        wrappers = []
        while (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id not in self.names
            and len(node.args) == 1
            and not node.keywords
            and not isinstance(node.args[0], ast.Starred)
        ):
            wrappers.append(node.func)
            node = node.args[0]
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in self.names
            and all(self.free(a) for a in node.args)
            and all(self.free(k.value) for k in node.keywords)
        ):
            return wrappers, node
        return None

    def one_side(self, a: ast.expr, b: ast.expr):
        """(side, wrappers, call, other): the candidate's side of two operands (0: ``a``)."""
        for side, (mine, other) in enumerate(((a, b), (b, a))):
            found = self.unwrap(mine)
            if found and self.free(other):
                return side, *found, other
        return None

    def match(self, test: ast.expr) -> tuple | None:
        """(op, wrappers, negate, call, expected, extra) of an assert's test, or None."""
        negate = False
        while isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
            negate, test = not negate, test.operand
        if isinstance(test, ast.Compare) and len(test.ops) == 1:
            left, op, right = test.left, type(test.ops[0]), test.comparators[0]
            if op in _OPS and (found := self.one_side(left, right)):
                _, wrappers, call, other = found
                return _OPS[op], wrappers, negate, call, other, ast.Constant(None)
            if (
                op in _CLOSE
                and isinstance(left, ast.Call)
                and len(left.args) == 1
                and not left.keywords
                and isinstance(left.args[0], ast.BinOp)
                and isinstance(left.args[0].op, ast.Sub)
                and self.free(left.func)
                and self.free(right)
                and (found := self.one_side(left.args[0].left, left.args[0].right))
            ):
                side, wrappers, call, other = found
                extra = ast.Tuple([right, left.func, ast.Constant(side)], ast.Load())
                return _CLOSE[op], wrappers, negate, call, other, extra
            return None
        if (
            isinstance(test, ast.Call)
            and len(test.args) == 2
            and not any(isinstance(a, ast.Starred) for a in test.args)
            and all(k.arg is not None and self.free(k.value) for k in test.keywords)
            and self.free(test.func)
            and (found := self.one_side(*test.args))
        ):
            side, wrappers, call, other = found
            kwargs = ast.Dict(
                [ast.Constant(k.arg) for k in test.keywords], [k.value for k in test.keywords]
            )
            extra = ast.Tuple([test.func, kwargs, ast.Constant(side)], ast.Load())
            return "isclose", wrappers, negate, call, other, extra
        if found := self.unwrap(test):
            wrappers, call = found
            return "truth", wrappers, negate, call, ast.Constant(None), ast.Constant(None)
        return None

    def visit_Assert(self, node: ast.Assert) -> ast.AST:
        found = self.match(node.test)
        if found is None:
            return node
        op, wrappers, negate, call, expected, extra = found
        load = ast.Load()
        args = ast.Tuple(list(call.args), load)  # a Starred argument stays starred
        kwargs = ast.Dict(
            [ast.Constant(k.arg) if k.arg else None for k in call.keywords],
            [k.value for k in call.keywords],
        )
        record = ast.Call(
            ast.Name(RECORD, load),
            [
                ast.Constant(op),
                ast.Tuple(wrappers, load),
                ast.Constant(negate),
                args,
                kwargs,
                expected,
                extra,
            ],
            [],
        )
        return ast.copy_location(ast.Expr(record), node)


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
