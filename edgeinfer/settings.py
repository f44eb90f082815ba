"""The user's settings file: what `edgeinfer bench --tune` found best, read by `serve` and `chat`.

It is TOML in the user's config directory (~/.config/edgeinfer/config.toml on Linux), or
wherever $EDGEINFER_CONFIG points. Its [engine] table holds engine options by their
command-line names (with _ for -); a flag given on the command line wins over the file.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import tempfile
import time
import tomllib
from pathlib import Path
from typing import Annotated, Any

import platformdirs
import tomli_w
from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model

from edgeinfer.errors import ConfigError
from edgeinfer.options import EngineConfig

ENV = "EDGEINFER_CONFIG"


def _partial(model: type[BaseModel]) -> type[BaseModel]:
    """The model's fields, each optional, with the same types and ranges; nothing else allowed."""
    fields: dict[str, Any] = {}
    for name, f in model.model_fields.items():
        annotation: Any = f.annotation
        if annotation in (Path, Path | None):
            annotation = str  # a file path or catalog name, resolved when the config is built
        if f.metadata:
            annotation = Annotated[annotation, *f.metadata]
        fields[name] = (annotation | None, Field(None, description=f.description))
    strict = ConfigDict(extra="forbid", strict=True)
    return create_model(f"{model.__name__}Settings", __config__=strict, **fields)


# The [engine] table: every engine option (edgeinfer.options.EngineConfig), each optional.
EngineSettings = _partial(EngineConfig)


def config_path() -> Path:
    env = os.environ.get(ENV)
    return Path(env).expanduser() if env else platformdirs.user_config_path("edgeinfer") / "config.toml"


def load(path: Path | None = None) -> dict[str, Any]:
    """The [engine] settings in the file, validated; {} when there is no file."""
    path = path or config_path()
    if not path.is_file():
        return {}
    fix = f"fix it, or delete {path} (`edgeinfer bench --tune` writes a new one)"
    try:
        doc = tomllib.loads(path.read_text())
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise ConfigError(f"cannot read the settings file {path}: {e}; {fix}") from None
    unknown = set(doc) - {"engine"}
    if unknown:
        raise ConfigError(f"{path}: unknown table(s) {', '.join(sorted(unknown))}; only [engine] is read; {fix}")
    try:
        settings = EngineSettings.model_validate(doc.get("engine", {}))
    except ValidationError as e:
        problems = "; ".join(f"{'.'.join(map(str, err['loc'])) or 'engine'}: {err['msg']}" for err in e.errors())
        raise ConfigError(f"{path}: {problems}; {fix}") from None
    return settings.model_dump(exclude_none=True, mode="json")


def save(settings: dict[str, Any], note: str, path: Path | None = None) -> Path:
    """Merge settings into the [engine] table and write the file atomically, the old one kept as .bak.

    Keys the caller does not set (gpu_layers, flash_attn... that `--tune` does not measure)
    keep their values. The new text goes to a temporary file in the same folder and is renamed
    over the old one, so a crash or a full disk leaves either the old file or the new, never half.
    An old file that cannot be read is not merged, only kept as the backup.
    """
    path = path or config_path()
    try:
        merged = {**load(path), **settings}
    except ConfigError:
        merged = dict(settings)
    body = tomli_w.dumps({"engine": EngineSettings.model_validate(merged).model_dump(exclude_none=True, mode="json")})
    head = (
        f"# Written by `edgeinfer bench --tune` on {time.strftime('%Y-%m-%d %H:%M')}.\n"
        + "".join(f"# {line}\n" for line in note.splitlines())
        + "# `edgeinfer serve` and `edgeinfer chat` read this; a command-line flag overrides a value here.\n\n"
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(head + body)
            f.flush()
            os.fsync(f.fileno())
        if path.is_file():
            os.chmod(tmp, stat.S_IMODE(path.stat().st_mode))
            shutil.copy2(path, path.with_name(path.name + ".bak"))
        else:
            os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    return path
