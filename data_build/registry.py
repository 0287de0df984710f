"""The registry of data-build sources: what a data YAML may name as a top-level section (``fever:``, ``scifact:``, …).

Each source registers itself in its builder module ``data_build/<name>.py`` (``register(DataSource(...))`` at
import): its name (the YAML key), its section dataclass (the keys of that section), how it reads its inputs into a
``SourceRead``, and where it comes in the build order. The builder modules are found on the first lookup by importing
every module of the ``memstate.data_build`` package, in name order (the infrastructure modules register nothing);
a source defined elsewhere (a plugin, a test) registers the same way before a config naming it is read. Adding a
source touches its builder module and, when it has a released format, its reader ``memstate/sources/<name>.py``;
neither this module nor ``build.py`` names a source.

Sources are read in ``(order, name)`` order, and the instances of the written splits follow it; the built-ins keep
the order they were always built in (fever, scifact, personamem, synthetic), so their datasets stay byte-identical.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from memstate.errors import InputNotFound
from memstate.registry import Registry

if TYPE_CHECKING:
    from memstate.data_build.build import DataConfig
    from memstate.data_build.records import SourceRead
    from memstate.sources.skips import SkipLog

PROJECT_ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class DataSource:
    """``section``: the dataclass of the source's YAML section. ``read(section_config, config, log) -> SourceRead``:
    ``section_config`` is an instance of ``section``, ``config`` the whole ``DataConfig`` (seed, perspectives,
    distractors, progress …), ``log`` the shared ``SkipLog``. ``order``: its place in the build order (then the
    name). ``summary``: one line on what the source is."""

    name: str
    summary: str
    section: type
    read: Callable[[Any, DataConfig, SkipLog], SourceRead]
    order: int = 100


def _load_builders() -> None:
    package = importlib.import_module("memstate.data_build")
    for module in sorted(m.name for m in pkgutil.iter_modules(package.__path__)):
        importlib.import_module(f"{package.__name__}.{module}")


SOURCES: Registry[DataSource] = Registry(
    "data source", lambda s: s.read, order=lambda s: (s.order, s.name), load=_load_builders
)
register, unregister = SOURCES.register, SOURCES.unregister


def source_names() -> tuple[str, ...]:
    """Registered sources in build order.

    >>> source_names()[:4]
    ('fever', 'scifact', 'personamem', 'synthetic')
    """
    return SOURCES.names()


def get_source(name: str) -> DataSource:
    """The source registered as ``name``; ConfigError naming the known ones otherwise.

    >>> get_source("fever").section.__name__
    'FeverConfig'
    >>> get_source("wikipedia")
    Traceback (most recent call last):
    ...
    memstate.errors.ConfigError: unknown data source 'wikipedia'; known: fever, scifact, personamem, synthetic
    """
    return SOURCES.get(name)


def resolve_path(path: str | Path) -> Path:
    """An input dir: absolute as is; relative from the working directory if it exists there, else the project."""
    p = Path(path)
    if p.is_absolute() or p.exists():
        return p
    return PROJECT_ROOT / p


def input_dir(path: str, name: str) -> Path:
    """A source's input directory (``resolve_path``); InputNotFound naming ``<name>.dir`` when it is not one."""
    resolved = resolve_path(path)
    if not resolved.is_dir():
        raise InputNotFound(f"{name.lower()}.dir: {name} directory not found: {path} (looked at {resolved})")
    return resolved
