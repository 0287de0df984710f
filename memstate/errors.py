"""The errors a user can fix: a bad input file, config or field, a server that cannot be reached.

Every stage raises a subclass of ``MemstateError`` for them; ``memstate`` (the CLI) prints one line (the message names
the file, line and field) plus the class's ``hint`` and exits 2. Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations


class MemstateError(Exception):
    """Base of the user-fixable errors. ``hint`` says what to do about it (one line, or None)."""

    hint: str | None = None


class ConfigError(MemstateError, ValueError):
    """A config file or command-line value that is missing, unknown or out of range."""

    hint = "see `memstate <command> --help` for the fields and their defaults"


class ServerUnavailable(MemstateError, RuntimeError):
    """An HTTP endpoint (responder, judge, extractor, policy API) that did not answer after its retries."""

    hint = "check the URL and that the server is up (its /health); --debug shows the last HTTP error"


class InputError(MemstateError, ValueError):
    """A record of an input file (dataset, dialogue, shared contexts) that breaks its format; the message is
    ``FILE:LINE: field: reason``. Core readers raise it; a stage may re-raise it as its own subclass of
    ``MemstateError`` (``DataError``, ``IngestError``) or let it through."""


class InputNotFound(MemstateError, FileNotFoundError):
    """A file or directory the user named (a checkpoint, a dataset, a store, an input file) that is not there or
    is not what the command needs."""

    hint = "check the path (relative paths are from the current directory)"
