"""Click options derived from the pydantic declarations in edgeinfer.options (and the bench's own model).

A field becomes `--field-name` with the field's type, default and help text; a Literal
becomes a choice, a bool a flag, a list a repeatable option. Short flags and the
commands that show a field come from its `json_schema_extra` (see options._cli).
"""

from __future__ import annotations

import types
import typing
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Literal

import click
from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo

from edgeinfer.errors import ConfigError
from edgeinfer.options import EngineConfig, SamplingParams, flag, problems

F = Callable[..., Any]


def _base_type(annotation: Any) -> Any:
    """int | None -> int; Annotated[list[str], ...] -> list[str]."""
    if typing.get_origin(annotation) is typing.Annotated:
        annotation = typing.get_args(annotation)[0]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) == 1:
            return _base_type(args[0])
    return annotation


class IntOrWord(click.ParamType):
    """An integer, or one of some words: --gpu-layers auto."""

    def __init__(self, words: tuple[str, ...]) -> None:
        self.words = words
        self.name = "|".join([*words, "N"])

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, int) or value in self.words:
            return value
        try:
            return int(value)
        except ValueError:
            self.fail(f"{value!r} is not a whole number or {' or '.join(self.words)}", param, ctx)


def _click_type(annotation: Any) -> Any:
    base = _base_type(annotation)
    if typing.get_origin(base) in (typing.Union, types.UnionType):
        args = typing.get_args(base)
        words = [w for a in args if typing.get_origin(a) is Literal for w in typing.get_args(a)]
        if int in args and len(args) == 2 and words:
            return IntOrWord(tuple(str(w) for w in words))
    if typing.get_origin(base) is Literal:
        return click.Choice([str(x) for x in typing.get_args(base)])
    if base is Path:
        return str
    return base


def option_for(name: str, field: FieldInfo) -> Callable[[F], F]:
    """One click option for one pydantic field."""
    extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
    decls = [str(extra.get("cli_flag") or flag(name)), *typing.cast(list[str], extra.get("cli_short") or [])]
    base = _base_type(field.annotation)
    default = None if field.default_factory is not None or field.is_required() else field.default
    kw: dict[str, Any] = {"help": field.description, "default": default, "envvar": extra.get("cli_envvar")}
    if base is bool:
        kw["is_flag"] = True
        kw["default"] = bool(default)
    elif typing.get_origin(base) in (list, tuple):
        kw["multiple"] = True
        kw["type"] = typing.get_args(base)[0] if typing.get_args(base) else str
        kw["default"] = ()
    else:
        kw["type"] = _click_type(field.annotation)
        kw["show_default"] = default is not None and not isinstance(default, Path)
    return click.option(*decls, name, **kw)


def options_from(
    model: type[BaseModel], names: Iterable[str] | None = None, command: str | None = None
) -> Callable[[F], F]:
    """A decorator adding an option for each of the model's fields (or those named) shown on `command`."""
    chosen = []
    for name, field in model.model_fields.items():
        if names is not None and name not in names:
            continue
        extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
        commands = extra.get("cli_commands")
        if commands is not None and command not in typing.cast(list[str], commands):
            continue
        chosen.append(option_for(name, field))

    def decorate(fn: F) -> F:
        for opt in reversed(chosen):
            fn = opt(fn)
        return fn

    return decorate


def engine_options(command: str) -> Callable[[F], F]:
    """Every engine option, for a command that loads a model."""
    return options_from(EngineConfig, command=command)


def sampling_options(*skip: str) -> Callable[[F], F]:
    """The sampling settings a person sets on the command line."""
    hidden = ("ignore_eos", "logprobs", "grammar", "logit_bias", *skip)
    names = [n for n in SamplingParams.model_fields if n not in hidden]
    return options_from(SamplingParams, names)


def take(model: type[BaseModel], kw: dict[str, Any]) -> dict[str, Any]:
    """Pop the model's fields out of a command's keyword arguments (unset ones are left to the model)."""
    out = {}
    for name in model.model_fields:
        if name in kw:
            value = kw.pop(name)
            if value is not None and value != ():
                out[name] = list(value) if isinstance(value, tuple) else value
    return out


def engine_config(kw: dict[str, Any]) -> EngineConfig:
    """The engine options of a command's keyword arguments, checked (ConfigError names the flag)."""
    return EngineConfig(**take(EngineConfig, kw))


def sampling_params(kw: dict[str, Any]) -> SamplingParams:
    """The sampling settings of a command's keyword arguments, checked (ConfigError names the flag)."""
    try:
        return SamplingParams.model_validate(take(SamplingParams, kw))
    except ValidationError as e:
        raise ConfigError(problems(e, flag)) from None
