"""The parser every stage builds its command from: ``TrlParser`` (dataclass fields as ``--field`` flags, a
``--config FILE.yaml`` of flat field keys, command-line values override the file) whose user mistakes become one-line
``ConfigError``s that name the file, line and field instead of tracebacks.

A config's ``env:`` mapping (``variable: value``) sets environment variables for the run, but only those the shell
has not set: the operator's environment wins (a config must not be able to replace a secret such as the API's
bearer token, or blank it and switch auth off), and each variable the config names but the shell already had is
logged (by name, never by value).

A stage module exposes ``make_parser(prog)`` (this parser, or a plain ``argparse`` one) and ``run(parsed)``;
``memstate.cli`` lists the commands and calls them (see its docstring).
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import difflib
import logging
import os
from pathlib import Path
from types import MappingProxyType
from typing import Any

import yaml
from transformers import TrainingArguments
from trl import TrlParser

from memstate.errors import ConfigError

logger = logging.getLogger("memstate.parsing")


def read_yaml(path: str | Path) -> Any:
    """A YAML file's content; a missing file or a syntax error is a ``ConfigError`` naming the file (and line)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such config file") from None
    except IsADirectoryError:
        raise ConfigError(f"{path}: is a directory, not a YAML config file") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark is not None else str(path)
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ConfigError(f"{where}: not valid YAML: {problem}") from None


def did_you_mean(name: str, known: set[str], prefix: str = "") -> str:
    """`` (did you mean X?)`` for the closest known field, or nothing.

    >>> did_you_mean("max_stepz", {"max_steps", "seed"}, "--")
    ' (did you mean --max_steps?)'
    >>> did_you_mean("zzz", {"max_steps"})
    ''
    """
    close = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.6)
    return f" (did you mean {prefix}{close[0]}?)" if close else ""


# transformers 5.24 renamed gradient checkpointing to activation checkpointing and warns (FutureWarning) on the old
# names; 5.17 — the vLLM venv's, inside pyproject's range — knows only the old ones. Configs and code use the new
# names; on a transformers without them they are read as the old ones.
RENAMED_FIELDS = {
    "activation_checkpointing": "gradient_checkpointing",
    "activation_checkpointing_kwargs": "gradient_checkpointing_kwargs",
}


def installed_field_name(name: str, known: set[str]) -> str:
    """``name``, or its pre-rename spelling when the installed libraries know only that one.

    >>> installed_field_name("activation_checkpointing", {"gradient_checkpointing"})
    'gradient_checkpointing'
    >>> installed_field_name("activation_checkpointing", {"activation_checkpointing", "gradient_checkpointing"})
    'activation_checkpointing'
    """
    old = RENAMED_FIELDS.get(name)
    return old if old and name not in known and old in known else name


def installed_flag(arg: str, known: set[str]) -> str:
    """A ``--field[=value]`` flag under ``installed_field_name`` (``-`` or ``_`` spelling); other args unchanged."""
    if not arg.startswith("--"):
        return arg
    flag, eq, value = arg[2:].partition("=")
    name = flag.replace("-", "_")
    renamed = installed_field_name(name, known)
    return arg if renamed == name else f"--{renamed}{eq}{value}"


def activation_checkpointing(enabled: bool) -> dict[str, bool]:
    """The TrainingArguments keyword that turns activation checkpointing on or off, under this transformers."""
    known = {f.name for f in dataclasses.fields(TrainingArguments)}
    return {installed_field_name("activation_checkpointing", known): enabled}


def apply_config_env(env: dict, source: str | Path) -> list[str]:
    """Set a config's ``env:`` variables the shell lacks (``setdefault``); the names it already had, kept as they
    are, are logged and returned."""
    kept = []
    for key, value in env.items():
        name = str(key)
        if name in os.environ:
            kept.append(name)
        else:
            os.environ[name] = "" if value is None else str(value)
    if kept:
        logger.warning("%s: env: %s already set in the environment, kept (the shell wins over a config)",
                       source, ", ".join(kept))  # fmt: skip
    return kept


class StageParser(TrlParser):
    """``TrlParser`` with user errors as ``ConfigError`` (file, field) and unknown flags as argparse errors (exit 2).

    A dataclass field whose metadata says ``{"cli": False}`` gets no flag (it is set by code, e.g. a nested config).
    """

    @staticmethod
    def _parse_dataclass_field(parser: argparse.ArgumentParser, field: dataclasses.Field) -> None:
        if field.metadata.get("cli", True) is False:
            return
        help_text = field.metadata.get("help")
        if "cli" in field.metadata or "%" in (help_text or ""):
            field = copy.copy(field)
            metadata = {k: v for k, v in field.metadata.items() if k != "cli"}
            if help_text:
                metadata["help"] = help_text.replace("%", "%%")  # argparse %-formats help ("95% clean" crashed --help)
            field.metadata = MappingProxyType(metadata)
        TrlParser._parse_dataclass_field(parser, field)

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.add_argument(
            "--config", metavar="FILE.yaml", help="YAML of flat field: value pairs; flags given here override it."
        )

    def field_names(self) -> set[str]:
        return {a.dest for a in self._actions if a.dest not in (None, argparse.SUPPRESS)}

    def parse_args_and_config(self, args: list[str] | None = None, **kwargs: Any) -> tuple:  # type: ignore[override]
        args = list(args or [])
        source = "command line"
        if "--config" in args:
            i = args.index("--config")
            if i + 1 >= len(args):
                self.error("argument --config: expected one argument")
            path = args[i + 1]
            del args[i : i + 2]
            config = read_yaml(path)
            if config is None:
                config = {}
            if not isinstance(config, dict):
                raise ConfigError(f"{path}: expected a mapping of field: value, got {type(config).__name__}")
            env = config.pop("env", {})
            if not isinstance(env, dict):
                raise ConfigError(f"{path}: field env: expected a mapping of variable: value")
            known = self.field_names() - {"config", "help"}
            config = {installed_field_name(k, known): v for k, v in config.items()}
            unknown = sorted(set(config) - known)
            if unknown:
                named = ", ".join(f"{name}{did_you_mean(name, known)}" for name in unknown)
                raise ConfigError(f"{path}: unknown field(s) {named} (see `--help` for the fields of this command)")
            apply_config_env(env, path)
            self.set_defaults_with_config(**config)
            source = f"{path} (with command-line overrides)"
        known = self.field_names()
        args = [installed_flag(a, known) for a in args]
        namespace, remaining = self.parse_known_args(args)
        del namespace.config  # read above
        if remaining:
            known = self.field_names() - {"help"}
            flags = [a for a in remaining if a.startswith("--")]
            hints = "".join(did_you_mean(f.lstrip("-").split("=")[0].replace("-", "_"), known, "--") for f in flags)
            self.error(f"unrecognized arguments: {' '.join(remaining)}{hints}")
        outputs = []
        for dtype in self.dataclass_types:
            keys = {f.name for f in dataclasses.fields(dtype) if f.init}
            inputs = {k: v for k, v in vars(namespace).items() if k in keys}
            for k in keys & set(vars(namespace)):
                delattr(namespace, k)
            try:
                outputs.append(dtype(**inputs))
            except ConfigError as e:
                raise ConfigError(f"{source}: {e}") from None
            except ValueError as e:  # a config class's own validation (e.g. GRPOConfig.__post_init__)
                message = " ".join(str(e).split())
                raise ConfigError(f"{source}: {dtype.__name__}: {message}") from None
        if vars(namespace):
            outputs.append(namespace)
        return tuple(outputs)
