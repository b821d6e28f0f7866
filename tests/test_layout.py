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
        "import sys, kernel, kernel.config, kernel.buffer, kernel.loss, kernel.advantages\n"
        "heavy = [m for m in ('megatron', 'sglang', 'ray', 'transformers') if m in sys.modules]\n"
        "print(heavy)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout
