"""The GPU code path, run on a real Vulkan device: Mesa's lavapipe, a software device on the CPU.

llama.cpp's Vulkan backend runs on lavapipe unchanged (slowly: about 1 token/s for the default
model with every layer on it), the same backend that runs on AMD, Intel and NVIDIA cards. llama.cpp
skips a CPU-type Vulkan device unless GGML_VK_VISIBLE_DEVICES names it, so the rest of the suite
never sees it; these tests name it for the processes they start. They need a llama.cpp built with
the Vulkan backend (`make install` builds it when libvulkan-dev, spirv-headers and glslc are
installed; `.ci/run` installs them with mesa-vulkan-drivers) and skip, saying so, without one.
Texts are short and prompts raw, without the chat template's system turn: lavapipe computes a
prompt at about 0.6 s a token (a 37-token chat prompt took 22 s), so a prompt of a few tokens is what
keeps these tests to seconds.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from edgeinfer.engine.scheduler import MIN_SHARE

from . import gate
from .conftest import healthy, raw, stop_process

pytestmark = pytest.mark.model

# Mesa keeps the device's compiled pipelines in a cache of its own (a user's ~/.cache/mesa_shader_cache). The
# suite's processes run with a temporary XDG_CACHE_HOME (conftest.py), where it would start empty every run
# and compile every pipeline again: kept beside the near-tie drifts instead, measured, a warm cache takes this
# module from 134 s to 70 s on one core. The pipelines compute the same; only their compile is skipped.
MESA_CACHE = gate.DRIFT_CACHE.parent / "test-mesa-shaders"
VISIBLE = {"GGML_VK_VISIBLE_DEVICES": "0", "MESA_SHADER_CACHE_DIR": str(MESA_CACHE)}
N_LAYERS = 31  # SmolLM2-135M: 30 repeating layers and the output layer
HELLO = "The capital of France is"
# Long enough for the prefix cache to keep (the scheduler's MIN_SHARE, 16 tokens), still short.
CAPITALS = "The capital of Italy is Rome. The capital of Spain is Madrid. The capital of France is"


def llama_lib() -> Path:
    spec = importlib.util.find_spec("llama_cpp")  # found, not imported: only edgeinfer.llamacpp imports it
    assert spec is not None and spec.origin is not None
    return Path(spec.origin).parent / "lib"


def device_env() -> dict[str, str]:
    return {**os.environ, **VISIBLE}


@pytest.fixture(scope="module")
def device() -> dict:
    """The Vulkan device this build sees when it is named, or a skip that says what is missing."""
    if not (llama_lib() / "libggml-vulkan.so").is_file():
        pytest.skip(
            "this llama.cpp build has no Vulkan backend: install libvulkan-dev, spirv-headers, glslc and "
            "mesa-vulkan-drivers, then `make install` (docs/gpu.md)"
        )
    probe = (
        "import dataclasses, json\nfrom edgeinfer.engine.offload import local_gpus\n"
        "print(json.dumps([dataclasses.asdict(g) for g in local_gpus()]))"
    )
    r = subprocess.run([sys.executable, "-c", probe], env=device_env(), capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    gpus = json.loads(r.stdout.strip().splitlines()[-1])
    if not gpus:
        pytest.skip("the Vulkan backend is built but no Vulkan device is installed (Debian: mesa-vulkan-drivers)")
    return gpus[0]


def generate(*args: str, timeout: float = 600) -> dict:
    cmd = [sys.executable, "-m", "edgeinfer.cli", "generate", "--json", "--temperature", "0", *args]
    r = subprocess.run(cmd, env=device_env(), capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout)


@pytest.fixture(scope="module")
def gpu_server(device, tmp_path_factory):
    """`serve` with every layer on the device (auto), n-gram speculation and two streams."""
    sock = tmp_path_factory.mktemp("gpu") / "edgeinfer.sock"
    cmd = [
        sys.executable, "-m", "edgeinfer.cli", "serve", "--socket", str(sock), "--ctx-size", "2048",
        "--parallel", "2", "--spec", "ngram",
    ]  # fmt: skip
    err = sock.parent / "stderr.txt"
    with err.open("w") as stderr:
        proc = subprocess.Popen(cmd, env=device_env(), stdout=subprocess.DEVNULL, stderr=stderr, text=True)
    try:
        healthy(sock, proc, limit_s=300, log=lambda: err.read_text()[-3000:])
        yield sock, err
    finally:
        stop_process(proc)


def ids(text: str) -> list[int]:
    """A raw prompt's token ids, as the reference engine of tests/gate.py reads them."""
    return gate.reference().tokenize(text)


def complete(sock: Path, prompt: list[int], max_tokens: int) -> dict:
    """A greedy completion of prompt's ids (no chat template: short prompts, lavapipe is slow)."""
    body = {"model": "default", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0}
    r = raw(sock, timeout=600).post("/v1/completions", json=body)
    assert r.status_code == 200, r.text
    return r.json()


def test_serve_puts_every_layer_on_the_device_and_says_so(gpu_server, device):
    sock, err = gpu_server
    line = next(ln for ln in err.read_text().splitlines() if "GPU offload" in ln)
    gate.contains(line, f"every layer on {device['name']} ({device['description']})")
    gpu = raw(sock).get("/v1/edgeinfer/stats").json()["model"]["gpu"]
    assert (gpu["layers"], gpu["n_layers"], gpu["auto"]) == (N_LAYERS, N_LAYERS, True), gpu
    assert gpu["planned_bytes"] > 0 and gpu["kv_bytes"] == 2048 * 23_040, gpu  # 30 layers x 3 heads x 128 x f16
    assert gpu["measured_bytes"] is not None and gpu["total_bytes"] > 0, gpu
    metrics = raw(sock).get("/metrics").text
    layers = [ln for ln in metrics.splitlines() if ln.startswith("edgeinfer_gpu_layers{")]
    assert len(layers) == 1 and layers[0].endswith(f" {N_LAYERS}.0"), layers


def test_greedy_answers_on_the_device_follow_the_cpus_up_to_near_ties(gpu_server):
    sock, _ = gpu_server
    prompt = ids(CAPITALS)
    assert len(prompt) > MIN_SHARE, f"{len(prompt)} tokens: too short for the prefix cache to keep"
    first = complete(sock, prompt, 6)
    gate.follows_greedy(first["choices"][0]["text"], prompt, 6)
    # The same prompt again: it comes back from the prefix cache, on the device.
    again = complete(sock, prompt, 6)
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] > 0, again["usage"]
    gate.follows_greedy(again["choices"][0]["text"], prompt, 6)


def test_two_streams_packed_on_the_device(gpu_server):
    from concurrent.futures import ThreadPoolExecutor

    sock, _ = gpu_server
    asks = [ids("Once upon a time"), ids("One, two, three,")]
    with ThreadPoolExecutor(2) as pool:
        answers = list(pool.map(lambda p: complete(sock, p, 4), asks))
    steps = raw(sock).get("/v1/edgeinfer/stats").json()["steps"]
    for prompt, answer in zip(asks, answers, strict=True):
        gate.follows_greedy(answer["choices"][0]["text"], prompt, 4)
    assert steps["count"] > 0


def test_embeddings_on_the_device_match_the_cpus(gpu_server, model_path, tmp_path):
    sock, _ = gpu_server
    texts = ["A cat sat on the mat.", "The bank raised its rates."]
    r = raw(sock, timeout=600).post("/v1/embeddings", json={"model": "default", "input": texts})
    assert r.status_code == 200, r.text
    on_device = np.array([d["embedding"] for d in r.json()["data"]])
    code = (
        "import json, sys\nfrom edgeinfer.options import EngineConfig\nfrom edgeinfer.runtime import make_engine\n"
        "e = make_engine(EngineConfig(model=sys.argv[1], parallel=1, ctx_size=512, spec='off', gpu_layers=0))\n"
        "print(json.dumps([list(map(float, v)) for v in e.embeddings.embed([e.vocab.tokenize(t) for t in "
        "json.loads(sys.argv[2])])]))\ne.close()\n"
    )
    cpu_run = subprocess.run(
        [sys.executable, "-c", code, str(model_path), json.dumps(texts)], capture_output=True, text=True, timeout=300
    )
    assert cpu_run.returncode == 0, cpu_run.stderr[-2000:]
    on_cpu = np.array(json.loads(cpu_run.stdout.strip().splitlines()[-1]))
    cosine = np.sum(on_device * on_cpu, axis=1) / np.linalg.norm(on_device, axis=1) / np.linalg.norm(on_cpu, axis=1)
    assert np.all(cosine > 0.999), cosine


def test_ngram_speculation_drafts_on_the_device(gpu_server):
    sock, _ = gpu_server
    # A prompt that repeats itself: the n-gram drafter finds its continuation in the context.
    prompt = ids("one two three four five six one two three four five six one two")
    answer = complete(sock, prompt, 8)
    gate.follows_greedy(answer["choices"][0]["text"], prompt, 8)
    spec = raw(sock).get("/v1/edgeinfer/stats").json()["spec"]
    assert spec["mode"] == "ngram" and spec["verifications"] > 0, spec


def test_a_draft_model_on_the_device(device, model_path):
    # The default model drafts for itself, both on the device (--draft-gpu-layers auto puts the draft there
    # beside a whole target): every draft is accepted unless the two contexts round apart.
    out = generate(
        "--spec", "draft", "--draft-model", str(model_path), "--ctx-size", "1024",
        "--max-tokens", "4", "--spec-max", "3", "--raw", HELLO,
    )  # fmt: skip
    (c,) = out["completions"]
    assert c["completion_tokens"] == 4 and c["finish_reason"] == "length", c
    assert c["draft_tokens"] > 0 and c["draft_accepted"] > 0, c


def test_a_quantized_kv_cache_on_the_device_goes_to_disk_and_comes_back(device, tmp_path):
    # A quantized cache needs flash attention (auto turns it on for q8_0). The first run's KV is read off the
    # device into the cache tiers and written to --cache-dir as the run ends; the second run, a new process,
    # finds it on disk and writes it back onto the device: only the prompt's last token is computed again.
    args = ["--kv-type", "q8_0", "--spec", "off", "--ctx-size", "1024", "--max-tokens", "4"]
    args += ["--cache-dir", str(tmp_path), "--raw", CAPITALS]
    (first,) = generate(*args)["completions"]
    (again,) = generate(*args)["completions"]
    for c in (first, again):
        assert c["completion_tokens"] == 4 and c["finish_reason"] == "length" and c["text"].strip(), c
    assert first["cached_tokens"] == 0 and again["cached_tokens"] == again["prompt_tokens"] - 1 > MIN_SHARE, again


def test_auto_on_a_device_too_small_offloads_part_and_says_so(device):
    # --gpu-memory caps what auto may fill, as a smaller card's free memory would.
    code = (
        "import json, sys\nfrom edgeinfer.options import EngineConfig, SamplingParams\n"
        "from edgeinfer.runtime import make_engine\n"
        "e = make_engine(EngineConfig(model=sys.argv[1], parallel=1, ctx_size=1024, spec='off', gpu_memory=180))\n"
        "done = e.generate(e.tokenize('Hello'), SamplingParams(temperature=0, max_tokens=2))\n"
        "gpu = e.snapshot().model.gpu.model_dump()\n"
        "print(json.dumps({'line': e.offload.line(), 'tokens': len(done.token_ids), **gpu}))\n"
        "e.close()\n"
    )
    r = subprocess.run([sys.executable, "-c", code, "default"], env=device_env(), capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    gpu = json.loads(r.stdout.strip().splitlines()[-1])
    assert 0 < gpu["layers"] < N_LAYERS and gpu["planned_bytes"] <= 180 << 20 and gpu["tokens"] == 2, gpu
    gate.contains(gpu["line"], f"{gpu['layers']} of {N_LAYERS} layers")
    gate.contains(gpu["reason"], "layers stay on the CPU")
