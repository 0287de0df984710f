"""The errors a user can fix: a bad input file, config or field, a server that cannot be reached.

Every stage raises a subclass of ``MemstateError`` for them; ``memstate`` (the CLI) prints one line (the message names
the file, line and field) plus the class's ``hint`` and exits 2. Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations


class MemstateError(Exception):
    """Base of the user-fixable errors. ``hint`` says what to do about it (one line, or None); ``exit_code`` is the
    CLI's exit status for it (2, except where a subclass says otherwise)."""

    hint: str | None = None
    exit_code: int = 2


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


class ResponderFailure(MemstateError, RuntimeError):
    """Training stopped because the responder could not score: more than ``max_unscorable_share`` of the completions
    that needed it were unscorable in ``unscorable_patience`` consecutive generation rounds (``reward/failure.py``).
    ``memstate train`` saves a checkpoint of the last completed step and ``stopped.json`` first, then exits 3 (not
    2), so a launch script can tell "fix the responder and resume" from a mistake in the command."""

    hint = "stopped.json in output_dir has the details; --resume continues from the checkpoint it names"
    exit_code = 3

    def __init__(
        self,
        message: str,
        *,
        share: float | None = None,
        rounds: int | None = None,
        last_error: str | None = None,
        step: int | None = None,
        checkpoint: str | None = None,
    ):
        super().__init__(message)
        self.share, self.rounds, self.last_error = share, rounds, last_error
        self.step, self.checkpoint = step, checkpoint


class OutputExists(MemstateError, FileExistsError):
    """An output path that holds something the command would replace and did not write itself (a ``--out`` with
    another README.md); the message names the path and the files."""

    hint = "give --overwrite to replace them, or another --out"


class OutputUnwritable(MemstateError, OSError):
    """An output that could not be written for want of room: a full disk, a quota, a file size limit, a read-only
    filesystem. The message names the output and says what was left as it was."""

    hint = "free some space (or raise the quota or file size limit) and rerun"
