"""Stored Responses: what `previous_response_id` and GET/DELETE /v1/responses/{id} read, bounded, in memory.

Each entry keeps the response object and the whole conversation it answered (the input items
of every earlier response in its chain, then its own), so that a chain still continues after
its older links are evicted. The store lives as long as the server and is bounded twice:
at most MAX_RESPONSES entries and MAX_BYTES of JSON; past either bound the least recently used
entries go first (reading an entry, or continuing from it, counts as a use).
"""

from __future__ import annotations

import json
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

MAX_RESPONSES = 256  # entries
MAX_BYTES = 64 * 2**20  # JSON bytes of all entries' responses and conversations together


@dataclass(slots=True)
class Stored:
    """One stored response."""

    response: dict[str, Any]  # the response object as it was sent
    history: list[dict[str, Any]]  # input items: every earlier link's input and output, then this one's input
    size: int  # JSON bytes of both, what counts against MAX_BYTES


class ResponseStore:
    """An LRU of responses by id, bounded by count and by bytes."""

    def __init__(self, max_responses: int = MAX_RESPONSES, max_bytes: int = MAX_BYTES) -> None:
        self.max_responses = max_responses
        self.max_bytes = max_bytes
        self._entries: OrderedDict[str, Stored] = OrderedDict()
        self.bytes = 0

    def __len__(self) -> int:
        return len(self._entries)

    def put(self, response: dict[str, Any], history: list[dict[str, Any]]) -> bool:
        """Keep a response; False when it alone is over the byte bound (then it is not kept)."""
        size = len(json.dumps(response)) + len(json.dumps(history))
        self.delete(response["id"])
        if size > self.max_bytes:
            return False
        self._entries[response["id"]] = Stored(response, history, size)
        self.bytes += size
        while len(self._entries) > self.max_responses or self.bytes > self.max_bytes:
            _, old = self._entries.popitem(last=False)
            self.bytes -= old.size
        return True

    def get(self, response_id: str) -> Stored | None:
        entry = self._entries.get(response_id)
        if entry is not None:
            self._entries.move_to_end(response_id)
        return entry

    def delete(self, response_id: str) -> bool:
        entry = self._entries.pop(response_id, None)
        if entry is None:
            return False
        self.bytes -= entry.size
        return True
