"""StreamHandle: what a caller reads of one stream, synchronously (iterate it, result(), collect()) or from an
asyncio loop (`async for`, aresult())."""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

from edgeinfer.events import Chunk, Finish

Event = Chunk | Finish


class StreamHandle:
    """One stream of a request: iterate it (sync or async) for Chunk events, then one Finish."""

    def __init__(
        self, stream_id: int, index: int, cancel: Callable[[StreamHandle], None], loop: asyncio.AbstractEventLoop | None
    ) -> None:
        self.id = stream_id
        self.index = index  # which of the request's n streams
        self.loop = loop
        self.finish: Finish | None = None
        self._cancel = cancel
        self.queue: Any = asyncio.Queue() if loop is not None else SyncQueue()  # events not yet read

    def cancel(self) -> None:
        """Stop this stream; its KV is freed at the next step."""
        self._cancel(self)

    def __iter__(self) -> Iterator[Event]:
        while self.finish is None:
            event = self.queue.get()
            if isinstance(event, Finish):
                self.finish = event
            yield event

    async def __aiter__(self) -> AsyncIterator[Event]:
        while self.finish is None:
            event = await self.queue.get()
            if isinstance(event, Finish):
                self.finish = event
            yield event

    async def batches(self) -> AsyncIterator[list[Event]]:
        """The events as they come, in the groups they arrive in (one step's tokens together), the Finish last."""
        while self.finish is None:
            events = [await self.queue.get()]
            while not self.queue.empty():
                events.append(self.queue.get_nowait())
            if isinstance(events[-1], Finish):
                self.finish = events[-1]
            yield events

    def result(self) -> Finish:
        """Wait for the end of the stream (sync handles); chunks not yet read are dropped."""
        if self.finish is None:
            self.finish = self.queue.last()
        assert self.finish is not None
        return self.finish

    def collect(self) -> list[Event]:
        """Wait for the end of the stream (sync handles); every event in order, without a wake-up per token."""
        events = self.queue.all()
        self.finish = events[-1]
        return events

    async def aresult(self) -> Finish:
        async for _ in self:
            pass
        assert self.finish is not None
        return self.finish


class SyncQueue:
    """A blocking queue whose reader can also wait for the last item alone (no wake-up per token)."""

    def __init__(self) -> None:
        self._items: deque[Any] = deque()
        self._cv = threading.Condition()
        self._waiting = False
        self._want_last = False
        self._closed = False

    def put(self, item: Any) -> None:
        with self._cv:
            self._items.append(item)
            if isinstance(item, Finish):
                self._closed = True
            if self._waiting and (self._closed or not self._want_last):
                self._cv.notify()

    def get(self) -> Any:
        with self._cv:
            while not self._items:
                self._waiting = True
                self._cv.wait()
                self._waiting = False
            return self._items.popleft()

    def last(self) -> Any:
        """Wait for the final item and return it, dropping the ones before it."""
        return self.all()[-1]

    def all(self) -> list[Any]:
        """Wait for the final item and return every item not yet read."""
        with self._cv:
            self._want_last = True
            while not self._closed:
                self._waiting = True
                self._cv.wait()
                self._waiting = False
            items = list(self._items)
            self._items.clear()
            return items
