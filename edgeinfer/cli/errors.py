"""How every command ends on an error: a one-line message and a non-zero exit, never a traceback."""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
from typing import Any

import click

from edgeinfer.errors import EdgeInferError


def errors_as_messages(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Show EdgeInferError as a one-line message and a non-zero exit, never a traceback."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except EdgeInferError as e:
            exit_if_wedged(f"edgeinfer: error: {e}")
            raise click.ClickException(str(e)) from None
        finally:
            exit_if_wedged()

    return wrapper


def exit_if_wedged(message: str | None = None) -> None:
    """After llama.cpp aborted (a worker stopped answering) a thread of it is parked for good, and its
    clean-up at exit could wait on that thread: leave at once, with the message."""
    ggml = sys.modules.get("edgeinfer.llamacpp.ggml")
    if ggml is not None and ggml.wedged():
        if message:
            print(message, file=sys.stderr, flush=True)
        sys.stdout.flush()
        os._exit(1)
