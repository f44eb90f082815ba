"""Architecture rules: only the wrapper module imports llama_cpp."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def imports_of(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def test_only_the_wrapper_imports_llama_cpp():
    sources = [p for d in ("edgeinfer", "tui", "scripts", "models") for p in (ROOT / d).rglob("*.py")]
    assert len(sources) > 10
    importers = sorted(str(p.relative_to(ROOT)) for p in sources if "llama_cpp" in imports_of(p))
    assert importers == ["edgeinfer/llamacpp.py"]


def test_the_scheduler_is_pure_python():
    assert imports_of(ROOT / "edgeinfer" / "scheduler.py") <= {
        "__future__",
        "enum",
        "collections",
        "dataclasses",
        "typing",
        "edgeinfer",
    }
