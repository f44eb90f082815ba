"""The `edgeinfer` command."""

from edgeinfer.cli.commands import main

__all__ = ["main"]
