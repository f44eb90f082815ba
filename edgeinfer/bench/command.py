"""`edgeinfer bench`: turn the command line into targets, run the job, print and save the results."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from edgeinfer.bench.apis import parse_apis
from edgeinfer.bench.spec import BenchOptions
from edgeinfer.bench.targets import EngineTarget, RawTarget, ServerTarget, Target
from edgeinfer.bench.workloads import MAX_TOKENS, messages
from edgeinfer.errors import ConfigError
from edgeinfer.options import EngineConfig
from edgeinfer.runtime import make_engine


def run_bench(req: BenchOptions, config: EngineConfig, user_set: set[str]) -> None:
    """Run what the options ask for: a sweep (the default), --quality or --tune; print and save the results."""
    levels = req.levels()
    max_tokens = req.max_tokens if req.max_tokens is not None else MAX_TOKENS[req.workload]
    remote = bool(req.sockets or req.urls)
    jobs = [name for name, on in (("--quality", req.quality), ("--tune", req.tune)) if on]
    if len(jobs) > 1 or (jobs and remote):
        raise click.UsageError(f"{' and '.join(jobs + (['--socket/--url'] if remote else []))} cannot be combined")
    apis = parse_apis(req.api)
    if apis != ["chat"] and (not remote or jobs or req.workload == "json"):
        raise click.UsageError(
            "--api responses/messages streams a sweep from --socket/--url (not --quality, --tune or --workload json)"
        )
    if req.dashboard and remote and not req.in_process:
        raise click.UsageError("--dashboard shows the in-process engine; watch a server with `edgeinfer top --socket`")
    # ~ expanded once, here: the paths checked now are the paths written after the sweep.
    if req.json_out and req.json_out != "-":
        req.json_out = str(Path(req.json_out).expanduser())
    if req.plot_out:
        req.plot_out = str(Path(req.plot_out).expanduser())
    for option, dest in (("--json", req.json_out), ("--plot", req.plot_out)):
        if dest and dest != "-" and not Path(dest).resolve().parent.is_dir():
            raise ConfigError(f"{option} {dest}: its folder does not exist; create it first")
    out_to_stdout = req.json_out == "-"
    echo = lambda line: click.echo(line, err=out_to_stdout)  # noqa: E731  # tables leave stdout to the JSON

    if req.quality:
        _quality(req, config, max_tokens if req.max_tokens is not None else 64, echo)
        return
    if req.tune:
        _tune(req, config, user_set, levels, max_tokens, echo)
        return
    if req.workload == "json":
        _json(req, config, user_set, levels, max_tokens, echo)
        return

    servers = [
        ServerTarget(socket=Path(p).expanduser(), model=req.remote_model, api_key=req.api_key, api=api)
        for p in req.sockets
        for api in apis
    ]
    servers += [
        ServerTarget(url=u, model=req.remote_model, api_key=req.api_key, api=api) for u in req.urls for api in apis
    ]
    engine = None
    targets: list[Target] = list(servers)
    if not remote or req.in_process or req.raw:
        config = _engine_config(config, user_set, servers, req.workload, levels, max_tokens)
        engine = make_engine(config)
        if config.spec != "off":
            targets += [
                EngineTarget(engine, f"spec {config.spec}", speculate=True),
                EngineTarget(engine, "spec off", speculate=False),
            ]
        else:
            targets.append(EngineTarget(engine))
        if req.raw:
            targets.append(RawTarget(engine))
    try:
        sweep = _sweep(req, engine, targets, levels, max_tokens)
        validity = _tool_validity(targets, min(max(levels), 16)) if req.workload == "agent" else []
    finally:
        if engine is not None:
            engine.close()

    from edgeinfer.bench.report import print_sweep, write_json

    print_sweep(sweep, echo)
    for line in validity:
        echo(line)
    if req.json_out:
        write_json(sweep, req.json_out)
    if req.plot_out:
        from edgeinfer.bench.plot import plot_sweep

        plot_sweep(sweep, req.plot_out)
        click.echo(f"wrote {req.plot_out}", err=True)


def _tool_validity(targets: list[Target], n: int) -> list[str]:
    """Each target answers n agent conversations with real tools and tool_choice "required" (greedy): the share
    of replies that are tool calls whose arguments validate against the tool's parameters."""
    from edgeinfer.bench.targets import calls_validate, tool_replies
    from edgeinfer.bench.workloads import agent_tools

    tools = agent_tools()
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in tools}  # type: ignore[index]

    lines = [f"\ntool calls with real tools (tool_choice required, greedy, {n} agent conversations):"]
    for t in targets:
        replies = tool_replies(t, messages("agent", n, head="[tools] "), tools, 128)
        if all(r is None for r in replies):
            continue
        ok = sum(1 for r in replies if r is not None and calls_validate(r[1], schemas))
        lines.append(f"  {t.name}: {ok}/{n} replies are tool calls whose arguments validate")
    return lines


def _sweep(req: BenchOptions, engine: Any, targets: list[Target], levels: list[int], max_tokens: int) -> Any:
    from edgeinfer.bench.progress import BarProgress
    from edgeinfer.bench.sweep import SayProgress, run_sweep, runs_in

    if req.dashboard and engine is not None:
        from edgeinfer.tui.launch import bench_with_dashboard

        job = lambda say: run_sweep(targets, req.workload, levels, max_tokens, req.repeats, SayProgress(say))  # noqa: E731
        return bench_with_dashboard(engine, job)
    with BarProgress(runs_in(levels, req.repeats, len(targets))) as bar:
        return run_sweep(targets, req.workload, levels, max_tokens, req.repeats, bar)


def _engine_config(
    config: EngineConfig,
    user_set: set[str],
    servers: list[ServerTarget],
    workload: str,
    levels: list[int],
    max_tokens: int,
) -> EngineConfig:
    """The in-process engine: an edgeinfer server's own settings when measured beside one, else sized for the sweep."""
    info = servers[0].edgeinfer_info() if servers else None
    if info is not None:
        m = info.model
        return config.replace(
            model=m.path, ctx_size=m.ctx_size, parallel=m.parallel, kv_type=m.kv_type, gpu_layers=m.gpu_layers
        )
    config = config.replace(parallel=max(levels), batch_size=max(config.batch_size, max(levels)))
    _fit_ctx(config, user_set, workload, max(levels), max_tokens)
    return config


def _fit_ctx(config: EngineConfig, user_set: set[str], workload: str, streams: int, max_tokens: int) -> None:
    """Unless --ctx-size was given or left to the engine (0: each stream the model's trained context, as the
    KV budget holds), grow the KV cache so that `streams` of the workload fit at once."""
    if "ctx_size" in user_set or not config.ctx_size:
        return
    need = kv_cells_needed(workload, streams, max_tokens)
    if need > config.ctx_size:
        click.echo(f"KV cache sized to {need} cells for {streams} streams; --ctx-size sets it", err=True)
        config.ctx_size = need


def kv_cells_needed(workload: str, streams: int, max_tokens: int) -> int:
    """KV cells for `streams` of the workload at once, rounded up to 1024.

    The engine reserves each stream's prompt and answer; prompts are estimated at 2.5
    characters per token (the workloads measure 2.7 to 4), plus the chat template.
    """
    longest = max(
        sum(len(m["content"]) for m in conv) for conv in messages(workload, streams, "(again) ", "[run 00.0.0] ")
    )
    need = streams * (longest * 2 // 5 + 64 + max_tokens)
    return -(-need // 1024) * 1024


def _json(
    req: BenchOptions,
    config: EngineConfig,
    user_set: set[str],
    levels: list[int],
    max_tokens: int,
    echo: Callable[[str], None],
) -> None:
    """--workload json: constrained against free decoding in the in-process engine."""
    from edgeinfer.bench.jsonload import json_report, print_json_bench, run_json_bench
    from edgeinfer.bench.report import write_text

    if req.sockets or req.urls or req.raw or req.plot_out or req.dashboard:
        raise click.UsageError("--workload json measures the in-process engine: drop --socket/--url/--raw/--plot")
    engine = make_engine(_engine_config(config, user_set, [], "json", levels, max_tokens))
    try:
        results = run_json_bench(engine, levels, max_tokens, req.repeats, lambda line: click.echo(line, err=True))
    finally:
        engine.close()
    print_json_bench(results, echo)
    if req.json_out:
        write_text(json.dumps(json_report(results), indent=2), req.json_out)


def _quality(
    req: BenchOptions,
    config: EngineConfig,
    max_tokens: int,
    echo: Callable[[str], None],
) -> None:
    from edgeinfer.bench.quality import compare, print_quality

    config = config.replace(spec="off", parallel=16, batch_size=max(config.batch_size, 16))
    reference = config.replace(model=req.ref_model or config.model, kv_type=req.ref_kv_type)
    name = lambda c: f"{c.model.name}, KV {c.kv_type}"  # noqa: E731
    names = (name(reference), name(config))
    if names[0] == names[1]:
        click.echo(
            "note: the reference and candidate settings are the same; the figures show only the run-to-run "
            "rounding of batched kernels. Pass --ref-model or --ref-kv-type, or change --model/--kv-type.",
            err=True,
        )
    say = lambda m: click.echo(click.style(m, dim=True), err=True)  # noqa: E731
    q = compare(lambda: make_engine(reference), lambda: make_engine(config), names, max_tokens, progress=say)
    print_quality(q, echo)
    if req.json_out:
        import json

        from edgeinfer.bench.report import write_text

        write_text(json.dumps(q.as_dict(), indent=2), req.json_out)


def _tune(
    req: BenchOptions,
    config: EngineConfig,
    user_set: set[str],
    levels: list[int],
    max_tokens: int,
    echo: Callable[[str], None],
) -> None:
    from edgeinfer import settings as settings_file
    from edgeinfer.bench.progress import BarProgress
    from edgeinfer.bench.tune import measured_tune, tune_runs

    _fit_ctx(config, user_set, req.workload, max(levels), max_tokens)
    with BarProgress(tune_runs(levels, req.repeats)) as bar:
        result = measured_tune(config, req.workload, levels, max_tokens, req.repeats, bar)
    echo(f"\ntuning on {req.workload}, {max_tokens} tokens per stream; aggregate tok/s at {result.parallel} streams")
    echo(f"parallel {result.parallel}: {result.knee_reason}")
    for setting in dict.fromkeys(t.setting for t in result.trials):
        cells = [f"{t.value}: {t.tps:.1f}" for t in result.trials if t.setting == setting]
        chosen = result.chosen[setting]
        shown = "all cores" if setting == "threads" and chosen == 0 else chosen
        echo(f"  {setting:<10} {'   '.join(cells)}   -> {shown}")
    note = (
        f"{config.model.name}, workload {req.workload}: "
        f"{result.tps:.1f} tok/s aggregate at {result.parallel} streams.\n"
        f"Settings tuned for this machine; the model is not saved (pass --model as usual)."
    )
    if "ctx_size" in user_set:
        result.chosen["ctx_size"] = config.ctx_size
    try:
        path = settings_file.save(result.chosen, note)
    except (OSError, ConfigError) as e:
        raise ConfigError(f"could not write the settings file: {e}") from None
    backup = path.with_name(path.name + ".bak")
    echo(f"\nwrote {path}" + (f" (the previous file is kept as {backup})" if backup.is_file() else "") + ":")
    for k, v in result.chosen.items():
        echo(f"  {k} = {v!r}")
    echo("`edgeinfer serve` and `edgeinfer chat` now start with these; a command-line flag overrides any of them.")
