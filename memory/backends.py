"""The registry of retrieval backends: what ``retrieve``, ``memstate memory ask``, ``eval memsyco`` and the sweep
may be given as ``backend``.

Each backend registers itself in its own module (``register(Backend(...))`` at import): its name, how it searches,
whether relations come with its facts, its settings dataclass, and how it decides (for reports). The built-in
modules are listed in ``BUILTIN_MODULES`` and imported on the first lookup; a backend defined elsewhere (a plugin,
a test) registers the same way before it is used. Adding a backend touches its module and that list only.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from memstate.errors import ConfigError

if TYPE_CHECKING:
    from memstate.memory.llm_client import ChatJSON
    from memstate.memory.store import MemoryStore

BUILTIN_MODULES = ("memstate.memory.evomem", "memstate.memory.clag", "memstate.memory.memsearch")


@dataclass(frozen=True)
class Query:
    """What a backend's ``search`` is given. ``limit`` caps how many facts it may return beyond ``k`` (traversal,
    paths); ``settings`` is an instance of the backend's settings dataclass (or None when it has none)."""

    store: MemoryStore
    text: str
    vector: np.ndarray
    k: int
    limit: int
    depth: int
    llm: ChatJSON | None
    settings: Any


@dataclass(frozen=True)
class Backend:
    """``search(query) -> (stored fact ids in prompt order, trace)``. ``relations``: the stored relations among the
    returned facts come with them. ``decisions``: how it decides without an LLM and with one (reports say it)."""

    name: str
    summary: str
    search: Callable[[Query], tuple[list[str], dict[str, Any]]]
    decisions: tuple[str, str]
    relations: bool = True
    settings: type | None = None

    def make_settings(self, options: Mapping[str, Any] | None = None) -> Any:
        """The backend's settings from a mapping of field → value (unknown or bad fields: ConfigError)."""
        options = dict(options or {})
        if self.settings is None:
            if options:
                raise ConfigError(f"memory backend {self.name!r} takes no settings, got {sorted(options)}")
            return None
        known = {f.name for f in dataclasses.fields(self.settings)}
        unknown = sorted(set(options) - known)
        if unknown:
            raise ConfigError(f"memory backend {self.name!r}: unknown settings {unknown}; known: {sorted(known)}")
        try:
            return self.settings(**options)
        except (TypeError, ValueError) as e:
            raise ConfigError(f"memory backend {self.name!r}: {e}") from e


_REGISTRY: dict[str, Backend] = {}
_loaded = False


def register(backend: Backend) -> Backend:
    """Add ``backend``; a name can be registered once (a module imported twice re-registers the same backend)."""
    known = _REGISTRY.get(backend.name)
    if known is not None and known.search.__qualname__ != backend.search.__qualname__:
        raise ValueError(f"memory backend {backend.name!r} is already registered ({known.search.__module__})")
    _REGISTRY[backend.name] = backend
    return backend


def unregister(name: str) -> None:
    """Remove a backend (tests that register a toy one clean up with this)."""
    _REGISTRY.pop(name, None)


def _load_builtins() -> None:
    global _loaded
    if not _loaded:
        for module in BUILTIN_MODULES:
            importlib.import_module(module)
        _loaded = True


def _ordered() -> list[str]:
    """Built-ins in ``BUILTIN_MODULES`` order (whichever module was imported first), then the others as registered."""
    rank = {m: i for i, m in enumerate(BUILTIN_MODULES)}
    names = list(_REGISTRY)
    return sorted(names, key=lambda n: (rank.get(_REGISTRY[n].search.__module__, len(rank)), names.index(n)))


def backend_names() -> tuple[str, ...]:
    """Registered backends, built-ins first (in ``BUILTIN_MODULES`` order).

    >>> backend_names()[:4]
    ('evomem', 'naive', 'clag', 'memsearch')
    """
    _load_builtins()
    return tuple(_ordered())


def get_backend(name: str) -> Backend:
    """The backend registered as ``name``; ConfigError naming the known ones otherwise.

    >>> get_backend("naive").relations
    False
    >>> get_backend("bm42")
    Traceback (most recent call last):
    ...
    memstate.errors.ConfigError: unknown memory backend 'bm42'; known: evomem, naive, clag, memsearch
    """
    _load_builtins()
    if name not in _REGISTRY:
        raise ConfigError(f"unknown memory backend {name!r}; known: {', '.join(_ordered())}")
    return _REGISTRY[name]
