"""--gpu-layers auto: the fitting of layers to a GPU's free memory (engine/offload.py), on made-up devices
and on the default model's own GGUF figures. No model is loaded; the same plan on a real (software)
Vulkan device is in tests/test_gpu.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from edgeinfer.cli import main
from edgeinfer.engine.offload import MARGIN_BYTES, MIB, Gpu, fit, layer_bytes, plan_for
from edgeinfer.engine.sizing import layer_cell_bytes, sized
from edgeinfer.models.gguf import read_gguf
from edgeinfer.options import EngineConfig

pytestmark = pytest.mark.pure

GIB = 1 << 30
LAYERS = [100 * MIB] * 4 + [300 * MIB]  # four repeating layers of 100 MiB, then a 300 MiB output layer
KV = [10 * MIB] * 4  # each layer's KV for every cell
COMPUTE = 50 * MIB


def gpu(free: int, total: int = 8 * GIB) -> Gpu:
    return Gpu("Vulkan0", "Test GPU", free, total)


def test_without_a_gpu_the_cpu_runs_every_layer_and_says_why():
    plan = fit([], LAYERS, KV, COMPUTE)
    assert plan.layers == 0 and plan.n_layers == 5 and plan.need_bytes == 0
    assert "no GPU" in plan.line()


def test_a_large_gpu_takes_every_layer_with_its_kv():
    plan = fit([gpu(8 * GIB)], LAYERS, KV, COMPUTE)
    assert plan.layers == 5 and not plan.reason
    assert plan.weight_bytes == 700 * MIB and plan.kv_bytes == 40 * MIB and plan.compute_bytes == COMPUTE
    assert "every layer on Vulkan0 (Test GPU)" in plan.line()


def test_layers_go_from_the_end_output_first_as_llama_cpp_offloads_them():
    # Usable: 560 MiB. Output 300 + compute 50 = 350; + one layer (110) = 460; + another = 570: too much.
    plan = fit([gpu(MARGIN_BYTES + 560 * MIB)], LAYERS, KV, COMPUTE)
    assert plan.layers == 2
    assert plan.weight_bytes == 400 * MIB and plan.kv_bytes == 10 * MIB
    assert "3 layers stay on the CPU" in plan.reason and "2 of 5 layers" in plan.line()


def test_the_margin_is_left_free():
    whole = sum(LAYERS) + sum(KV) + COMPUTE
    assert fit([gpu(MARGIN_BYTES + whole)], LAYERS, KV, COMPUTE).layers == 5
    assert fit([gpu(MARGIN_BYTES + whole - 1)], LAYERS, KV, COMPUTE).layers == 4


def test_gpu_memory_caps_what_auto_fills():
    assert fit([gpu(8 * GIB)], LAYERS, KV, COMPUTE, cap=460 * MIB).layers == 2


def test_several_gpus_pool_their_memory_less_a_margin_each():
    half = MARGIN_BYTES + 350 * MIB  # 700 MiB usable in all: output, compute and three layers (680)
    plan = fit([gpu(half), Gpu("Vulkan1", "Other", half, 8 * GIB)], LAYERS, KV, COMPUTE)
    assert plan.budget_bytes == 700 * MIB and plan.layers == 4
    assert "Vulkan0 (Test GPU), Vulkan1 (Other)" in plan.line()


def test_nothing_fits_on_a_tiny_gpu():
    plan = fit([gpu(MARGIN_BYTES + 10 * MIB)], LAYERS, KV, COMPUTE)
    assert plan.layers == 0 and "not even one layer fits" in plan.reason


def test_the_draft_model_goes_to_the_gpu_only_beside_the_whole_target():
    whole = sum(LAYERS) + sum(KV) + COMPUTE
    roomy = fit([gpu(MARGIN_BYTES + whole + 200 * MIB)], LAYERS, KV, COMPUTE, draft=150 * MIB)
    assert (roomy.layers, roomy.draft_layers, roomy.draft_bytes) == (5, -1, 150 * MIB)
    tight = fit([gpu(MARGIN_BYTES + whole + 100 * MIB)], LAYERS, KV, COMPUTE, draft=150 * MIB)
    assert (tight.layers, tight.draft_layers) == (5, 0) and "draft model stays on the CPU" in tight.reason
    partial = fit([gpu(MARGIN_BYTES + 560 * MIB)], LAYERS, KV, COMPUTE, draft=10 * MIB)
    assert partial.draft_layers == 0


def test_the_default_models_layers_are_read_from_its_gguf(model_path):
    info = read_gguf(model_path)
    layers = layer_bytes(info)
    assert len(layers) == info.n_layer + 1 == 31
    assert all(b > 0 for b in layers)
    # SmolLM2 ties its output to the token embeddings: the output layer is its norm and token_embd's copy.
    assert "output.weight" not in info.tensor_bytes
    assert layers[-1] == info.tensor_bytes["token_embd.weight"] + info.tensor_bytes["output_norm.weight"]
    assert sum(layers[:-1]) + layers[-1] <= sum(info.tensor_bytes.values())
    assert sum(layer_cell_bytes(info.metadata, "f16")) == 30 * 3 * (64 + 64) * 2


def test_plan_for_a_config_on_a_made_up_gpu(model_path):
    config, _ = sized(EngineConfig(model=model_path, parallel=4, ctx_size=8192))
    info = read_gguf(model_path)
    whole = plan_for(config, info, [gpu(8 * GIB)])
    assert whole.layers == 31 and whole.kv_bytes == 8192 * 23_040  # 30 layers x 3 KV heads x 128 x 2 bytes a cell
    small = plan_for(config.replace(gpu_memory=whole.need_bytes // 2 // MIB), info, [gpu(8 * GIB)])
    assert 0 < small.layers < 31 and small.need_bytes <= whole.need_bytes // 2
    assert plan_for(config, info, []).layers == 0
    by_hand = plan_for(config.replace(gpu_layers=5), info, [gpu(8 * GIB)])
    assert (by_hand.layers, by_hand.auto) == (5, False)
    no_gpu = plan_for(config.replace(gpu_layers=-1), info, [])
    assert no_gpu.layers == 0 and "there is no GPU" in no_gpu.reason


@pytest.mark.parametrize(("value", "ok"), [("auto", True), ("12", True), ("-1", True), ("-2", False), ("2.5", False)])
def test_gpu_layers_takes_auto_a_count_or_minus_one(value, ok):
    if ok:
        assert EngineConfig(gpu_layers=value).gpu_layers == (value if value == "auto" else int(value))
    else:
        with pytest.raises(Exception, match="a layer count, -1 for all of them, or auto"):
            EngineConfig(gpu_layers=value)


def test_a_word_for_gpu_layers_is_refused_on_the_command_line():
    r = CliRunner().invoke(main, ["generate", "--gpu-layers", "most", "hello"])
    assert r.exit_code == 2 and "'most' is not a whole number or auto" in r.output


def test_the_dashboard_says_where_the_layers_are():
    from edgeinfer.engine.stats import GpuStats
    from edgeinfer.tui.figures import gpu_text

    assert gpu_text(GpuStats()) == "CPU only"
    whole = GpuStats(device="CUDA0 (RTX 4070)", layers=31, n_layers=31, free_bytes=900 << 20, total_bytes=12282 << 20)
    assert gpu_text(whole) == "GPU 31/31 layers · 900 MiB free"
    part = GpuStats(device="CUDA0 (RTX 4070)", layers=12, n_layers=31, reason="19 layers stay on the CPU")
    assert gpu_text(part) == "GPU 12/31 layers"
    none = GpuStats(device="CUDA0 (RTX 4070)", reason="not even one layer fits")
    assert gpu_text(none) == "CPU only (the model does not fit the GPU)"


def test_a_cuda_build_from_pypi_loads_that_toolkits_runtime_first(tmp_path):
    import ctypes.util
    import shutil

    from edgeinfer.llamacpp.ggml import preload_cuda_runtime

    libm = ctypes.util.find_library("m")
    assert libm is not None
    system = next(
        p
        for d in ("/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib64", "/usr/lib")
        for p in [Path(d) / libm]
        if p.exists()
    )
    toolkit, lib_dir = tmp_path / "cu13" / "lib", tmp_path / "llama_cpp" / "lib"
    toolkit.mkdir(parents=True)
    lib_dir.mkdir(parents=True)
    for name in ("libcudart.so.13", "libcublas.so.13", "libcublasLt.so.13"):
        shutil.copy(system, toolkit / name)  # any loadable library stands in for NVIDIA's
    assert preload_cuda_runtime(lib_dir, toolkit) == []  # no CUDA backend in this build: nothing to load
    (lib_dir / "libggml-cuda.so").write_bytes(b"")
    assert preload_cuda_runtime(lib_dir, toolkit) == ["libcudart.so.13", "libcublasLt.so.13", "libcublas.so.13"]
    assert preload_cuda_runtime(lib_dir, tmp_path / "none") == []  # a system toolkit: found the usual way


def test_flash_attention_auto_stays_off_on_vulkan_where_speculation_crashes_it(monkeypatch):
    from edgeinfer.llamacpp import core, ggml

    monkeypatch.setattr(ggml, "local_gpus", lambda: [1])
    monkeypatch.setattr(ggml, "device_name", lambda dev: "Vulkan0")
    assert core.resolve_flash_attn("auto", "f16", "auto") == "off"
    assert core.resolve_flash_attn("auto", "f16", "auto", sliding_window=True) == "off"  # on the CPU it would be on
    assert core.resolve_flash_attn("auto", "q8_0", -1) == "auto"  # a quantized cache needs it
    assert core.resolve_flash_attn("on", "f16", -1) == "on"  # asked for by hand
    monkeypatch.setattr(ggml, "device_name", lambda dev: "CUDA0")
    assert core.resolve_flash_attn("auto", "f16", -1) == "auto"  # llama.cpp's choice on other GPUs
    assert core.resolve_flash_attn("auto", "f16", 0) == "off"  # no layer on the GPU


def test_models_says_whether_each_model_fits_the_gpu(model_path):
    from edgeinfer.models.listing import gpu_fit

    info = read_gguf(model_path)
    assert gpu_fit(info, [gpu(24 * GIB)]).startswith("fits the GPU (")
    part = gpu_fit(info, [gpu(MARGIN_BYTES + 600 * MIB)])  # serve's defaults: streams of 8192 cells
    assert " of 31 layers fit the GPU (with " in part and " x 8192 cells of KV" in part, part
    assert gpu_fit(info, [gpu(MARGIN_BYTES)]) == "runs on the CPU (not one layer fits the GPU)"


@pytest.mark.model
def test_a_gpu_load_that_fails_falls_back_to_the_cpu_and_says_why(model_path, monkeypatch):
    from edgeinfer.engine import engine as engine_module
    from edgeinfer.errors import ModelLoadError
    from edgeinfer.runtime import make_engine

    planned = fit([gpu(8 * GIB)], LAYERS, KV, COMPUTE)  # a plan for every layer on a GPU this machine lacks
    monkeypatch.setattr(engine_module, "plan_for", lambda config, info: planned)
    monkeypatch.setattr(engine_module, "gpus_free", lambda: 8 * GIB)
    real_context = engine_module.Context

    def context(model, params):  # the GPU's KV cache does not fit after all
        if model.gpu_layers:
            raise ModelLoadError("failed to allocate the KV cache on Vulkan0")
        return real_context(model, params)

    monkeypatch.setattr(engine_module, "Context", context)
    eng = make_engine(EngineConfig(model=model_path, parallel=1, ctx_size=512, spec="off"))
    try:
        assert eng.config.gpu_layers == 0 and eng.model.gpu_layers == 0
        assert eng.offload is not None and eng.offload.layers == 0
        assert "the load on the GPU failed (failed to allocate the KV cache on Vulkan0)" in eng.offload.line()
        assert eng.snapshot().model.gpu.layers == 0
    finally:
        eng.close()
