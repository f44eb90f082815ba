"""The `edgeinfer` command: thin click wrappers that build a config and call a factory.

Engine and sampling options come from edgeinfer.options through edgeinfer.cli.flags;
each command here parses, builds the config, calls the factory next to what it builds
(make_engine, make_server, run_top, run_bench) and runs it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from edgeinfer.bench.spec import BenchOptions
from edgeinfer.cli.errors import errors_as_messages
from edgeinfer.cli.flags import engine_config, engine_options, options_from, sampling_options, sampling_params, take
from edgeinfer.cli.pull import pull
from edgeinfer.cli.worker import worker
from edgeinfer.errors import ConfigError, EdgeInferError
from edgeinfer.events import Finish
from edgeinfer.options import MAX_GRAMMAR_CHARS, EngineConfig, Grammar
from edgeinfer.server.pool import DEFAULT_LOAD_TIMEOUT_S, DEFAULT_MAX_MODELS, Serving


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="edgeinfer")
@click.pass_context
def main(ctx: click.Context) -> None:
    """edgeinfer: run local LLMs fast, many streams at once, on llama.cpp.

    `serve` and `chat` start from the settings file that `bench --tune` writes
    (~/.config/edgeinfer/config.toml, or $EDGEINFER_CONFIG); flags override it.
    """
    if ctx.invoked_subcommand in ("serve", "chat"):
        from edgeinfer.settings import load

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
        from edgeinfer.settings import config_path

        click.echo(click.style(f"settings from {config_path()}: {' '.join(from_file)}", dim=True), err=True)


@main.command()
@engine_options("chat")
@sampling_options()
@click.option("--system", "-s", default=None, help="System prompt.")
@click.option("--socket", "socket_path", default=None, help="Talk to a running `edgeinfer serve` on this socket.")
@click.option("--api-key", envvar="EDGEINFER_API_KEY", default=None, help="With --socket: the server's API key.")
@click.option("--resume", is_flag=True, help="Continue the last conversation (its KV comes back from disk).")
@errors_as_messages
def chat(system: str | None, socket_path: str | None, api_key: str | None, resume: bool, **kw: Any) -> None:
    """Chat with a model in the terminal. /reset, /exit, /help.

    The conversation is kept after each reply, and its KV in the cache folder
    (--cache-dir, by default ~/.cache/edgeinfer/kv), so `edgeinfer chat --resume` starts warm.
    """
    from edgeinfer.chat_repl import EngineBackend, SocketBackend, chat_loop, history_path, load_history

    params = sampling_params(kw)
    _note_settings_file()
    history = load_history(history_path()) if resume else None
    if socket_path:
        chat_loop(SocketBackend(socket_path, api_key), system, params, history, history_path())
        return
    from edgeinfer.runtime import make_engine

    if kw.get("cache_dir") is None:
        kw["cache_dir"] = default_kv_dir()
    config = engine_config(kw)
    config.parallel = min(config.parallel or 2, 2)  # one conversation at a time
    click.echo(click.style(f"loading model... (KV: {kv_summary(config)})", dim=True), err=True)
    engine = make_engine(config)
    if engine.offload is not None and engine.offload.gpus:
        click.echo(click.style(engine.offload.line(), dim=True), err=True)
    try:
        chat_loop(EngineBackend(engine), system, params, history, history_path())
    finally:
        engine.close()


def default_kv_dir() -> Path:
    """Where `chat` keeps conversations' KV unless --cache-dir says otherwise."""
    import platformdirs

    return platformdirs.user_cache_path("edgeinfer") / "kv"


def kv_summary(config: EngineConfig) -> str:
    """What the KV layout gives each stream, as llama.cpp will size it (rounded up to 256 cells), why, its
    memory, and what --flash-attn auto comes to on this machine."""
    from edgeinfer.engine.sizing import pad, sized
    from edgeinfer.llamacpp import resolve_flash_attn
    from edgeinfer.models.gguf import read_gguf

    info = read_gguf(config.model)
    config, s = sized(config, info)
    sliding = bool(info.sliding_window)
    fa = resolve_flash_attn(config.flash_attn, config.kv_type, config.gpu_layers, sliding)
    why = "on the CPU for sliding-window attention" if fa == "on" else "off on the CPU and on Vulkan"
    attention = f"flash attention {fa}" + (f" (auto: {why})" if fa != config.flash_attn else "")
    memory = f"about {s.kv_bytes / 2**20:,.0f} MiB"
    if config.kv_layout == "unified":
        cells = pad(config.ctx_size)
        return f"unified, {cells} cells shared by up to {config.parallel} streams ({memory}); {attention}"
    per = pad(pad(config.ctx_size) // config.parallel)
    return f"per-seq, {config.parallel} streams of {per} cells each ({s.why}; {memory}); {attention}"


@main.command()
@click.option(
    "--model",
    "-m",
    "models",
    multiple=True,
    help=f"{EngineConfig.model_fields['model'].description} Repeat to serve several; the first is the default.",
)
@options_from(EngineConfig, [n for n in EngineConfig.model_fields if n != "model"], command="serve")
@click.option(
    "--models-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Also serve every .gguf in this folder, by file name without .gguf.",
)
@click.option(
    "--max-models",
    type=click.IntRange(min=0),
    default=DEFAULT_MAX_MODELS,
    show_default=True,
    help="Models in memory at once; loading one more unloads the least recently used idle one (0: no bound).",
)
@click.option(
    "--idle-unload",
    type=click.FloatRange(min=0),
    default=0.0,
    show_default=True,
    help="Unload a model after this many seconds without a request (0: never).",
)
@click.option(
    "--load-timeout",
    type=click.FloatRange(min=0.1),
    default=DEFAULT_LOAD_TIMEOUT_S,
    show_default=True,
    help="Seconds a request waits for its model to load before a 503 with Retry-After (the load goes on).",
)
@click.option(
    "--alias",
    "aliases",
    multiple=True,
    metavar="NAME=MODEL",
    help="A model name clients send (claude-sonnet-4-5, gpt-5) answered by one of the served models; repeatable. "
    "A server of one model answers to any name.",
)
@click.option(
    "--socket", "socket_path", default=None, help="Unix socket path [default: $XDG_RUNTIME_DIR/edgeinfer.sock]."
)
@click.option("--no-socket", is_flag=True, help="Serve TCP only (needs --port).")
@click.option("--host", default="127.0.0.1", show_default=True, help="TCP address, with --port.")
@click.option("--port", type=int, default=None, help="Also serve TCP on this port (off by default).")
@click.option("--api-key", envvar="EDGEINFER_API_KEY", default=None, help="Require 'Authorization: Bearer KEY'.")
@click.option(
    "--grace",
    type=click.FloatRange(min=0),
    default=10.0,
    show_default=True,
    help="Seconds requests in flight get to finish on shutdown.",
)
@click.option(
    "--max-body-mb",
    type=click.FloatRange(min=0.001),
    default=8.0,
    show_default=True,
    help="Largest request body in MiB; larger ones get 413.",
)
@click.option("--dashboard", is_flag=True, help="Show the live dashboard (`edgeinfer top`) in this terminal.")
@errors_as_messages
def serve(
    socket_path: str | None,
    no_socket: bool,
    host: str,
    port: int | None,
    api_key: str | None,
    grace: float,
    max_body_mb: float,
    dashboard: bool,
    models: tuple[str, ...],
    models_dir: Path | None,
    max_models: int,
    idle_unload: float,
    load_timeout: float,
    aliases: tuple[str, ...],
    **kw: Any,
) -> None:
    """Serve the OpenAI API (chat, completions, models) on a Unix socket.

    Several models: -m A -m B and/or --models-dir DIR; a request's `model` picks one (its id in
    /v1/models, or the name given here), loaded on first use."""
    from edgeinfer.openmp import several_engines, spin_at_barriers

    _note_settings_file()
    named = list(models) or [m for m in [(click.get_current_context().default_map or {}).get("model")] if m]
    if named:
        kw["model"] = named[0]
    config = engine_config(kw)
    pairs = [a.partition("=") for a in aliases]
    bad = [a for a, (name, eq, target) in zip(aliases, pairs, strict=True) if not (name and eq and target)]
    if bad:
        raise click.UsageError(f"--alias {bad[0]}: write NAME=MODEL, e.g. --alias claude-sonnet-4-5=default")
    serving = Serving(named, models_dir, max_models, idle_unload, load_timeout, {n: t for n, _, t in pairs})
    if several_engines(len(named), models_dir is not None, max_models):
        spin_at_barriers()  # before llama.cpp loads, with the server's modules (edgeinfer/openmp.py)
    from edgeinfer.server.app import make_server
    from edgeinfer.server.listen import default_socket_path
    from edgeinfer.server.listen import serve as run_server

    if no_socket and port is None:
        raise click.UsageError("--no-socket needs --port: there would be nothing to listen on")
    if no_socket and dashboard:
        raise click.UsageError("--dashboard reads the Unix socket; drop --no-socket")
    path = None if no_socket else Path(socket_path).expanduser() if socket_path else default_socket_path()
    if port is not None and not api_key:
        click.echo(
            click.style(
                f"WARNING: --port {port} without --api-key: anyone who can reach {host}:{port} can use this "
                "server. Pass --api-key KEY (or set EDGEINFER_API_KEY).",
                fg="red",
                bold=True,
            ),
            err=True,
        )
    app = make_server(config, api_key, max_body_mb=max_body_mb, serving=serving)
    pool = app.state.edgeinfer.pool
    where = [f"unix:{path}"] if path else []
    if port is not None:
        where.append(f"http://{host}:{port}")
    served = ", ".join(pool.slots) if len(pool.slots) <= 4 else f"{len(pool.slots)} models ({pool.default} first)"
    click.echo(f"edgeinfer: serving {served} on {' and '.join(where)} (Ctrl-C to stop)", err=True)
    click.echo(f"edgeinfer: KV {kv_summary(config)}", err=True)
    tcp = (host, port) if port is not None else None
    if dashboard:
        from edgeinfer.tui.launch import serve_with_dashboard

        assert path is not None
        serve_with_dashboard(app, path, tcp, grace, api_key)
        return
    run_server(app, path, tcp, grace_s=grace)


@main.command()
@engine_options("generate")
@sampling_options()
@click.argument("prompt")
@click.option("-n", "n", type=click.IntRange(1, 128), default=1, show_default=True, help="Streams of this prompt.")
@click.option("--raw", is_flag=True, help="Send PROMPT as is, without the chat template.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object with texts and figures.")
@click.option(
    "--json-schema",
    "schema_file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Hold the reply to this JSON Schema (a file); print the parsed, validated object.",
)
@click.option(
    "--grammar",
    "grammar_file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Hold the reply to this Lark grammar (llguidance's dialect; a file).",
)
@errors_as_messages
def generate(
    prompt: str, n: int, raw: bool, as_json: bool, schema_file: Path | None, grammar_file: Path | None, **kw: Any
) -> None:
    """Generate a reply to PROMPT; -n K runs K streams of it in one packed batch."""
    from edgeinfer.events import Chunk
    from edgeinfer.runtime import make_engine

    sampling = sampling_params(kw)
    if schema_file or grammar_file:
        sampling = sampling.model_copy(update={"grammar": grammar_from_file(schema_file, grammar_file)})
    config = engine_config(kw)
    config = config.replace(parallel=max(config.parallel, n), batch_size=max(config.batch_size, n))
    engine = make_engine(config)
    try:
        tokens = engine.tokenize(prompt) if raw else engine.chat_prompt([{"role": "user", "content": prompt}])
        handles = engine.submit(tokens, sampling, n=n)
        if schema_file is not None:
            for h in handles:
                click.echo(json.dumps(checked_json(h.result(), schema_file), indent=2, ensure_ascii=False))
            return
        if as_json or n > 1:
            finishes = [h.result() for h in handles]
        else:
            for ev in handles[0]:
                if isinstance(ev, Chunk):
                    click.echo(ev.text, nl=False)
            click.echo()
            finishes = [handles[0].result()]
    finally:
        engine.close()
    from edgeinfer.chat_repl import stats_line

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


def grammar_from_file(schema_file: Path | None, grammar_file: Path | None) -> Grammar:
    if schema_file and grammar_file:
        raise ConfigError("--json-schema and --grammar cannot be combined; give one")
    path = schema_file or grammar_file
    assert path is not None
    source = path.read_text(encoding="utf-8")
    if not source.strip() or len(source) > MAX_GRAMMAR_CHARS:
        raise ConfigError(f"{path}: a schema or grammar of 1 to {MAX_GRAMMAR_CHARS} characters is needed")
    flag = "--json-schema" if schema_file else "--grammar"
    return Grammar(kind="json_schema" if schema_file else "lark", source=source, origin=f"{flag} {path}")


def checked_json(finish: Finish, schema_file: Path) -> Any:
    """The reply as a parsed object that validates against the schema, or an error that says why not."""
    import jsonschema

    if finish.finish_reason != "stop":
        why = finish.error or "max_tokens cut the reply before the JSON closed; raise --max-tokens"
        raise ConfigError(f"no complete JSON reply ({why})")
    value = json.loads(finish.text)
    jsonschema.validate(value, json.loads(schema_file.read_text(encoding="utf-8")))
    return value


@main.command()
@engine_options("bench")
@options_from(BenchOptions)
@click.pass_context
@errors_as_messages
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
    from edgeinfer.bench.command import run_bench

    user_set = {name for name in kw if ctx.get_parameter_source(name) not in (None, click.core.ParameterSource.DEFAULT)}
    options = BenchOptions(**take(BenchOptions, kw))
    if "spec" not in user_set:
        kw["spec"] = "off"  # the benchmark measures speculation only when asked
    run_bench(options, engine_config(kw), user_set)


@main.command()
@click.option("--socket", "socket_path", default=None, help="The server's socket [default: serve's default].")
@click.option("--api-key", envvar="EDGEINFER_API_KEY", default=None, help="The server's API key, if it has one.")
@click.option("--interval", type=click.FloatRange(0.05, 60), default=1.0, show_default=True, help="Seconds per update.")
@errors_as_messages
def top(socket_path: str | None, api_key: str | None, interval: float) -> None:
    """Live dashboard of a running `edgeinfer serve`: tok/s, latencies, KV cache, streams. q quits, ? helps."""
    from edgeinfer.tui.launch import run_top

    run_top(socket_path, api_key, interval)


@main.group(invoke_without_command=True)
@click.option("--rpc", default=None, help="Show how --model's layers split over this machine and these workers.")
@click.option("--model", "-m", default=None, help="With --rpc: the model [default model].")
@click.option("--tensor-split", default=None, help="With --rpc: shares, this machine first (as serve's).")
@click.pass_context
@errors_as_messages
def models(ctx: click.Context, rpc: str | None, model: str | None, tensor_split: str | None) -> None:
    """List the model catalog and the model files present; with --rpc, a model's split over workers."""
    from edgeinfer.models.listing import list_models, show_split

    if rpc is not None:
        show_split(EngineConfig(model=model, rpc=rpc, tensor_split=tensor_split))
    elif ctx.invoked_subcommand is None:
        list_models()


@models.command("show")
@click.argument("path")
@errors_as_messages
def models_show(path: str) -> None:
    """Print what a GGUF file's metadata says."""
    from edgeinfer.models.listing import show_model

    show_model(path)


@models.command("quantize")
@click.argument("src")
@click.argument("dst", type=click.Path(dir_okay=False))
@click.argument("qtype")
@click.option("--force", is_flag=True, help="Replace DST if it exists (never SRC itself).")
@errors_as_messages
def models_quantize(src: str, dst: str, qtype: str, force: bool) -> None:
    """Write a copy of SRC at precision QTYPE (F16, Q8_0, Q4_0, Q4_K_M...) to DST."""
    from edgeinfer.llamacpp import quantize
    from edgeinfer.models.catalog import resolve_model

    source = resolve_model(src)
    click.echo(f"quantizing {source} to {qtype.upper()} -> {dst}", err=True)
    quantize(source, Path(dst).expanduser(), qtype, overwrite=force)
    click.echo(f"wrote {dst}")


main.add_command(worker)
main.add_command(pull)
