"""House rules that a test can hold: recipes import only kernel and third-party packages
(never another recipe), every Python file opens with a docstring, heavy imports stay lazy."""

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PY_DIRS = ["kernel", "recipes", "retriever", "scripts", "tests"]


def _py_files():
    for d in PY_DIRS:
        yield from (ROOT / d).rglob("*.py")


def test_every_python_file_opens_with_a_docstring():
    missing = [
        str(p.relative_to(ROOT))
        for p in _py_files()
        if p.name != "__main__.py" and ast.get_docstring(ast.parse(p.read_text())) is None
    ]
    assert not missing, f"files without a module docstring: {missing}"


def test_recipes_never_import_another_recipe():
    offenders = []
    for recipe in (ROOT / "recipes").iterdir():
        if not recipe.is_dir() or recipe.name.startswith("_"):
            continue
        for p in recipe.rglob("*.py"):
            for node in ast.walk(ast.parse(p.read_text())):
                names = []
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                    names = [node.module]
                for name in names:
                    parts = name.split(".")
                    if parts[0] == "recipes" and parts[1:2] != [recipe.name]:
                        offenders.append(f"{p.relative_to(ROOT)} imports {name}")
    assert not offenders, offenders


def test_import_kernel_stays_light():
    code = (
        "import sys, kernel, kernel.run.config, kernel.buffer, kernel.loss, kernel.advantages\n"
        "heavy = [m for m in ('megatron', 'sglang', 'ray', 'transformers') if m in sys.modules]\n"
        "print(heavy)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout


def test_the_recipe_api_imports_without_the_training_stack():
    """A recipe's hooks (generate, reward, config) and the API they use (kernel.dialogue,
    hooks, sample) load without torch, transformers, the engine or the trainer."""
    recipes = sorted(p.name for p in (ROOT / "recipes").iterdir() if (p / "generate.py").exists())
    modules = ["kernel.dialogue", "kernel.hooks", "kernel.sample"] + [
        f"recipes.{r}.{m}" for r in recipes for m in ("generate", "reward", "config")
    ]
    code = (
        f"import importlib, sys\nfor m in {modules!r}: importlib.import_module(m)\n"
        "heavy = ('torch', 'transformers', 'kernel.engine', 'kernel.train', 'kernel.run.agents')\n"
        "print([m for m in heavy if m in sys.modules])"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    )
    assert len(recipes) >= 5 and out.stdout.strip() == "[]", out.stdout


# The kernel's layers, lowest first (docs/design.md): a module imports only from its own layer
# or below, never in a cycle, and at its top (only third-party heavy or optional packages --
# transformers, Megatron-core, Ray -- are imported inside functions).
LAYERS = {
    "core": (
        "sample",
        "hooks",
        "redact",
        "conversation",
        "dialogue",
        "rewards",
        "answers",
        "advantages",
        "loss",
        "metrics",
        "plot",
        "models",
        "toy",
        "sandbox",
        "auth",
        "",
    ),
    "data and rollout": ("benchmarks", "buffer", "rollout", "env"),
    "engine": ("engine",),
    "sync": ("sync",),
    "train": ("train",),
    "runtime": ("run",),
    "cli and cluster": ("cli", "__main__", "cluster"),
}


def _layer(module: str) -> int:
    """The layer of ``kernel.x.y`` (its first component after ``kernel``)."""
    head = module.split(".")[1] if "." in module else ""
    for i, names in enumerate(LAYERS.values()):
        if head in names:
            return i
    raise AssertionError(f"{module} is in no layer of LAYERS: place it")


def _kernel_imports():
    """(importer, imported, line, inside a function) for every kernel-internal import."""
    for path in sorted((ROOT / "kernel").rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        tree = ast.parse(path.read_text())
        lazy = {
            id(n)
            for f in ast.walk(tree)
            if isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef)
            for n in ast.walk(f)
        }
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            for name in names:
                if name.split(".")[0] == "kernel" and _is_module(name):
                    yield module, name, node.lineno, id(node) in lazy


def _is_module(name: str) -> bool:
    path = ROOT.joinpath(*name.split("."))
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


def test_kernel_imports_point_down_the_layers_without_cycles():
    order = list(LAYERS)
    upward, lazy, graph = [], [], {}
    for importer, imported, line, in_function in _kernel_imports():
        if imported == importer or importer.startswith(imported + "."):
            continue  # a package's own __init__, or a module of a package importing it
        if _layer(imported) > _layer(importer):
            upward.append(
                f"{importer}:{line} ({order[_layer(importer)]}) imports {imported} "
                f"({order[_layer(imported)]})"
            )
        if in_function:
            lazy.append(f"{importer}:{line} imports {imported} inside a function")
        graph.setdefault(importer, set()).add(imported)
    assert not upward, "upward imports:\n" + "\n".join(upward)
    assert not lazy, "in-function kernel imports:\n" + "\n".join(lazy)
    cycles = _cycles(graph)
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle through each module that is on one (depth-first search)."""
    found, done = [], set()

    def visit(node, path):
        if node in path:
            found.append([*path[path.index(node) :], node])
            return
        if node in done:
            return
        for nxt in sorted(graph.get(node, ())):
            visit(nxt, [*path, node])
        done.add(node)

    for node in sorted(graph):
        visit(node, [])
    return found
