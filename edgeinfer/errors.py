"""Errors a person can act on: each message names the problem and the fix."""

from __future__ import annotations


class EdgeInferError(Exception):
    """Base class: the CLI prints the message as is, the server maps it to a 4xx/5xx."""

    http_status = 500
    code = "internal_error"


class ModelFileError(EdgeInferError):
    """A model path that is missing, truncated, or not a GGUF file."""

    http_status = 400
    code = "model_file_error"


class ModelLoadError(EdgeInferError):
    """llama.cpp refused a file that looked like a valid GGUF."""

    code = "model_load_error"


class ConfigError(EdgeInferError):
    """An option or configuration value outside what the engine supports."""

    http_status = 400
    code = "invalid_config"


class RequestError(EdgeInferError):
    """A request that can never be served as given (too long, bad parameter)."""

    http_status = 400
    code = "invalid_request_error"

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class EngineClosedError(EdgeInferError):
    """A request made after the engine was closed or while it shuts down."""

    http_status = 503
    code = "engine_closed"


class EngineFailedError(EdgeInferError):
    """The engine thread stopped on an error it could not recover from; the process must be restarted."""

    http_status = 503
    code = "engine_failed"


class QueueFullError(EdgeInferError):
    """The waiting queue is at its bound; the client should retry later."""

    http_status = 503
    code = "queue_full"


class DecodeError(EdgeInferError):
    """llama_decode failed in a way the engine could not recover from."""

    code = "decode_error"
