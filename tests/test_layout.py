"""Architecture rules: only llamacpp/core.py imports llama_cpp; modules stay small; options are declared once."""

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
    assert importers == ["edgeinfer/llamacpp/core.py"], importers


def test_the_scheduler_is_pure_python():
    for name in ("scheduler.py", "step.py", "prefix.py"):
        assert imports_of(ROOT / "edgeinfer" / "engine" / name) <= {
            "__future__",
            "enum",
            "collections",
            "dataclasses",
            "typing",
            "edgeinfer",
        }


def test_no_module_is_over_400_lines():
    sources = [p for d in ("edgeinfer", "tui", "models") for p in (ROOT / d).rglob("*.py")]
    long = {str(p.relative_to(ROOT)): n for p in sources if (n := len(p.read_text().splitlines())) > 400}
    assert long == {}, f"split these by job: {long}"


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
