"""House rules that a test can hold: recipes import only kernel and third-party packages
(never another recipe, never the repository's scripts), a recipe folder copied out of the
repository still imports and runs, every Python file opens with a docstring, heavy imports stay
lazy."""

import ast
import json
import os
import shutil
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


RECIPES = sorted(
    p for p in (ROOT / "recipes").iterdir() if p.is_dir() and not p.name.startswith("_")
)
# folders of this repository that the installed package does not ship (pyproject.toml's
# packages: kernel, retriever, recipes): a recipe importing them breaks once copied out
NOT_INSTALLED = ("scripts", "tests")


def _recipe_imports():
    """(recipe folder, file, line, imported module) for every absolute import in a recipe,
    inside functions too."""
    for recipe in RECIPES:
        for p in sorted(recipe.rglob("*.py")):
            for node in ast.walk(ast.parse(p.read_text())):
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                    names = [node.module]
                else:
                    continue
                for name in names:
                    yield recipe, p, node.lineno, name


def test_recipes_never_import_another_recipe():
    offenders = [
        f"{p.relative_to(ROOT)}:{line} imports {name}"
        for recipe, p, line, name in _recipe_imports()
        if name.split(".")[0] == "recipes" and name.split(".")[1:2] != [recipe.name]
    ]
    assert not offenders, offenders


def test_recipes_never_import_the_repositorys_scripts_or_tests():
    """What a recipe needs from outside its folder comes from ``kernel`` (e.g. reading a
    finished run: ``kernel.run.results``), never from ``scripts/`` or ``tests/``, which a
    copied recipe does not have."""
    offenders = [
        f"{p.relative_to(ROOT)}:{line} imports {name}"
        for _, p, line, name in _recipe_imports()
        if name.split(".")[0] in NOT_INSTALLED
    ]
    assert not offenders, offenders


def _outside(tmp_path: Path) -> tuple[Path, dict]:
    """A project folder outside the repository holding a ``recipes`` package of its own, and
    an environment for a child run there: no PYTHONPATH, so only the installed ``tandem``
    (kernel) and the project folder (the child's working directory) are importable."""
    project = tmp_path / "project"
    assert not project.resolve().is_relative_to(ROOT)
    (project / "recipes").mkdir(parents=True)
    (project / "recipes" / "__init__.py").write_text('"""My recipes."""\n')
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return project, env


def _copy(recipe: Path, dest: Path) -> None:
    shutil.copytree(recipe, dest, ignore=shutil.ignore_patterns("__pycache__"))


def test_every_recipe_module_imports_from_a_copy_outside_the_repository(tmp_path):
    """Each recipe folder copied into another project's ``recipes/``: every module of it
    imports there, from the copy, with ``scripts`` and ``tests`` out of reach."""
    project, env = _outside(tmp_path)
    for recipe in RECIPES:
        _copy(recipe, project / "recipes" / recipe.name)
    code = (
        "import importlib, importlib.util, json, pathlib\n"
        "mods = sorted('.'.join(p.with_suffix('').parts) for p in "
        "pathlib.Path('recipes').rglob('*.py'))\n"
        "failed = {}\n"
        "for m in mods:\n"
        "    try:\n"
        "        importlib.import_module(m.removesuffix('.__init__'))\n"
        "    except Exception as e:\n"
        "        failed[m] = repr(e)\n"
        "import recipes\n"
        "print(json.dumps({'n': len(mods), 'failed': failed, 'from': recipes.__file__,\n"
        "    'reachable': [n for n in ('scripts', 'tests') if importlib.util.find_spec(n)]}))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=project, env=env
    )
    assert out.returncode == 0, out.stderr[-3000:]
    found = json.loads(out.stdout.strip().splitlines()[-1])
    assert found["reachable"] == [] and Path(found["from"]).parent == project / "recipes"
    assert found["n"] > 2 * len(RECIPES) and not found["failed"], found["failed"]


def test_a_copied_recipe_runs_its_tiny_preset_outside_the_repository(tmp_path):
    """The template copied as another project's ``recipes/my_recipe`` (its presets renamed, as
    its README says) trains a step of its tiny preset with ``python -m kernel train --recipe
    my_recipe`` run from that project's folder: hooks, config, preset and data all from the
    copy (the repository has no my_recipe)."""
    project, env = _outside(tmp_path)
    mine = project / "recipes" / "my_recipe"
    _copy(ROOT / "recipes" / "template", mine)
    for preset in (mine / "presets").glob("*.yaml"):
        preset.write_text(preset.read_text().replace("template", "my_recipe"))
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "kernel", "train", "--recipe", "my_recipe", "--preset", "tiny"]
    cmd += ["--num_steps", "1", "--output_dir", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=project, env=env, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert not (ROOT / "recipes" / "my_recipe").exists()
    config = json.loads((out / "config.json").read_text())
    assert config["recipe"] == "my_recipe"
    assert config["data"]["path"] == "recipes/my_recipe/data/train.jsonl"  # the copy's
    rows = [json.loads(line) for line in (out / "metrics.jsonl").open()]
    assert [r["step"] for r in rows] == [0] and "proposer/reward" in rows[0]


def test_import_kernel_stays_light():
    code = (
        "import sys, kernel, kernel.run.config, kernel.buffer, kernel.loss, kernel.advantages\n"
        "heavy = [m for m in ('megatron', 'sglang', 'ray', 'transformers') if m in sys.modules]\n"
        "print(heavy)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout


def test_the_recipe_api_imports_without_the_training_stack():
    """A recipe's hooks (generate, reward, config, where it has one) and the API they use
    (kernel.dialogue, hooks, sample; kernel.run.results for reading a run's replies), and the
    gateway's hooks (--agent_program), load without torch, transformers, the engine or the
    trainer."""
    recipes = sorted(p.name for p in (ROOT / "recipes").iterdir() if (p / "generate.py").exists())
    modules = ["kernel.dialogue", "kernel.hooks", "kernel.sample", "kernel.run.results"]
    modules += ["kernel.gateway.hooks"] + [
        f"recipes.{r}.{m}"
        for r in recipes
        for m in ("generate", "reward", "config")
        if (ROOT / "recipes" / r / f"{m}.py").exists()
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
# torch, transformers, Megatron-core, Ray -- are imported inside functions). One exception, the
# top of the graph: kernel.cli imports a command's modules in that command's parser or handler,
# so `kernel train --help` loads only what train's flags are made of (nothing imports the CLI,
# so its imports cannot close a cycle).
LAZY_IMPORTERS = ("kernel.cli",)
LAYERS = {
    "core": (
        "sample",
        "hooks",
        "redact",
        "conversation",
        "dialogue",
        "rewards",
        "answers",
        "tags",
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
    "data and rollout": ("benchmarks", "buffer", "rollout", "env", "gateway"),
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
        if in_function and importer not in LAZY_IMPORTERS:
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
