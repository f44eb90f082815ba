"""`edgeinfer pull REPO[:QUANT]`: a GGUF from the Hugging Face Hub into its cache, checked complete."""

from __future__ import annotations

import sys

import click

from edgeinfer.cli.errors import errors_as_messages
from edgeinfer.errors import ConfigError
from edgeinfer.models import files, hub
from edgeinfer.models.catalog import load_catalog


def ref_of(name: str) -> hub.HubRef:
    """NAME as a Hub reference: REPO[:QUANT], an hf.co/ or huggingface.co address, or a pullable catalog name."""
    ref = hub.parse_ref(name)
    if ref is not None:
        return ref
    for entry in load_catalog():
        if entry.name == name and entry.repo:
            return hub.HubRef(entry.repo, entry.quant or None)
    raise ConfigError(f"{name}: not a Hub name; pull takes REPO[:QUANT], e.g. ggml-org/gemma-3-1b-it-GGUF:Q4_K_M")


@click.command("pull")
@click.argument("name")
@errors_as_messages
def pull(name: str) -> None:
    """Download NAME (REPO[:QUANT]) from the Hugging Face Hub and print its path.

    \b
    QUANT picks the GGUF whose file name carries it (Q4_K_M, q8_0...); without it, the
    first the repo has of Q4_K_M, Q4_K_S, Q4_0, Q4_1, IQ4_XS, IQ4_NL, Q5_K_M, ... F16, F32,
    else its first GGUF. Split GGUFs come whole; mmproj files are skipped. Files land in
    the Hugging Face cache (HF_HOME, HF_HUB_CACHE), shared with other tools; HF_ENDPOINT,
    HF_TOKEN and HF_HUB_OFFLINE are honoured. A model already there sends no request.
    Any command's --model takes the same names and pulls on first use.
    """
    ref = ref_of(name)
    try:
        cached = hub.cached_path(ref)
        path = cached or hub.pull(ref)
    except KeyboardInterrupt:
        # huggingface_hub has deleted this process's partial file on the way out: nothing passes as complete.
        click.echo(f"edgeinfer: pull of {name} interrupted; nothing partial was kept; run it again", err=True)
        sys.exit(130)
    # Both checked every part as a GGUF already; the sizes come from the files.
    parts = files.parts_of(path)
    size = sum(p.stat().st_size for p in parts) / 1e6
    how = "already in the cache" if cached else "pulled"
    click.echo(
        f"{how}: {ref.repo} {path.name}, {size:.0f} MB" + (f" in {len(parts)} parts" if len(parts) > 1 else ""),
        err=True,
    )
    click.echo(str(path))
