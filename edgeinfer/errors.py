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


class HubError(EdgeInferError):
    """A model named on the Hugging Face Hub that could not be pulled (offline, unreachable, a bad download)."""

    http_status = 502
    code = "hub_error"


class HubNotFoundError(HubError):
    """A Hub repository, or a quant in it, that does not exist."""

    http_status = 404
    code = "model_not_found"


class HubAccessError(HubError):
    """A gated or private Hub repository the token (HF_TOKEN) has no access to."""

    http_status = 403
    code = "hub_access_denied"


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


class ContextLengthError(RequestError):
    """A prompt longer than a stream's context. The message is the one Anthropic's API gives (Claude Code
    reads the two figures from it and compacts the conversation), the code OpenAI's (Codex acts on it)."""

    code = "context_length_exceeded"

    def __init__(self, tokens: int, limit: int, fix: str) -> None:
        super().__init__(f"prompt is too long: {tokens} tokens > {limit} maximum ({fix})", "prompt")
        self.tokens = tokens
        self.limit = limit


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


class ModelNotFoundError(EdgeInferError):
    """A request naming a model the server does not serve."""

    http_status = 404
    code = "model_not_found"


class ModelLoadingError(EdgeInferError):
    """The requested model did not load within --load-timeout; the client should retry after retry_after seconds."""

    http_status = 503
    code = "model_loading"

    def __init__(self, message: str, retry_after: int = 1) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class ModelLoadFailedError(EdgeInferError):
    """The requested model's file failed to load; the server goes on serving the others."""

    http_status = 500
    code = "model_load_failed"
