"""Fields the official APIs take that mean nothing on a local server: accepted, counted, logged once.

A request body is still validated strictly: a field no API knows is a 400 naming it, and a known
field with a wrong type or value is a 400 in the API's shape. But the agents people run send what
the official services take (Codex its `client_metadata` and `prompt_cache_key`, Claude Code its
`context_management`, `cache_control` on blocks, `metadata.user_id`), and a local server must not
refuse them. Each request model lists such fields in IGNORED; the route counts the ones a body set
(`Ignored.note`), the stats and /metrics show the counts per API and field, and the server's log
says once per field that it was taken and ignored. docs/apis.md lists every field each client sends.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Iterable
from typing import Any, ClassVar

from pydantic import BaseModel

log = logging.getLogger("edgeinfer.server")


class Lenient(BaseModel):
    """A request model whose IGNORED fields are taken and change nothing (each declared with its type)."""

    IGNORED: ClassVar[frozenset[str]] = frozenset()


def ignored_fields(body: BaseModel) -> list[str]:
    """The ignored fields a validated body set, its nested models' included, as paths (tools[].defer_loading)."""
    found: list[str] = []
    _walk(body, "", found)
    return found


def _walk(value: Any, path: str, found: list[str]) -> None:
    if isinstance(value, BaseModel):
        ignored: frozenset[str] = getattr(type(value), "IGNORED", frozenset())
        for name in value.model_fields_set:
            where = f"{path}.{name}" if path else name
            if name in ignored and getattr(value, name) is not None:
                found.append(where)
            else:
                _walk(getattr(value, name), where, found)
    elif isinstance(value, list | tuple):
        for item in value:
            _walk(item, f"{path}[]", found)


class Ignored:
    """How often requests carried each ignored field, per API; a field's first sighting is logged."""

    def __init__(self) -> None:
        self._counts: Counter[tuple[str, str]] = Counter()
        self._lock = threading.Lock()

    def note(self, api: str, fields: Iterable[str]) -> None:
        """Count one request's ignored fields (each once, however many items carried it)."""
        fresh = []
        with self._lock:
            for field in sorted(set(fields)):
                if not self._counts[api, field]:
                    fresh.append(field)
                self._counts[api, field] += 1
        for field in fresh:
            log.info("%s: %s taken and ignored (it changes nothing on a local server)", api, field)

    def snapshot(self) -> dict[str, dict[str, int]]:
        """{api: {field: requests that carried it}}."""
        out: dict[str, dict[str, int]] = {}
        with self._lock:
            for (api, field), n in sorted(self._counts.items()):
                out.setdefault(api, {})[field] = n
        return out
