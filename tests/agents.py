"""The agents people run, as they ship: Codex CLI and Claude Code from npm, pinned and cached between runs.

Each runs unmodified against a local base URL with the setting its documentation gives for one
(Codex: a model provider with `base_url` and `wire_api = "responses"` in config.toml; Claude Code:
ANTHROPIC_BASE_URL and a key), in an empty environment, a temporary HOME and a folder of its own.
Their session logs (Codex's rollout, Claude Code's transcript) say what happened: the tool calls
made, and the results sent back.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CODEX_VERSION = "0.171.0"
CLAUDE_VERSION = "2.1.332"
PACKAGES = [f"@openai/codex@{CODEX_VERSION}", f"@anthropic-ai/claude-code@{CLAUDE_VERSION}"]
# Read before tests/conftest.py points XDG_CACHE_HOME at a temporary home: the install outlives the session.
CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "edgeinfer" / "npm-agents"
BIN = CACHE / "node_modules" / ".bin"


def installed() -> dict[str, Path]:
    """The two clients' commands, installed into CACHE from npm when missing or of another version."""
    want = {"codex": f"codex-cli {CODEX_VERSION}", "claude": f"{CLAUDE_VERSION} (Claude Code)"}

    def ok() -> bool:
        for name, version in want.items():
            exe = BIN / name
            if not exe.exists():
                return False
            r = subprocess.run([str(exe), "--version"], capture_output=True, text=True, timeout=60)
            if r.returncode != 0 or version not in r.stdout:
                return False
        return True

    if not ok():
        npm = shutil.which("npm")
        assert npm, "npm is needed to install the agent clients (Node.js 20+); the test cannot run without them"
        CACHE.mkdir(parents=True, exist_ok=True)
        r = subprocess.run(
            [npm, "install", "--no-audit", "--no-fund", "--prefix", str(CACHE), *PACKAGES],
            capture_output=True,
            text=True,
            timeout=900,
        )
        assert r.returncode == 0, f"npm install {' '.join(PACKAGES)} failed:\n{r.stderr[-3000:]}"
        assert ok(), f"the clients in {BIN} do not report the pinned versions {want}"
    return {name: BIN / name for name in want}


@dataclass
class Run:
    """One client run: its exit, its output, and the tool calls its session log records."""

    returncode: int
    stdout: str
    stderr: str
    calls: list[dict[str, Any]]  # {"name", "arguments"} per call the model made
    results: list[str]  # the tool results the client sent back, in order

    def explain(self) -> str:
        return f"exit {self.returncode}\n--- stdout\n{self.stdout[-2000:]}\n--- stderr\n{self.stderr[-3000:]}"


def _env(home: Path, **extra: str) -> dict[str, str]:
    return {"PATH": "/usr/bin:/bin", "HOME": str(home), "TERM": "dumb", **extra}


def _client(cmd: list[str], env: dict[str, str], cwd: Path, timeout: float) -> subprocess.CompletedProcess[str]:
    """One client run in its own folder and environment, nothing on its stdin."""
    return subprocess.run(
        cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
    )


def run_codex(exe: Path, base_url: str, prompt: str, root: Path, *args: str, timeout: float = 600) -> Run:
    """`codex exec PROMPT` with a model provider at base_url, as Codex's documentation sets one up."""
    home, codex_home, work = root / "home", root / "codex-home", root / "work"
    for d in (home, codex_home, work):
        d.mkdir(parents=True, exist_ok=True)
    (codex_home / "config.toml").write_text(
        'model_provider = "local"\nmodel = "local-model"\n\n'
        f'[model_providers.local]\nname = "local"\nbase_url = "{base_url}"\nwire_api = "responses"\n'
    )
    r = _client(
        [str(exe), "exec", "--skip-git-repo-check", *args, prompt],
        _env(home, CODEX_HOME=str(codex_home)),
        work,
        timeout,
    )
    calls, results = [], []
    for log in sorted(codex_home.rglob("rollout-*.jsonl")):
        for line in log.read_text().splitlines():
            item = json.loads(line).get("payload", {})
            if item.get("type") == "function_call":
                calls.append({"name": item.get("name"), "arguments": item.get("arguments")})
            elif item.get("type") == "function_call_output":
                output = item.get("output")
                results.append(output if isinstance(output, str) else json.dumps(output))
    return Run(r.returncode, r.stdout, r.stderr, calls, results)


def run_claude(exe: Path, base_url: str, prompt: str, root: Path, *args: str, timeout: float = 600, **env: str) -> Run:
    """`claude -p PROMPT` with ANTHROPIC_BASE_URL, as Claude Code's documentation sets a gateway up."""
    home, work = root / "home", root / "work"
    for d in (home, work):
        d.mkdir(parents=True, exist_ok=True)
    r = _client(
        [str(exe), "-p", prompt, *args],
        _env(home, ANTHROPIC_BASE_URL=base_url, ANTHROPIC_API_KEY="local", **env),
        work,
        timeout,
    )
    calls, results = [], []
    for log in sorted((home / ".claude" / "projects").rglob("*.jsonl")):
        for line in log.read_text().splitlines():
            message = json.loads(line).get("message") or {}
            for block in message.get("content") or [] if isinstance(message.get("content"), list) else []:
                if block.get("type") == "tool_use":
                    calls.append({"name": block.get("name"), "arguments": block.get("input")})
                elif block.get("type") == "tool_result":
                    content = block.get("content")
                    results.append(content if isinstance(content, str) else json.dumps(content))
    return Run(r.returncode, r.stdout, r.stderr, calls, results)
