"""The command line through click's CliRunner, and bad model files."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from edgeinfer.bench.schema import Report
from edgeinfer.cli import main

from . import gate

pytestmark = pytest.mark.model


@pytest.fixture
def runner():
    return CliRunner()


def test_generate_json_with_n_streams(runner, model_path):
    result = runner.invoke(
        main, ["generate", "What is 2+2?", "-n", "2", "--max-tokens", "8", "--temperature", "0", "--json"]
    )
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["n"] == 2 and len(doc["completions"]) == 2
    a, b = doc["completions"]
    assert a["completion_tokens"] > 0 and a["ttft_s"] > 0
    gate.same_shapes(a["text"], b["text"], "greedy forks of one prompt, decoded side by side")


def test_generate_streams_text_and_prints_figures(runner):
    result = runner.invoke(main, ["generate", "Say hello.", "--max-tokens", "6", "--temperature", "0"])
    assert result.exit_code == 0, result.output
    assert "tokens" in result.stderr and "TTFT" in result.stderr
    assert result.stdout.strip()


def test_generate_json_schema_prints_the_validated_object(runner, tmp_path):
    import jsonschema

    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30}}, "required": ["city"]}
    path = tmp_path / "city.json"
    path.write_text(json.dumps(schema))
    args = ["generate", "The capital of Italy, as JSON.", "--json-schema", str(path), "--temperature", "0.8", "-n", "2"]
    result = runner.invoke(main, args)
    assert result.exit_code == 0, result.output
    objects = [json.loads(part) for part in result.stdout.replace("}\n{", "}\0{").split("\0")]
    assert len(objects) == 2
    for obj in objects:
        jsonschema.validate(obj, schema)
    path.write_text(json.dumps({"type": "array", "uniqueItems": True}))
    result = runner.invoke(main, ["generate", "x", "--json-schema", str(path)])
    assert result.exit_code == 1 and "'uniqueItems' at /" in result.output
    result = runner.invoke(main, ["generate", "x", "--json-schema", str(path), "--grammar", str(path)])
    assert result.exit_code == 1 and "cannot be combined" in result.output


def test_models_lists_the_default_model_and_its_metadata(runner):
    result = runner.invoke(main, ["models"])
    assert result.exit_code == 0, result.output
    assert "smollm2-135m-instruct-q4_1" in result.output
    assert "llama, 135M params, Q4_1, context 8192, vocab 49152" in result.output


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda tmp, model: tmp / "missing.gguf", "no such file"),
        (lambda tmp, model: tmp, "is a directory"),
        (lambda tmp, model: _write(tmp / "notes.gguf", b"hello, this is not a model\n" * 10), "not a GGUF file"),
        (lambda tmp, model: _write(tmp / "cut.gguf", model.read_bytes()[:2_000_000]), "truncated"),
        (lambda tmp, model: _write(tmp / "header.gguf", model.read_bytes()[:100]), "truncated"),
        (lambda tmp, model: _write(tmp / "empty.gguf", b""), "not a GGUF file"),
    ],
)
def test_bad_model_files_give_one_line_errors(runner, tmp_path, model_path, make, message):
    path = make(tmp_path, model_path)
    for args in (["generate", "hi", "--model", str(path)], ["models", "show", str(path)]):
        result = runner.invoke(main, args)
        assert result.exit_code != 0
        assert message in result.output and str(path) in result.output
        assert "Traceback" not in result.output and isinstance(result.exception, SystemExit)
        assert len(result.output.strip().splitlines()) == 1


def _write(path, data):
    path.write_bytes(data)
    return path


def test_quantize_makes_a_loadable_copy(runner, tmp_path, model_path):
    out = tmp_path / "q8.gguf"
    result = runner.invoke(main, ["models", "quantize", str(model_path), str(out), "Q8_0"])
    assert result.exit_code == 0, result.output
    shown = runner.invoke(main, ["models", "show", str(out)])
    assert "Q8_0" in shown.output


def test_quantize_refuses_to_write_over_its_source_or_an_existing_file(runner, tmp_path, model_path):
    import os
    import shutil

    src = tmp_path / "m.gguf"
    shutil.copyfile(model_path, src)
    original = src.read_bytes()
    (tmp_path / "link.gguf").symlink_to(src)
    os.link(src, tmp_path / "hard.gguf")
    for dst in (src, tmp_path / "link.gguf", tmp_path / "hard.gguf", tmp_path / "sub" / ".." / "m.gguf"):
        (tmp_path / "sub").mkdir(exist_ok=True)
        result = runner.invoke(main, ["models", "quantize", str(src), str(dst), "F16", "--force"])
        assert result.exit_code != 0 and "is the source model" in result.output, result.output
        assert "Traceback" not in result.output
    assert src.read_bytes() == original
    taken = tmp_path / "taken.gguf"
    taken.write_bytes(b"keep me")
    result = runner.invoke(main, ["models", "quantize", str(src), str(taken), "Q8_0"])
    assert result.exit_code != 0 and "already exists" in result.output and "--force" in result.output
    assert taken.read_bytes() == b"keep me"
    result = runner.invoke(main, ["models", "quantize", str(src), str(taken), "Q8_0", "--force"])
    assert result.exit_code == 0, result.output
    assert "Q8_0" in runner.invoke(main, ["models", "show", str(taken)]).output


def test_bad_options_are_refused_clearly(runner):
    result = runner.invoke(main, ["generate", "hi", "--parallel", "-1"])
    assert result.exit_code != 0 and "--parallel" in result.output and "Traceback" not in result.output
    result = runner.invoke(main, ["bench", "--concurrency", "a,b"])
    assert result.exit_code != 0 and "comma-separated" in result.output
    result = runner.invoke(main, ["bench", "--concurrency", "4,2"])
    assert result.exit_code != 0 and "increasing" in result.output
    result = runner.invoke(main, ["bench", "--plot", "/no/such/folder/p.png"])  # refused before any run
    assert result.exit_code != 0 and "folder does not exist" in result.output and "Traceback" not in result.output
    result = runner.invoke(main, ["bench", "--tune", "--quality"])
    assert result.exit_code != 0 and "cannot be combined" in result.output


def test_chat_repl_streams_and_reuses_history(runner):
    session = "Hi, my name is Ada.\nWhat is my name?\n/help\n/reset\n/exit\n"
    result = runner.invoke(main, ["chat", "--temperature", "0", "--max-tokens", "24"], input=session)
    assert result.exit_code == 0, result.output
    lines = [ln for ln in result.output.splitlines() if "tok/s" in ln or "tokens" in ln]
    assert len(lines) >= 2
    assert "prompt tokens reused" in lines[1]
    assert "/reset" in result.output and "conversation cleared" in result.output


def test_bench_sweep_in_process_beside_the_raw_loop(runner, tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)  # a "~" folder made here would be the unexpanded path
    args = ["bench", "--concurrency", "1,2", "--max-tokens", "4", "--repeats", "1", "--raw"]
    result = runner.invoke(main, [*args, "--json", "-", "--plot", "~/p.png"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    Report.model_validate(doc)
    assert doc["schema"] == 2 and doc["workload"] == "chat" and doc["max_tokens"] == 4
    assert [t["name"] for t in doc["targets"]] == ["edgeinfer", "raw loop"]
    assert doc["targets"][0]["config"]["parallel"] == 2
    assert [lv["concurrency"] for lv in doc["levels"]] == [1, 2]
    for lv in doc["levels"]:
        for side in lv["targets"].values():
            for run in (side["cold"], side["warm"]):
                assert run["completion_tokens"] == 4 * lv["concurrency"]
                assert run["aggregate_tps"] > 0 and run["decode_tps"] > 0 and run["requests_per_s"] > 0
                assert 0 < run["ttft_p50_s"] <= run["ttft_p95_s"] <= run["ttft_p99_s"]
                assert 0 < run["itl_p50_s"] <= run["itl_p99_s"]
                assert run["acceptance"] is None
    assert doc["knees"]["edgeinfer"]["parallel"] in (1, 2)
    assert "recommended --parallel" in result.stderr and "side by side" in result.stderr
    assert (tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"


def test_bench_agent_warm_prefix_beats_cold(runner):
    """The agent's system prompt: computed in the cold run, reused by the warm run after it."""
    args = ["bench", "--workload", "agent", "--concurrency", "2", "--max-tokens", "2", "--repeats", "1"]
    result = runner.invoke(main, [*args, "--json", "-"])
    assert result.exit_code == 0, result.output
    side = json.loads(result.stdout)["levels"][0]["targets"]["edgeinfer"]
    assert side["warm"]["ttft_p50_s"] < side["cold"]["ttft_p50_s"] / 2


def test_bench_with_speculation_compares_on_and_off(runner):
    args = ["bench", "--spec", "ngram", "--workload", "code-edit", "--concurrency", "1"]
    result = runner.invoke(main, [*args, "--max-tokens", "16", "--repeats", "1", "--json", "-"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert [t["name"] for t in doc["targets"]] == ["spec ngram", "spec off"]
    level = doc["levels"][0]["targets"]
    assert level["spec ngram"]["warm"]["decode_tps"] > 0 and level["spec off"]["warm"]["decode_tps"] > 0
    assert level["spec off"]["warm"]["acceptance"] is None  # nothing drafted
    assert level["spec ngram"]["warm"]["acceptance"] is not None  # code-edit repeats its prompt: drafts happen


def test_flash_attention_auto_on_the_cpu_is_on_for_sliding_window_models_only_and_said_so():
    """On the CPU llama.cpp's auto turns flash attention on, which halves SmolLM2's decode speed at long contexts;
    a sliding-window model (Gemma 3) computes prompts and decodes faster with it (docs/benchmarks.md)."""
    from edgeinfer.cli.commands import kv_summary
    from edgeinfer.llamacpp import resolve_flash_attn
    from edgeinfer.options import EngineConfig

    assert resolve_flash_attn("auto", "f16", 0) == "off"
    assert resolve_flash_attn("auto", "f16", 0, sliding_window=True) == "on"
    assert resolve_flash_attn("on", "f16", 0) == "on"
    assert resolve_flash_attn("off", "f16", 0, sliding_window=True) == "off"  # asked for by hand
    assert resolve_flash_attn("auto", "q8_0", 0) == "auto"  # a quantized V cache needs it
    assert "flash attention off (auto: off on the CPU and on Vulkan)" in kv_summary(EngineConfig())
    gemma = kv_summary(EngineConfig(model="gemma3-270m-q4_k_m", parallel=1, ctx_size=4096))
    assert gemma.endswith("flash attention on (auto: on the CPU for sliding-window attention)"), gemma
    assert kv_summary(EngineConfig(flash_attn="on")).endswith("flash attention on")
