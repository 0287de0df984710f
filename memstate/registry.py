"""A named registry: the one mechanism behind the extension points (memory backends, data-build sources, score
modes).

An extension registers itself from its own module at import (``REGISTRY.register(item)``; ``item.name`` is its key).
The registry imports the modules that hold the built-ins on its first lookup (``load``), so callers never depend on
import order, and a plugin or a test registers the same way before the name is used. Registering the same item again
(a module imported twice) is fine; another item under a taken name is an error.

>>> from dataclasses import dataclass
>>> @dataclass(frozen=True)
... class Colour:
...     name: str
...     rank: int = 0
>>> colours = Registry("colour", lambda c: c.name, order=lambda c: c.rank)
>>> _ = colours.register(Colour("red", 2)), colours.register(Colour("blue", 1))
>>> colours.names()
('blue', 'red')
>>> colours.get("green")
Traceback (most recent call last):
...
memstate.errors.ConfigError: unknown colour 'green'; known: blue, red
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, TypeVar

from memstate.errors import ConfigError

T = TypeVar("T")


class Registry(Generic[T]):
    """Items of one ``kind`` by name. ``identity(item)``: what makes two registrations the same item (compared by
    qualified name, so a module imported twice re-registers without error); ``order(item)``: the sort key of
    ``names()`` (stable: registration order breaks ties; None keeps registration order); ``load``: imports the
    modules holding the built-ins, called once, on the first lookup."""

    def __init__(
        self,
        kind: str,
        identity: Callable[[T], Any],
        *,
        order: Callable[[T], Any] | None = None,
        load: Callable[[], None] | None = None,
    ) -> None:
        self.kind, self.identity, self.order, self.load = kind, identity, order, load
        self.items: dict[str, T] = {}
        self.loaded = load is None

    def register(self, item: T) -> T:
        name = item.name  # type: ignore[attr-defined]
        known = self.items.get(name)
        if known is not None and self.identity(known).__qualname__ != self.identity(item).__qualname__:
            raise ValueError(f"{self.kind} {name!r} is already registered ({self.identity(known).__module__})")
        self.items[name] = item
        return item

    def unregister(self, name: str) -> None:
        """Remove an item (tests that register a toy one clean up with this)."""
        self.items.pop(name, None)

    def _ensure_loaded(self) -> None:
        if not self.loaded and self.load is not None:
            self.load()  # raises again on the next lookup if a module fails to import: never a silent partial set
            self.loaded = True

    def names(self) -> tuple[str, ...]:
        self._ensure_loaded()
        names = list(self.items)
        return tuple(names if self.order is None else sorted(names, key=lambda n: self.order(self.items[n])))

    def get(self, name: str) -> T:
        """The item registered as ``name``; ConfigError naming the known ones otherwise."""
        self._ensure_loaded()
        if name not in self.items:  # lookups sit on per-request paths: the ordered list only for the error
            raise ConfigError(f"unknown {self.kind} {name!r}; known: {', '.join(self.names())}")
        return self.items[name]
