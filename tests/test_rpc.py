"""llama.cpp RPC workers: `edgeinfer worker`, and --rpc spreading the default model's layers over this
machine and two workers on loopback. Every edgeinfer that uses workers runs as a subprocess here: a
worker serves one client at a time, and a client keeps its connection until it exits."""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from edgeinfer.client import async_client
from edgeinfer.errors import ConfigError
from edgeinfer.options import EngineConfig, parse_endpoints, parse_shares
from edgeinfer.runtime import make_engine

from . import gate
from .conftest import raw, start_server, stop_process
from .gate import drift_of, near_ties

pytestmark = pytest.mark.model

CLI = [sys.executable, "-m", "edgeinfer.cli"]
PROMPTS = ["Name three rivers.", "What is a CPU?", "Say hello in French.", "Count to five."]
TOKENS = 32


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_worker(port: int) -> subprocess.Popen:
    proc = subprocess.Popen(
        [*CLI, "worker", "--port", str(port), "--threads", "1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    from edgeinfer.llamacpp.rpc import probe

    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"worker exited: {proc.stderr.read()}"
        try:
            probe("127.0.0.1", port, timeout=2)
            return proc
        except ConfigError:
            time.sleep(0.2)
    proc.kill()
    raise AssertionError("the worker did not answer in 30 s")


@pytest.fixture(scope="module")
def workers():
    ports = [free_port(), free_port()]
    procs = [start_worker(p) for p in ports]
    yield ports, procs
    for p in procs:
        p.kill()
        p.wait()


def rpc_arg(ports: list[int]) -> str:
    return ",".join(f"127.0.0.1:{p}" for p in ports)


@pytest.fixture(scope="module")
def alone():
    """The local-only engine the answers are checked against (flash attention off on both sides)."""
    with make_engine(EngineConfig(model="default", parallel=1, spec="off", cache_ram=0, flash_attn="off")) as eng:
        yield eng


def assert_alone_answer(eng, prompt: str, text: str) -> None:
    """text is the alone greedy answer, or parts from it only at near-ties (scripts/near_ties.py), by the
    drift measured on this CPU."""
    ids = eng.chat_prompt([{"role": "user", "content": prompt}])
    answer = near_ties.Answer(ids, text, TOKENS, drift_of(eng).tie_nats)
    why = near_ties._parts_at_near_ties_only(eng, answer, ids, "", [])
    assert why is None, f"{prompt!r} -> {text!r}: {why}"


def test_endpoints_and_shares_are_checked():
    assert parse_endpoints("127.0.0.1:1, [::1]:2") == [("127.0.0.1", 1), ("::1", 2)]
    for bad in ("127.0.0.1", "h:0", "h:99999", "h:1,h:1", ":5"):
        with pytest.raises(ValueError):
            parse_endpoints(bad)
    assert parse_shares("1, 2.5,0") == [1.0, 2.5, 0.0]
    for bad in ("0,0", "1,-1", "a", "1,inf"):
        with pytest.raises(ValueError):
            parse_shares(bad)
    with pytest.raises(ConfigError, match="needs --rpc"):
        EngineConfig(tensor_split="1,1")


def test_a_worker_listens_on_loopback_unless_told_otherwise():
    out = subprocess.run([*CLI, "worker", "--host", "0.0.0.0"], capture_output=True, text=True, timeout=60)
    assert out.returncode != 0
    assert "--allow-remote" in out.stderr and "no authentication" in out.stderr
    assert "Traceback" not in out.stderr


def test_a_worker_on_a_port_in_use_is_a_clear_error():
    with socket.create_server(("127.0.0.1", 0)) as s:
        port = s.getsockname()[1]
        out = subprocess.run([*CLI, "worker", "--port", str(port)], capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and f"cannot listen on 127.0.0.1:{port}" in out.stderr
    assert "Traceback" not in out.stderr


def test_a_worker_whose_listening_socket_closes_a_moment_after_the_failure_is_named_down():
    from edgeinfer.llamacpp.rpc import workers_down

    with socket.create_server(("127.0.0.1", 0)) as live, socket.create_server(("127.0.0.1", 0)) as dying:
        ends = [("127.0.0.1", live.getsockname()[1]), ("127.0.0.1", dying.getsockname()[1])]
        threading.Timer(0.3, dying.close).start()  # a killed process's sockets do not all close at once
        said = workers_down(ends)
        assert said.startswith(f"RPC worker 127.0.0.1:{ends[1][1]} is down") and f":{ends[0][1]} " not in said
        assert workers_down(ends[:1], settle_s=0.2) == ""


def test_a_missing_worker_at_start_is_one_line_naming_it(workers):
    ports, _ = workers
    gone = free_port()
    out = subprocess.run(
        [*CLI, "generate", "hi", "--max-tokens", "4", "--rpc", f"127.0.0.1:{ports[0]},127.0.0.1:{gone}"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode != 0
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and f"127.0.0.1:{gone} is not reachable" in lines[0], out.stderr


def test_models_shows_the_split_over_this_machine_and_the_workers(workers):
    ports, _ = workers
    cmd = [*CLI, "models", "--rpc", rpc_arg(ports), "--tensor-split", "1,1,2"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    rows = [ln.split() for ln in out.stdout.splitlines() if ln.strip().startswith(("CPU", "RPC"))]
    assert [r[1] for r in rows] == ["local", f"127.0.0.1:{ports[0]}", f"127.0.0.1:{ports[1]}"]
    layers = [int(r[2]) for r in rows]
    assert sum(layers) == 31  # SmolLM2-135M: 30 layers and the output layer
    assert layers[0] < layers[2] and layers[1] < layers[2]  # shares 1:1:2


def test_generate_across_two_workers_gives_the_local_greedy_text(workers, alone):
    ports, _ = workers
    cmd = [*CLI, "generate", PROMPTS[0], "--json", "--temperature", "0", "--max-tokens", str(TOKENS)]
    cmd += ["--flash-attn", "off", "--spec", "off", "--rpc", rpc_arg(ports)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    text = json.loads(out.stdout)["completions"][0]["text"]
    assert text
    assert_alone_answer(alone, PROMPTS[0], text)


def test_the_server_across_two_workers_answers_four_streams_and_reports_the_split(workers, alone, tmp_path):
    ports, _ = workers
    sock = tmp_path / "s.sock"
    proc = start_server(sock, "--parallel", "4", "--flash-attn", "off", "--spec", "off", "--rpc", rpc_arg(ports))
    try:

        async def ask(c, prompt):
            r = await c.chat.completions.create(
                model="default", messages=[{"role": "user", "content": prompt}], temperature=0, max_tokens=TOKENS
            )
            return r.choices[0].message.content

        async def main():
            async with async_client(sock) as c:
                return await asyncio.gather(*(ask(c, p) for p in PROMPTS))

        texts = asyncio.run(main())
        stats = raw(sock).get("/v1/edgeinfer/stats").json()
        metrics = raw(sock).get("/metrics").text
    finally:
        stop_process(proc)
    for prompt, text in zip(PROMPTS, texts, strict=True):
        assert_alone_answer(alone, prompt, text)
    devices = stats["model"]["devices"]
    assert [d["where"] for d in devices] == ["local", f"127.0.0.1:{ports[0]}", f"127.0.0.1:{ports[1]}"]
    assert sum(d["layers"] for d in devices) == 31 and all(d["weight_bytes"] > 0 for d in devices)
    gate.contains(metrics, 'edgeinfer_device_layers{device="RPC')


def test_a_worker_killed_mid_stream_fails_the_stream_and_the_server_exits_with_the_reason(tmp_path):
    ports = [free_port(), free_port()]
    workers = [start_worker(p) for p in ports]
    sock = tmp_path / "s.sock"
    try:
        proc = start_server(sock, "--parallel", "2", "--spec", "off", "--rpc", rpc_arg(ports))
        body = {
            "model": "default",
            "messages": [{"role": "user", "content": "Tell me a long story."}],
            "max_tokens": 2000,
            "ignore_eos": True,
            "stream": True,
        }
        events, t_kill = [], None
        with raw(sock, timeout=60).stream("POST", "/v1/chat/completions", json=body) as r:
            for line in r.iter_lines():
                events.append(line)
                if t_kill is None and len(events) > 10:
                    workers[1].send_signal(signal.SIGKILL)
                    t_kill = time.monotonic()
        ended_s = time.monotonic() - t_kill
        rc = proc.wait(60)
        err = proc.stderr.read()
        assert ended_s < 30
        errors = [ln for ln in events if "error" in ln]
        assert any(f"127.0.0.1:{ports[1]} is down" in ln for ln in errors), (errors, events[-3:], err[-2000:])
        assert rc != 0 and f"RPC worker 127.0.0.1:{ports[1]} is down" in err, err[-2000:]
        assert "Traceback" not in err

        # Restart the worker and the server: it serves again.
        workers[1] = start_worker(ports[1])
        proc = start_server(sock, "--parallel", "2", "--spec", "off", "--rpc", rpc_arg(ports))
        r = raw(sock).post(
            "/v1/chat/completions",
            json={"model": "default", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8},
        )
        assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"]
        stop_process(proc)
    finally:
        for w in workers:
            w.kill()
            w.wait()


def test_the_dashboard_shows_the_split():
    from edgeinfer.engine.stats import DeviceStats, EngineStats, ModelStats
    from edgeinfer.tui.figures import model_lines

    devices = [
        DeviceStats(device="CPU", where="local", layers=10, weight_bytes=50 << 20),
        DeviceStats(device="RPC0", where="127.0.0.1:50052", layers=21, weight_bytes=70 << 20),
    ]
    lines = model_lines(EngineStats(model=ModelStats(name="m", devices=devices)))
    assert lines[-1] == "layers: CPU 10 (50 MiB) · RPC0 127.0.0.1:50052 21 (70 MiB)"
    assert not any(ln.startswith("layers:") for ln in model_lines(EngineStats(model=ModelStats(name="m"))))
