"""Plain data as text and back: how a value crosses between code_pair's processes.

A check's result leaves the candidate's process as text (``dump``) and is read back in the
parent (``load``) as a value of exact builtin types -- None, bool, int, float, str, bytes, and
lists, tuples, dicts, sets and frozensets of them -- so the parent's comparison runs only
builtin ``==``, ``abs``, ``sorted`` and the like, never a method the candidate defined. ``dump``
refuses anything else (a subclass of a builtin too: its ``__eq__`` or ``__repr__`` could lie);
``load`` builds the value from the syntax tree of the text, evaluating nothing.

This file is also run as it is inside the sandboxed processes (standard library only, nothing
at import time but definitions), so the parent and the children share one definition.
"""

from __future__ import annotations

ATOMS = (type(None), bool, int, float, str, bytes)
CONTAINERS = (list, tuple, dict, set, frozenset)
PLAIN_TYPES = "None, bool, int, float, str, bytes and lists, tuples, dicts, sets of them"


def dump(value: object) -> str:
    """``value`` as one line of Python-literal text ``load`` reads back; TypeError naming the
    first value of another type (exact types: a subclass of ``int`` is not an int here)."""
    kind = type(value)
    if kind is float:
        if value != value:  # NaN, the one value not equal to itself
            return 'float("nan")'
        if value in (float("inf"), float("-inf")):
            return 'float("inf")' if value > 0 else 'float("-inf")'
        return repr(value)
    if kind is int:
        # hex has no length limit (decimal str() refuses more than 4300 digits)
        return repr(value) if -(2**64) < value < 2**64 else hex(value)
    if kind in (type(None), bool, str, bytes):
        return repr(value)
    if kind is list:
        return "[" + ", ".join(dump(v) for v in value) + "]"
    if kind is tuple:
        inner = ", ".join(dump(v) for v in value)
        return "(" + inner + ("," if len(value) == 1 else "") + ")"
    if kind is dict:
        return "{" + ", ".join(dump(k) + ": " + dump(v) for k, v in value.items()) + "}"
    if kind is set:
        return "{" + ", ".join(dump(v) for v in value) + "}" if value else "set()"
    if kind is frozenset:
        return "frozenset({" + ", ".join(dump(v) for v in value) + "})" if value else "frozenset()"
    raise TypeError(f"{kind.__name__} is not plain data ({PLAIN_TYPES})")


def load(text: str) -> object:
    """The value ``dump`` wrote, built from the text's syntax tree (nothing is evaluated);
    ValueError for anything but plain-data literals."""
    import ast  # here, not at the top: the sandboxed children only dump (standard library only)

    from kernel.sandbox import parse_python

    try:
        tree = parse_python(text, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        raise ValueError(f"not plain data: {type(exc).__name__}") from None

    def special(node: ast.expr) -> object:
        # float("nan"), float("inf"), float("-inf"), set(), frozenset({...})
        if not (isinstance(node.func, ast.Name) and not node.keywords):
            raise ValueError("not plain data: a call")
        name, args = node.func.id, node.args
        constant = len(args) == 1 and isinstance(args[0], ast.Constant)
        if name == "float" and constant and args[0].value in ("nan", "inf", "-inf"):
            return float(args[0].value)
        if name == "set" and not args:
            return set()
        if name == "frozenset" and not args:
            return frozenset()
        if name == "frozenset" and len(args) == 1 and isinstance(args[0], ast.Set):
            return frozenset(build(args[0]))
        raise ValueError(f"not plain data: a call of {name}")

    def build(node: ast.expr) -> object:
        if isinstance(node, ast.Constant):
            if type(node.value) in ATOMS:
                return node.value
            raise ValueError(f"not plain data: {type(node.value).__name__}")
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
            operand = build(node.operand)
            if type(operand) not in (int, float):
                raise ValueError("not plain data: a sign on a non-number")
            return -operand if isinstance(node.op, ast.USub) else operand
        if isinstance(node, ast.List):
            return [build(e) for e in node.elts]
        if isinstance(node, ast.Tuple):
            return tuple(build(e) for e in node.elts)
        if isinstance(node, ast.Set):
            return {build(e) for e in node.elts}
        if isinstance(node, ast.Dict):
            if any(k is None for k in node.keys):
                raise ValueError("not plain data: ** in a dict")
            return {build(k): build(v) for k, v in zip(node.keys, node.values, strict=True)}
        if isinstance(node, ast.Call):
            return special(node)
        raise ValueError(f"not plain data: {type(node).__name__}")

    try:
        return build(tree.body)
    except (TypeError, RecursionError, MemoryError) as exc:  # an unhashable key, too deep
        raise ValueError(f"not plain data: {type(exc).__name__}") from None
