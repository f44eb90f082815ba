"""The `edgeinfer` command: thin click wrappers that build a config and call a factory."""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from edgeinfer.errors import EdgeInferError
from edgeinfer.events import Chunk
from edgeinfer.params import EngineConfig, SamplingParams


def _errors_as_messages(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Show EdgeInferError as a one-line message and a non-zero exit, never a traceback."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except EdgeInferError as e:
            raise click.ClickException(str(e)) from None

    return wrapper


def engine_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The options that size and place the engine, shared by every command that loads a model."""
    options = [
        click.option("--model", "-m", default=None, help="GGUF file or catalog name (default: SmolLM2-135M Q4_1)."),
        click.option("--parallel", "-p", type=int, default=8, show_default=True, help="Streams decoded together."),
        click.option("--ctx-size", "-c", type=int, default=8192, show_default=True, help="KV cells for all streams."),
        click.option("--batch-size", "-b", type=int, default=512, show_default=True, help="Tokens per decode step."),
        click.option("--ubatch-size", type=int, default=512, show_default=True, help="Physical batch size."),
        click.option("--threads", "-t", type=int, default=0, help="CPU threads (default: all cores)."),
        click.option("--threads-batch", type=int, default=0, help="CPU threads for prompt processing."),
        click.option(
            "--gpu-layers", "-ngl", type=int, default=0, show_default=True, help="Layers to offload; -1: all."
        ),
        click.option("--flash-attn", type=click.Choice(["auto", "on", "off"]), default="auto", show_default=True),
        click.option("--kv-type", type=click.Choice(["f16", "q8_0", "q4_0"]), default="f16", show_default=True),
        click.option(
            "--spec",
            type=click.Choice(["off", "ngram", "draft", "auto"]),
            default="auto",
            show_default=True,
            help="Speculative decoding; auto drafts only where its measured costs pay (bench: default off).",
        ),
        click.option("--draft-model", default=None, help="Draft GGUF of the same vocabulary (for --spec draft/auto)."),
        click.option("--spec-max", type=int, default=8, show_default=True, help="Draft tokens per stream per step."),
        click.option("--draft-p-min", type=float, default=0.5, show_default=True, help="Draft confidence cut-off."),
    ]
    for opt in reversed(options):
        fn = opt(fn)
    return fn


def config_from(kw: dict[str, Any]) -> EngineConfig:
    """Pop the engine options out of a command's keyword arguments; refuse bad values."""
    config = EngineConfig(
        model=kw.pop("model"),
        parallel=kw.pop("parallel"),
        ctx_size=kw.pop("ctx_size"),
        batch_size=kw.pop("batch_size"),
        ubatch_size=kw.pop("ubatch_size"),
        threads=kw.pop("threads"),
        threads_batch=kw.pop("threads_batch"),
        gpu_layers=kw.pop("gpu_layers"),
        flash_attn=kw.pop("flash_attn"),
        kv_type=kw.pop("kv_type"),
        spec=kw.pop("spec"),
        spec_max=kw.pop("spec_max"),
        draft_p_min=kw.pop("draft_p_min"),
    )
    draft = kw.pop("draft_model")
    if draft is not None:
        from edgeinfer.models import resolve_model

        config.draft_model = resolve_model(draft)
    config.validate()
    return config


def make_engine(config: EngineConfig) -> Any:
    """The one factory the CLI, the server, the benchmark and the tests use."""
    from edgeinfer.engine import Engine

    return Engine(config)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="edgeinfer")
@click.pass_context
def main(ctx: click.Context) -> None:
    """edgeinfer: run local LLMs fast, many streams at once, on llama.cpp.

    `serve` and `chat` start from the settings file that `bench --tune` writes
    (~/.config/edgeinfer/config.toml, or $EDGEINFER_CONFIG); flags override it.
    """
    if ctx.invoked_subcommand in ("serve", "chat"):
        from edgeinfer.config import load

        try:
            settings = load()
        except EdgeInferError as e:
            raise click.ClickException(str(e)) from None
        if settings:
            ctx.default_map = {ctx.invoked_subcommand: settings}


def _note_settings_file() -> None:
    """Say which engine settings came from the settings file, if any did."""
    ctx = click.get_current_context()
    from_file = [
        f"{name}={ctx.params[name]}"
        for name in ctx.params
        if ctx.get_parameter_source(name) == click.core.ParameterSource.DEFAULT_MAP
    ]
    if from_file:
        from edgeinfer.config import config_path

        click.echo(click.style(f"settings from {config_path()}: {' '.join(from_file)}", dim=True), err=True)


@main.command()
@engine_options
@click.option("--system", "-s", default=None, help="System prompt.")
@click.option("--temperature", type=float, default=0.7, show_default=True)
@click.option("--max-tokens", type=int, default=None, help="Reply length limit in tokens.")
@click.option("--seed", type=int, default=None)
@click.option("--socket", "socket_path", default=None, help="Talk to a running `edgeinfer serve` on this socket.")
@click.option("--api-key", envvar="EDGEINFER_API_KEY", default=None, help="With --socket: the server's API key.")
@_errors_as_messages
def chat(
    system: str | None,
    temperature: float,
    max_tokens: int | None,
    seed: int | None,
    socket_path: str | None,
    api_key: str | None,
    **kw: Any,
) -> None:
    """Chat with a model in the terminal. /reset, /exit, /help."""
    from edgeinfer.repl import EngineBackend, SocketBackend, run_chat

    params = SamplingParams(temperature=temperature, max_tokens=max_tokens, seed=seed)
    params.validate()
    _note_settings_file()
    if socket_path:
        run_chat(SocketBackend(socket_path, api_key), system, params)
        return
    config = config_from(kw)
    config.parallel = min(config.parallel, 2)
    click.echo(click.style("loading model...", dim=True), err=True)
    engine = make_engine(config)
    try:
        run_chat(EngineBackend(engine), system, params)
    finally:
        engine.close()


@main.command()
@engine_options
@click.option(
    "--socket", "socket_path", default=None, help="Unix socket path [default: $XDG_RUNTIME_DIR/edgeinfer.sock]."
)
@click.option("--no-socket", is_flag=True, help="Serve TCP only (needs --port).")
@click.option("--host", default="127.0.0.1", show_default=True, help="TCP address, with --port.")
@click.option("--port", type=int, default=None, help="Also serve TCP on this port (off by default).")
@click.option("--max-queue", type=int, default=64, show_default=True, help="Waiting requests before 503s.")
@click.option("--api-key", envvar="EDGEINFER_API_KEY", default=None, help="Require 'Authorization: Bearer KEY'.")
@click.option("--grace", type=float, default=10.0, show_default=True, help="Seconds streams get to finish on shutdown.")
@click.option("--dashboard", is_flag=True, help="Show the live dashboard (`edgeinfer top`) in this terminal.")
@_errors_as_messages
def serve(
    socket_path: str | None,
    no_socket: bool,
    host: str,
    port: int | None,
    max_queue: int,
    api_key: str | None,
    grace: float,
    dashboard: bool,
    **kw: Any,
) -> None:
    """Serve the OpenAI API (chat, completions, models) on a Unix socket."""
    from edgeinfer.models import resolve_model
    from edgeinfer.server.run import default_socket_path
    from edgeinfer.server.run import serve as run_server

    _note_settings_file()
    config = config_from(kw)
    config.max_queue = max_queue
    config.validate()
    if no_socket and port is None:
        raise click.UsageError("--no-socket needs --port: there would be nothing to listen on")
    if no_socket and dashboard:
        raise click.UsageError("--dashboard reads the Unix socket; drop --no-socket")
    path = None if no_socket else Path(socket_path).expanduser() if socket_path else default_socket_path()
    model_path = resolve_model(config.model)
    app = make_server(config, api_key)
    where = [f"unix:{path}"] if path else []
    if port is not None:
        where.append(f"http://{host}:{port}")
    click.echo(f"edgeinfer: serving {model_path.name} on {' and '.join(where)} (Ctrl-C to stop)", err=True)
    if dashboard:
        from edgeinfer.tui.run import serve_with_dashboard

        serve_with_dashboard(app, path, (host, port) if port is not None else None, grace, api_key)
        return
    run_server(app, path, (host, port) if port is not None else None, grace_s=grace)


def make_server(config: EngineConfig, api_key: str | None = None, load_in_background: bool = True) -> Any:
    """The ASGI app over an engine made from config (the CLI and the tests use this)."""
    from edgeinfer.models import resolve_model
    from edgeinfer.server.app import make_app

    model_id = model_id_of(resolve_model(config.model))
    return make_app(lambda: make_engine(config), model_id, api_key, load_in_background)


def model_id_of(path: Path) -> str:
    """The id clients pass as `model`: the file name without .gguf."""
    return path.name.removesuffix(".gguf")


@main.command()
@engine_options
@click.argument("prompt")
@click.option("-n", "n", type=int, default=1, show_default=True, help="Streams of this prompt, packed together.")
@click.option("--max-tokens", type=int, default=128, show_default=True)
@click.option("--temperature", type=float, default=0.8, show_default=True, help="0 is greedy.")
@click.option("--top-k", type=int, default=40, show_default=True)
@click.option("--top-p", type=float, default=0.95, show_default=True)
@click.option("--min-p", type=float, default=0.05, show_default=True)
@click.option("--repeat-penalty", type=float, default=1.0, show_default=True)
@click.option("--seed", type=int, default=None)
@click.option("--stop", multiple=True, help="Stop string (repeatable).")
@click.option("--raw", is_flag=True, help="Send PROMPT as is, without the chat template.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object with texts and figures.")
@_errors_as_messages
def generate(prompt: str, n: int, raw: bool, as_json: bool, stop: tuple[str, ...], **kw: Any) -> None:
    """Generate a reply to PROMPT; -n K runs K streams of it in one packed batch."""
    sampling = SamplingParams(
        max_tokens=kw.pop("max_tokens"),
        temperature=kw.pop("temperature"),
        top_k=kw.pop("top_k"),
        top_p=kw.pop("top_p"),
        min_p=kw.pop("min_p"),
        repeat_penalty=kw.pop("repeat_penalty"),
        seed=kw.pop("seed"),
        stop=list(stop),
    )
    config = config_from(kw)
    config.parallel = max(config.parallel, n)
    engine = make_engine(config)
    try:
        tokens = engine.tokenize(prompt) if raw else engine.chat_prompt([{"role": "user", "content": prompt}])
        handles = engine.submit(tokens, sampling, n=n)
        if as_json or n > 1:
            finishes = [h.result() for h in handles]
        else:
            for ev in handles[0]:
                if isinstance(ev, Chunk):
                    click.echo(ev.text, nl=False)
            click.echo()
            finishes = [handles[0].finish]
    finally:
        engine.close()
    from edgeinfer.repl import stats_line

    if as_json:
        out = [
            {"index": f.index, "text": f.text, "finish_reason": f.finish_reason, **f.stats.as_dict()} for f in finishes
        ]
        click.echo(json.dumps({"prompt": prompt, "n": n, "completions": out}, indent=2))
        return
    for f in finishes:
        if n > 1:
            click.echo(click.style(f"--- stream {f.index} ---", bold=True))
            click.echo(f.text)
        click.echo(click.style(stats_line(f.stats), dim=True), err=True)


@main.command()
@engine_options
@click.option(
    "--workload",
    type=click.Choice(["chat", "code-edit", "agent", "long-prefill"]),
    default="chat",
    show_default=True,
    help="Fixed prompt set (edgeinfer/bench/workloads.py).",
)
@click.option("--concurrency", default="1,2,4,8,16,32", show_default=True, help="Comma-separated stream counts.")
@click.option(
    "--max-tokens",
    type=int,
    default=None,
    help="Tokens per stream [default: chat 128, code-edit 256, agent 64, long-prefill 32].",
)
@click.option(
    "--repeats", type=int, default=2, show_default=True, help="Cold+warm run pairs per level; the best is kept."
)
@click.option(
    "--socket",
    "sockets",
    multiple=True,
    help="An OpenAI server on this Unix socket (edgeinfer, llama-server); repeatable.",
)
@click.option(
    "--url", "urls", multiple=True, help="Any OpenAI-compatible endpoint, e.g. http://127.0.0.1:8080/v1; repeatable."
)
@click.option("--remote-model", default=None, help="With --socket/--url: the model name to send (default: its first).")
@click.option("--api-key", envvar="EDGEINFER_API_KEY", default=None, help="With --socket/--url: the API key.")
@click.option("--in-process", is_flag=True, help="With --socket/--url: measure an in-process engine beside them.")
@click.option("--raw", is_flag=True, help="Also measure a bare llama_decode loop on the engine's context.")
@click.option("--quality", is_flag=True, help="Greedy agreement of these settings with --ref-model/--ref-kv-type.")
@click.option("--ref-model", default=None, help="With --quality: the reference model [default: --model].")
@click.option(
    "--ref-kv-type",
    type=click.Choice(["f16", "q8_0", "q4_0"]),
    default="f16",
    show_default=True,
    help="With --quality.",
)
@click.option("--tune", is_flag=True, help="Find the best settings and save them for serve and chat.")
@click.option("--json", "json_out", default=None, help="Write the report as JSON to FILE, or - for stdout.")
@click.option("--plot", "plot_out", type=click.Path(dir_okay=False), default=None, help="Write a PNG plot to FILE.")
@click.option("--dashboard", is_flag=True, help="Show the live dashboard of the engine while it runs.")
@click.pass_context
@_errors_as_messages
def bench(ctx: click.Context, **kw: Any) -> None:
    """Measure throughput, TTFT and inter-token latency at each concurrency; find the knee.

    \b
    Targets (the same workload drives each, side by side):
      (default)        an in-process engine with the engine options
      --socket PATH    an OpenAI server on a Unix socket: edgeinfer serve, llama-server...
      --url URL        any OpenAI-compatible endpoint (llama-server, Ollama, vLLM)
      --raw            beside the engine, a bare llama_decode loop (the engine's overhead)
      --spec MODE      the engine with speculation MODE beside it with speculation off

    \b
    Other jobs:
      --quality        greedy agreement of these settings with a reference (quantization, KV type)
      --tune           sweep parallel, threads, batch size, KV type and speculation; save the
                       best to the settings file that serve and chat read
    """
    from edgeinfer.bench.run import BenchRequest, run_bench

    user_set = {name for name in kw if ctx.get_parameter_source(name) not in (None, click.core.ParameterSource.DEFAULT)}
    options = {k: kw.pop(k) for k in list(kw) if k in BenchRequest.__dataclass_fields__}
    config = config_from(kw)
    run_bench(BenchRequest(**options), config, user_set, make_engine)


@main.command()
@click.option("--socket", "socket_path", default=None, help="The server's socket [default: serve's default].")
@click.option("--api-key", envvar="EDGEINFER_API_KEY", default=None, help="The server's API key, if it has one.")
@click.option("--interval", type=click.FloatRange(0.05, 60), default=1.0, show_default=True, help="Seconds per update.")
@_errors_as_messages
def top(socket_path: str | None, api_key: str | None, interval: float) -> None:
    """Live dashboard of a running `edgeinfer serve`: tok/s, latencies, KV cache, streams. q quits, ? helps."""
    from edgeinfer.tui.run import run_top

    run_top(socket_path, api_key, interval)


@main.group(invoke_without_command=True)
@click.pass_context
@_errors_as_messages
def models(ctx: click.Context) -> None:
    """List the model catalog and the model files present."""
    if ctx.invoked_subcommand is None:
        from edgeinfer.modelinfo import list_models

        list_models()


@models.command("show")
@click.argument("path")
@_errors_as_messages
def models_show(path: str) -> None:
    """Print what a GGUF file's metadata says."""
    from edgeinfer.modelinfo import show_model

    show_model(path)


@models.command("quantize")
@click.argument("src")
@click.argument("dst", type=click.Path(dir_okay=False))
@click.argument("qtype")
@_errors_as_messages
def models_quantize(src: str, dst: str, qtype: str) -> None:
    """Write a copy of SRC at precision QTYPE (F16, Q8_0, Q4_0, Q4_K_M...) to DST."""
    from edgeinfer.llamacpp import quantize
    from edgeinfer.models import resolve_model

    source = resolve_model(src)
    click.echo(f"quantizing {source} to {qtype.upper()} -> {dst}", err=True)
    quantize(source, Path(dst), qtype)
    click.echo(f"wrote {dst}")


if __name__ == "__main__":
    sys.exit(main())
