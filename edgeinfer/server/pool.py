"""The models one server serves: each loaded on demand by name into an engine of its own, evicted LRU or when idle.

A slot per servable model moves unloaded -> queued -> loading -> loaded -> draining -> unloading -> unloaded.
Requests take a lease on a loaded slot for as long as they submit; the streams they leave running
are counted by the engine itself (snapshot().requests). A slot with a lease or a running stream is
never unloaded: a load that needs room marks the least recently used slot draining (new requests
for it wait, as do requests for any unloaded model) and waits for it to go idle. A load's waiters
get their leases when it ends, all at once, so that two models swapped back and forth under load
(--max-models 1) each serve the requests that waited for them before the next swap.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import gc
import logging
import math
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from edgeinfer.errors import (
    ConfigError,
    EdgeInferError,
    EngineClosedError,
    ModelLoadFailedError,
    ModelLoadingError,
    ModelNotFoundError,
)
from edgeinfer.models.files import is_first_part, is_model_file

if TYPE_CHECKING:
    from edgeinfer.engine import Engine
    from edgeinfer.options import EngineConfig

log = logging.getLogger("edgeinfer.pool")

T = TypeVar("T")
SlotState = Literal["unloaded", "queued", "loading", "loaded", "draining", "unloading"]
HOLDS_MEMORY: tuple[SlotState, ...] = ("loading", "loaded", "draining", "unloading")
DEFAULT_LOAD_TIMEOUT_S = 60.0  # a request waits this long for its model to load, then gets 503 + Retry-After
POLL_S = 0.1  # how often a load waiting for room looks again (an engine's streams end without telling the pool)


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """One servable model: its id (what /v1/models shows), the file, other names it answers to,
    how to make its engine (called in a loader thread), and a fallback should that fail on its draft."""

    name: str
    path: Path | None
    make: Callable[[], Engine]
    aliases: tuple[str, ...] = ()
    # Made without the draft model, for when make() fails on a ConfigError (a draft of another vocabulary).
    make_plain: Callable[[], Engine] | None = None


@dataclass(slots=True, eq=False)
class _Waiter:
    """A request waiting for its model's load; granted means the load ended and a lease is its."""

    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[None]
    granted: bool = False
    error: str | None = None


@dataclass(slots=True, eq=False)
class Slot:
    """One servable model and its engine while loaded; every field is guarded by the pool's lock."""

    spec: ModelSpec
    state: SlotState = "unloaded"
    engine: Engine | None = None
    error: str | None = None  # why the last load failed
    note: str | None = None  # e.g. the draft model skipped for this one
    leases: int = 0  # requests between acquire and release
    last_used: float = 0.0  # time.monotonic() of the last lease, or of the last time its engine was seen busy
    loaded_at: float | None = None
    load_seconds: float | None = None
    waiters: list[_Waiter] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.spec.name


def loaded(slot: Slot) -> Engine:
    """A leased slot's engine: a lease keeps its model loaded until the lease ends."""
    assert slot.engine is not None
    return slot.engine


class ModelPool:
    """Every servable model by name; engines loaded on demand, at most max_models at once."""

    def __init__(
        self,
        specs: list[ModelSpec],
        max_models: int = 0,
        idle_unload_s: float = 0.0,
        load_timeout_s: float = DEFAULT_LOAD_TIMEOUT_S,
        aliases: dict[str, str] | None = None,
    ) -> None:
        assert specs, "a pool serves at least one model"
        self.slots = {s.name: Slot(s) for s in specs}
        self.default = specs[0].name
        self._names: dict[str, str] = {}
        for s in specs:
            for alias in (s.name, *s.aliases):
                self._names.setdefault(alias, s.name)
        for alias, target in (aliases or {}).items():  # --alias NAME=MODEL: the names clients send
            self._names[alias] = self.find(target).name
        self.max_models = max_models  # 0: no bound
        self.idle_unload_s = idle_unload_s  # 0: never
        self.load_timeout_s = load_timeout_s
        self._cond = threading.Condition(threading.RLock())  # re-entrant: the sweeper holds it round sweep_once
        self._closed = False
        self._sweeper: threading.Thread | None = None

    # --- names --------------------------------------------------------------

    def find(self, name: str | None) -> Slot:
        """The slot a request's `model` names: its id, a name given on the command line or by --alias, or
        "default". A server of one model answers to any name, as llama-server does: agents send the names
        of their own providers' models (Claude Code a main and a small one), which mean nothing here."""
        if name is None or name == "default":
            return self.slots[self.default]
        key = self._names.get(name)
        if key is None and len(self.slots) == 1:
            return self.slots[self.default]
        if key is None:
            names = ", ".join(repr(n) for n in self.slots)
            raise ModelNotFoundError(
                f"model {name!r} is not served here; the models are {names} (GET /v1/models); "
                "serve --alias NAME=MODEL maps a name a client sends to one of them"
            )
        return self.slots[key]

    # --- leases -------------------------------------------------------------

    async def acquire(self, name: str | None) -> Slot:
        """A leased, loaded slot for name; loads it if needed, waiting at most load_timeout_s."""
        slot = self.find(name)
        loop = asyncio.get_running_loop()
        with self._cond:
            if self._closed:
                raise EngineClosedError("the server is shutting down")
            if slot.state == "loaded":
                slot.leases += 1
                slot.last_used = time.monotonic()
                return slot
            waiter = _Waiter(loop, loop.create_future())
            slot.waiters.append(waiter)
            self._want(slot)
        try:
            await asyncio.wait_for(asyncio.shield(waiter.future), self.load_timeout_s)
        except TimeoutError:
            with self._cond:
                if not waiter.granted and waiter.error is None:
                    slot.waiters.remove(waiter)
                    self._cond.notify_all()
                    raise ModelLoadingError(_loading(slot), self._retry_after(slot)) from None
        except asyncio.CancelledError:  # the client left while its model loaded
            with self._cond:
                if waiter.granted:
                    slot.leases -= 1
                elif waiter in slot.waiters:
                    slot.waiters.remove(waiter)
                self._cond.notify_all()
            raise
        if waiter.error is not None:
            raise ModelLoadFailedError(waiter.error)
        return slot

    def release(self, slot: Slot) -> None:
        with self._cond:
            slot.leases -= 1
            slot.last_used = time.monotonic()
            self._cond.notify_all()

    @contextlib.asynccontextmanager
    async def lease(self, name: str | None) -> AsyncIterator[Slot]:
        """`async with pool.lease(model) as slot`: slot.engine is the model's, loaded, until the block ends."""
        slot = await self.acquire(name)
        try:
            yield slot
        finally:
            self.release(slot)

    # --- loading and unloading ------------------------------------------------

    def _want(self, slot: Slot) -> None:
        """Under the lock: have slot loaded (a loader thread), unless it is on its way in or out."""
        if slot.state != "unloaded" or self._closed:
            return
        slot.state = "queued"
        threading.Thread(target=self._load, args=(slot,), name=f"edgeinfer-load-{slot.name}", daemon=True).start()

    def load_now(self, name: str | None = None) -> Slot:
        """Load a model in this thread (the default at startup); its error is in slot.error."""
        slot = self.find(name)
        with self._cond:
            if slot.state != "unloaded":
                return slot
            slot.state = "queued"
        self._load(slot)
        return slot

    def _load(self, slot: Slot) -> None:
        with self._cond:
            while not self._closed and not self._room_for(slot):
                self._cond.wait(POLL_S)
            if self._closed:
                self._fail(slot, "the server is shutting down")
                return
            slot.state = "loading"
        t0 = time.monotonic()
        engine: Engine | None = None
        note = error = None
        try:
            engine = slot.spec.make()
        except EdgeInferError as e:
            error = str(e)
            if slot.spec.make_plain is not None and isinstance(e, ConfigError):
                note = f"served without the draft model: {e}"
                try:
                    engine = slot.spec.make_plain()
                    error = None
                except Exception as e2:
                    error = _why(e2)
        except Exception as e:
            error = _why(e)
        with self._cond:
            if engine is None:
                where = f" ({slot.spec.path})" if slot.spec.path is not None else ""
                self._fail(slot, f"model {slot.name!r}{where} failed to load: {error}")
                return
            if note is not None:
                log.warning("edgeinfer: %s: %s", slot.name, note)
            slot.note = note
            slot.engine, slot.state, slot.error = engine, "loaded", None
            slot.load_seconds = time.monotonic() - t0
            slot.loaded_at = slot.last_used = time.monotonic()
            closing = self._closed
            if not closing:
                self._grant(slot)
            self._cond.notify_all()
        if closing:
            self._unload(slot)

    def _fail(self, slot: Slot, error: str) -> None:
        """Under the lock: the load failed; its waiters get the error and the next request tries again."""
        slot.state, slot.error = "unloaded", error
        for w in slot.waiters:
            w.error = error
            _wake(w)
        slot.waiters.clear()
        self._cond.notify_all()

    def _grant(self, slot: Slot) -> None:
        """Under the lock: every waiter of a load gets its lease now, so that none loses its turn to an eviction."""
        slot.leases += len(slot.waiters)
        for w in slot.waiters:
            w.granted = True
            _wake(w)
        slot.waiters.clear()

    def _room_for(self, slot: Slot) -> bool:
        """Under the lock: whether slot may load now; if not, make room and say no (the caller looks again).

        Room is made by unloading the least recently used idle model. When every model in memory is busy,
        the least recently used one drains: it takes no new requests (they wait, as for an unloaded model)
        and leaves once its streams end, so that a busy model cannot keep another from loading for ever."""
        held = [s for s in self.slots.values() if s is not slot and s.state in HOLDS_MEMORY]
        if not self.max_models or len(held) < self.max_models:
            return True
        if any(s.state in ("loading", "unloading") for s in held):
            return False  # memory on its way in or out: look again once it has moved
        idle = [s for s in held if self._idle(s)]
        if idle:
            victim = min(idle, key=lambda s: s.last_used)
            log.info("edgeinfer: unloading %s to load %s", victim.name, slot.name)
            for s in held:
                if s.state == "draining" and s is not victim:  # another made room first: back in service
                    s.state = "loaded"
                    self._grant(s)
            self._start_unload(victim)
        elif not any(s.state == "draining" for s in held):
            min(held, key=lambda s: s.last_used).state = "draining"
        return False

    def _start_unload(self, slot: Slot) -> None:
        slot.state = "unloading"
        threading.Thread(target=self._unload, args=(slot,), name=f"edgeinfer-unload-{slot.name}", daemon=True).start()

    def _idle(self, slot: Slot) -> bool:
        """Under the lock: no lease, and no stream running or waiting in its engine."""
        if slot.leases:
            return False
        if slot.engine is None:
            return True
        req = slot.engine.snapshot().requests
        return req.running == 0 and req.waiting == 0

    def _unload(self, slot: Slot) -> None:
        """Close slot's engine (its state is "unloading"); then load it again if requests wait for it."""
        with self._cond:
            engine, slot.engine = slot.engine, None
        if engine is not None:
            try:
                engine.close()
            except Exception as e:  # the engine is gone either way; say why it did not close cleanly
                log.warning("edgeinfer: closing %s: %s", slot.name, _why(e))
            del engine
        gc.collect()
        trim_malloc()
        with self._cond:
            slot.state, slot.loaded_at = "unloaded", None
            if slot.waiters:
                self._want(slot)
            self._cond.notify_all()

    # --- idle unload ----------------------------------------------------------

    def start_sweeper(self) -> None:
        """Unload models idle for idle_unload_s (a thread; nothing when idle unload is off)."""
        if self.idle_unload_s > 0 and self._sweeper is None:
            self._sweeper = threading.Thread(target=self._sweep, name="edgeinfer-idle-unload", daemon=True)
            self._sweeper.start()

    def _sweep(self) -> None:
        period = min(1.0, self.idle_unload_s / 4)
        with self._cond:
            while not self._closed:
                self._cond.wait(period)
                self.sweep_once()

    def sweep_once(self) -> list[str]:
        """Unload every loaded model idle for idle_unload_s; their names. A busy one counts as used now."""
        now = time.monotonic()
        gone = []
        with self._cond:
            for s in self.slots.values():
                if s.state != "loaded":
                    continue
                if not self._idle(s):
                    s.last_used = now
                elif now - s.last_used >= self.idle_unload_s:
                    gone.append(s.name)
                    self._start_unload(s)
        return gone

    # --- reading ----------------------------------------------------------------

    def engines(self) -> list[tuple[str, Engine]]:
        """(name, engine) of every model in memory now. To read one, use read(): it may be closed meanwhile."""
        with self._cond:
            return [(s.name, s.engine) for s in self.slots.values() if s.engine is not None]

    def read(self, fn: Callable[[Engine], T], name: str | None = None) -> list[tuple[str, T]]:
        """fn(engine) of the named model (of every one in memory, without a name), called under the pool's
        lock: an unload takes the engine out under it before closing it, so fn never sees a closed engine."""
        with self._cond:
            slots = [self.find(name)] if name is not None else list(self.slots.values())
            return [(s.name, fn(s.engine)) for s in slots if s.engine is not None]

    def engine_of(self, name: str | None = None) -> Engine | None:
        """The engine of the named model (the default's without a name) if it is in memory; None if not."""
        slot = self.find(name)
        with self._cond:
            return slot.engine

    def most_recent(self) -> Slot | None:
        """The loaded model used last, if any is loaded."""
        with self._cond:
            loaded = [s for s in self.slots.values() if s.engine is not None]
            return max(loaded, key=lambda s: s.last_used) if loaded else None

    def set_engine(self, engine: Engine | None, name: str | None = None) -> None:
        """Put an engine in a slot by hand (tests with a fake engine)."""
        slot = self.find(name)
        with self._cond:
            slot.engine = engine
            slot.state = "loaded" if engine is not None else "unloaded"

    def describe(self) -> list[dict[str, Any]]:
        """Each servable model for /v1/models and the stats feed: its state and what it was loaded from."""
        now = time.monotonic()
        with self._cond:
            out = []
            for s in self.slots.values():
                entry: dict[str, Any] = {"id": s.name, "status": s.state, "loaded": s.engine is not None}
                if s.spec.path is not None:
                    entry["path"] = str(s.spec.path)
                if s.state == "loaded":
                    entry["idle_s"] = round(now - s.last_used, 1)
                if s.load_seconds is not None:
                    entry["load_seconds"] = round(s.load_seconds, 3)
                if s.error:
                    entry["error"] = s.error
                if s.note:
                    entry["note"] = s.note
                out.append(entry)
            return out

    def close(self) -> None:
        """Close every engine (shutdown); loads still running close theirs when they end."""
        with self._cond:
            self._closed = True
            for s in self.slots.values():
                for w in s.waiters:
                    w.error = "the server is shutting down"
                    _wake(w)
                s.waiters.clear()
            engines = [s.engine for s in self.slots.values() if s.engine is not None]
            for s in self.slots.values():
                s.engine = None
            self._cond.notify_all()
        for engine in engines:
            engine.close()

    def __iter__(self) -> Iterator[Slot]:
        return iter(self.slots.values())

    def _retry_after(self, slot: Slot) -> int:
        """Seconds a client should wait before asking again: its last load time, at least 1."""
        return max(1, math.ceil(slot.load_seconds or 1.0))


def _wake(w: _Waiter) -> None:
    """Settle a waiter's future on its own loop (a loop already closed has no one left to wake)."""
    with contextlib.suppress(RuntimeError):
        w.loop.call_soon_threadsafe(_settle, w.future)


def _settle(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _loading(slot: Slot) -> str:
    return f"model {slot.name!r} is still loading (or waiting for another model to unload); retry shortly"


def _why(e: BaseException) -> str:
    return str(e) if isinstance(e, EdgeInferError) else f"{type(e).__name__}: {e}"


def trim_malloc() -> None:
    """Hand freed heap back to the OS after an unload (glibc keeps it otherwise, and RSS would not fall)."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL("libc.so.6").malloc_trim(0)


# --- the models `edgeinfer serve` names ----------------------------------------------

DEFAULT_MAX_MODELS = 3  # as Ollama on a CPU: a few models in memory, the least recently used leaves first


@dataclass(frozen=True, slots=True)
class Serving:
    """serve's model options: -m (repeatable), --models-dir, --max-models, --idle-unload, --load-timeout."""

    models: list[str] = field(default_factory=list)
    models_dir: Path | None = None
    max_models: int = DEFAULT_MAX_MODELS
    idle_unload_s: float = 0.0
    load_timeout_s: float = DEFAULT_LOAD_TIMEOUT_S
    aliases: dict[str, str] = field(default_factory=dict)  # --alias NAME=MODEL


def dir_models(folder: Path) -> list[Path]:
    """The models of a folder (models/files.py's rule): a split model by its first part, sidecars left out."""
    if not folder.is_dir():
        raise ConfigError(f"--models-dir {folder}: no such folder")
    found = []
    for f in sorted(folder.glob("*.gguf")):
        if is_model_file(f.name) and is_first_part(f.name):
            found.append(f)
    if not found:
        raise ConfigError(f"--models-dir {folder} holds no .gguf file; put models there or name them with -m")
    return found


def model_specs(config: EngineConfig, models: list[str], models_dir: Path | None) -> list[ModelSpec]:
    """A spec per model named (-m, in order; then --models-dir's files), each with config's other options.

    The draft model (--draft-model) drafts for every other model; for itself it is off, and a model whose
    vocabulary it does not share is served without it (a note in /v1/models) when several models are served."""
    from edgeinfer.models.catalog import model_id_of

    named: list[tuple[str | None, Path]] = [(m, config.replace(model=m).model) for m in models]
    if models_dir is not None:
        named += [(None, f) for f in dir_models(models_dir.expanduser().absolute())]
    if not named:
        named = [(None, config.model)]
    specs: dict[str, ModelSpec] = {}
    seen: set[Path] = set()
    draft = config.draft_model.absolute() if config.draft_model is not None else None
    for given, path in named:
        name = model_id_of(path)
        path = path.absolute()
        if path in seen:  # a file both named and in --models-dir
            continue
        if name in specs:
            raise ConfigError(
                f"two models are named {name!r} ({specs[name].path} and {path}); rename one file or serve one of them"
            )
        seen.add(path)
        plain = config.replace(model=path, draft_model=None, spec="auto" if config.spec == "draft" else config.spec)
        cfg = plain if draft is None or path == draft else config.replace(model=path)
        fallback = _maker(plain) if cfg is not plain and len(named) > 1 else None
        aliases = tuple(a for a in (given, path.name, str(path)) if a and a != name)
        specs[name] = ModelSpec(name, path, _maker(cfg), aliases, fallback)
    return list(specs.values())


def _maker(config: EngineConfig) -> Callable[[], Engine]:
    def make() -> Engine:
        from edgeinfer.runtime import make_engine

        return make_engine(config)

    return make
