"""Architecture rules: only llamacpp/core.py imports llama_cpp; no import cycles; options are declared once."""

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.pure

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
    assert importers == ["edgeinfer/llamacpp/core.py"], importers


def modules_imported_by(path: Path) -> set[str]:
    """The full names of the modules path imports, inside functions and TYPE_CHECKING blocks included."""
    tree = ast.parse(path.read_text(), filename=str(path))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def test_the_engine_imports_neither_the_server_nor_the_formats():
    """The engine runs tokens; the chat layer (edgeinfer.runtime, the server, `edgeinfer chat`) reads ModelFacts."""
    found = {
        str(p.relative_to(ROOT)): sorted(m for m in modules_imported_by(p) if m.startswith(FORBIDDEN))
        for p in (ROOT / "edgeinfer" / "engine").rglob("*.py")
    }
    assert len(found) > 10
    assert {p: ms for p, ms in found.items() if ms} == {}


FORBIDDEN = ("edgeinfer.server", "edgeinfer.formats", "edgeinfer.chat_repl", "edgeinfer.cli")


def test_the_scheduler_is_pure_python():
    for name in ("scheduler.py", "step.py", "stream.py", "prefix.py"):
        assert imports_of(ROOT / "edgeinfer" / "engine" / name) <= {
            "__future__",
            "enum",
            "collections",
            "itertools",
            "dataclasses",
            "typing",
            "edgeinfer",
        }


# The installed package's modules and where their source is: tui/ and models/ install as edgeinfer.tui
# and edgeinfer.models (pyproject's package-dir).
SOURCE_ROOTS = {"edgeinfer": ROOT / "edgeinfer", "edgeinfer.tui": ROOT / "tui", "edgeinfer.models": ROOT / "models"}


def module_sources() -> dict[str, str]:
    """Module name -> source text, for every module of the installed package (a package by its own name)."""
    found = {}
    for package, folder in SOURCE_ROOTS.items():
        for path in folder.rglob("*.py"):
            parts = path.relative_to(folder).with_suffix("").parts
            found[".".join((package, *parts)).removesuffix(".__init__")] = path.read_text()
    return found


def import_graph(sources: dict[str, str]) -> dict[str, set[str]]:
    """Module -> the modules of `sources` it imports, anywhere in the file (inside functions too), but not
    under `if TYPE_CHECKING:`. `from a import b` is an edge to a.b when that is a module, else to a.
    Importing a package that holds the module is not an edge: Python has begun that package already."""
    graph: dict[str, set[str]] = {}
    for name, text in sources.items():
        tree = ast.parse(text)
        hidden = {
            id(inner)
            for node in ast.walk(tree)
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
            for stmt in node.body
            for inner in ast.walk(stmt)
        }
        is_package = any(other.startswith(name + ".") for other in sources)
        here = name.split(".") if is_package else name.split(".")[:-1]  # what `from . import` means
        targets: set[str] = set()
        for node in ast.walk(tree):
            if id(node) in hidden:
                continue
            if isinstance(node, ast.Import):
                targets.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(here[: len(here) - node.level + 1] + ([node.module] if node.module else []))
                targets.update(f"{base}.{a.name}" if f"{base}.{a.name}" in sources else base for a in node.names)
        graph[name] = {t for t in targets if t in sources and t != name and not name.startswith(t + ".")}
    return graph


def import_cycles(sources: dict[str, str]) -> list[list[str]]:
    """Cycles of imports, each as the modules along it back to its first; at least one per tangle."""
    graph = import_graph(sources)
    finished: set[str] = set()
    cycles: list[list[str]] = []

    def visit(module: str, path: list[str]) -> None:
        for target in sorted(graph[module]):
            if target in path:
                cycles.append([*path[path.index(target) :], target])
            elif target not in finished:
                visit(target, [*path, target])
        finished.add(module)

    for module in sorted(graph):
        if module not in finished:
            visit(module, [module])
    return cycles


def test_no_import_cycle_between_modules():
    cycles = import_cycles(module_sources())
    assert cycles == [], "break these at their seam: " + "; ".join(" -> ".join(c) for c in cycles)


def test_the_cycle_check_finds_a_cycle_hidden_inside_a_function():
    sources = {
        "pkg": "",
        "pkg.a": "from pkg.b import helper\n",
        "pkg.b": "def helper():\n    from pkg import a\n    return a\n",
        "pkg.c": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.a import x\n",
        "pkg.d": "from . import c\n",
    }
    assert import_cycles(sources) == [["pkg.a", "pkg.b", "pkg.a"]]
    # The tree itself: adding such an import to a real module is caught.
    real = module_sources()
    real["edgeinfer.errors"] += "\ndef _cycle():\n    from edgeinfer.server import app\n"
    assert any("edgeinfer.errors" in c for c in import_cycles(real))


def test_every_engine_option_is_a_flag_and_a_settings_key_from_one_declaration():
    from click.testing import CliRunner

    from edgeinfer.cli import main
    from edgeinfer.options import EngineConfig, SamplingParams, flag
    from edgeinfer.server.schema import ChatRequest, CompletionRequest
    from edgeinfer.settings import EngineSettings

    for command in ("serve", "chat", "generate", "bench"):
        text = CliRunner().invoke(main, [command, "--help"], terminal_width=200).output
        for name, field in EngineConfig.model_fields.items():
            if name == "max_queue" and command != "serve":
                continue
            assert flag(name) in text, f"{command} has no {flag(name)}"
            assert (field.description or "")[:30] in " ".join(text.split()), f"{command} {flag(name)}: help text"
    assert set(EngineSettings.model_fields) == set(EngineConfig.model_fields)
    # The server's requests validate sampling settings with the engine's own fields.
    engine_side = SamplingParams.model_json_schema()["properties"]
    for request in (ChatRequest, CompletionRequest):
        wire = request.model_json_schema()["properties"]
        for name in ("temperature", "top_k", "top_p", "min_p", "repeat_penalty", "seed", "stop"):
            assert wire[name] == engine_side[name], f"{request.__name__}.{name}"


def test_every_package_is_in_the_distribution():
    """Defect: edgeinfer/llamacpp/ was missing from pyproject's package list, so the one-file binary
    (built from a plain install) had no llama.cpp wrapper at all."""
    import tomllib

    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {
        "edgeinfer." + ".".join(p.parent.relative_to(ROOT / "edgeinfer").parts)
        for p in (ROOT / "edgeinfer").rglob("__init__.py")
    }
    found = {name.rstrip(".") for name in found}
    found |= {"edgeinfer.models", "edgeinfer.tui"}  # installed from models/ and tui/
    assert found <= listed, f"add to pyproject's [tool.setuptools] packages: {sorted(found - listed)}"
