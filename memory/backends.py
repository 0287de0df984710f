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
from memstate.registry import Registry

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
    returned facts come with them. ``decisions``: how it decides without an LLM and with one (reports say it).
    ``budget_seeds``: the ``k`` it is asked for under a token budget, where the budget decides how many facts come
    back: each backend at its best (a backend whose order puts weak facts early wants fewer)."""

    name: str
    summary: str
    search: Callable[[Query], tuple[list[str], dict[str, Any]]]
    decisions: tuple[str, str]
    relations: bool = True
    settings: type | None = None
    budget_seeds: int = 50

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


def _load_builtins() -> None:
    for module in BUILTIN_MODULES:
        importlib.import_module(module)


def _rank(backend: Backend) -> int:
    """Built-ins in ``BUILTIN_MODULES`` order (whichever module was imported first), then the others as registered."""
    return BUILTIN_MODULES.index(m) if (m := backend.search.__module__) in BUILTIN_MODULES else len(BUILTIN_MODULES)


BACKENDS: Registry[Backend] = Registry("memory backend", lambda b: b.search, order=_rank, load=_load_builtins)
register, unregister = BACKENDS.register, BACKENDS.unregister


def backend_names() -> tuple[str, ...]:
    """Registered backends, built-ins first (in ``BUILTIN_MODULES`` order).

    >>> backend_names()[:4]
    ('evomem', 'naive', 'clag', 'memsearch')
    """
    return BACKENDS.names()


def get_backend(name: str) -> Backend:
    """The backend registered as ``name``; ConfigError naming the known ones otherwise.

    >>> get_backend("naive").relations
    False
    >>> get_backend("bm42")
    Traceback (most recent call last):
    ...
    memstate.errors.ConfigError: unknown memory backend 'bm42'; known: evomem, naive, clag, memsearch
    """
    return BACKENDS.get(name)
