"""PersonaMem's shared-contexts files: the one reader of the format, for every stage that needs it (``data_build``
builds instances from the user turns, ``memory`` ingests a context's turns as sessions).

A ``shared_contexts_*.jsonl`` file holds one context (one user's chat history) per line:
``{"<shared_context_id>": [{"role": "system" | "user" | "assistant", "content": str}, …]}``; other keys of a message
are ignored. User turns start with ``User:``, assistant turns with ``Assistant:``; system messages hold the persona
card. The files can be several GB, so they are streamed line by line.

A context becomes a ``SharedContext`` of ``ContextTurn``s: every message whose text is non-empty once its speaker tag
is stripped and its whitespace collapsed to single spaces, each with its 0-based message index (the index PersonaMem's
questions count with: ``end_index_in_shared_context``), its role and that text. ``n_messages`` counts every message,
empty ones included.

A line that breaks the format raises ``ContextError`` (an ``InputError``): ``FILE:LINE: field: reason``, where the
field is ``(line)`` for the line as a whole, ``shared_context_id`` for its key, or ``<id>[i].role`` /
``<id>[i].content`` for a message. ``SharedContextFile`` reads a whole file: it raises at the first bad line, or hands
every bad line to ``on_error`` and goes on (``data_build``'s ``--skip-invalid``); it also reports a context id that
repeats an earlier line (``ContextError.duplicate``), and counts and hashes what it read.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Container, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memstate.errors import InputError

MESSAGE_ROLES = ("system", "user", "assistant")
_SPEAKER_TAG = {
    "user": re.compile(r"^\s*user\s*:\s*", re.IGNORECASE),
    "assistant": re.compile(r"^\s*assistant\s*:\s*", re.IGNORECASE),
}


def remove_speaker_tag(text: str, role: str = "user") -> str:
    """``text`` without a leading ``User:`` (role ``user``) or ``Assistant:`` (role ``assistant``) tag; the rest
    as is. A system message has no tag.

    >>> remove_speaker_tag("User: Hi!\\nHow are you?"), remove_speaker_tag("Assistant: User: hm", "assistant")
    ('Hi!\\nHow are you?', 'User: hm')
    """
    tag = _SPEAKER_TAG.get(role)
    return tag.sub("", text, count=1) if tag else text


def strip_speaker(text: str, role: str = "user") -> str:
    """A message's text as a turn: its speaker tag removed, on one line (whitespace runs become one space).

    >>> strip_speaker("User: I love  spicy food.\\n"), strip_speaker(" assistant: Noted.", "assistant")
    ('I love spicy food.', 'Noted.')
    """
    return " ".join(remove_speaker_tag(text, role).split())


@dataclass(frozen=True)
class ContextTurn:
    """One non-empty message of a context."""

    index: int  # 0-based message index in the context
    role: str  # one of MESSAGE_ROLES
    text: str  # speaker tag stripped, on one line


@dataclass(frozen=True)
class SharedContext:
    """One line of a shared-contexts file."""

    id: str  # the shared_context_id
    n_messages: int  # every message, empty ones included
    turns: tuple[ContextTurn, ...]  # the non-empty messages, in order
    file: str = ""
    line: int = 0  # 1-based

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line}"

    def of_role(self, *roles: str) -> list[ContextTurn]:
        """The turns of the given roles, in order."""
        return [t for t in self.turns if t.role in roles]


class ContextError(InputError):
    """A shared-contexts line that breaks the format: ``FILE:LINE: field: reason``. ``duplicate``: the line is
    well-formed but its id repeats an earlier line's."""

    def __init__(self, file: str, line: int, field: str, reason: str, *, duplicate: bool = False) -> None:
        super().__init__(f"{file}:{line}: {field}: {reason}")
        self.file, self.line, self.field, self.reason, self.duplicate = file, line, field, reason, duplicate

    @property
    def detail(self) -> str:
        """The message without its ``FILE:LINE:`` (for logs that record the file and line apart)."""
        return f"{self.field}: {self.reason}"


def _check(raw: bytes | str, file: str, line: int) -> tuple[str, list[dict]]:
    """A line → (shared_context_id, messages), every message checked. Raises ``ContextError``."""

    def bad(field: str, reason: str) -> ContextError:
        return ContextError(file, line, field, reason)

    if isinstance(raw, bytes):
        try:
            raw = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise bad("(line)", f"not valid UTF-8 ({e.reason} at byte {e.start})") from None
    if not raw.strip():
        raise bad("(line)", "empty line")
    try:
        obj = json.loads(raw)
    except json.JSONDecodeError as e:
        raise bad("(line)", f"invalid JSON ({e.msg}, column {e.colno})") from None
    if not isinstance(obj, dict) or len(obj) != 1:
        what = f"an object with {len(obj)} keys" if isinstance(obj, dict) else f"a JSON {type(obj).__name__}"
        raise bad("(line)", f"is {what}, expected an object with one key (the shared_context_id)")
    ((cid, messages),) = obj.items()
    if not cid.strip():
        raise bad("shared_context_id", "the line's key is empty")
    if not isinstance(messages, list):
        raise bad(cid, f"is a JSON {type(messages).__name__}, expected a list of messages")
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict):
            raise bad(f"{cid}[{i}]", f"is a JSON {type(msg).__name__}, expected an object with 'role' and 'content'")
        if msg.get("role") not in MESSAGE_ROLES:
            raise bad(f"{cid}[{i}].role", f"{_short(msg.get('role'))} is not one of {list(MESSAGE_ROLES)}")
        if not isinstance(msg.get("content"), str):
            raise bad(f"{cid}[{i}].content", f"must be a string, got {_short(msg.get('content'))}")
    return cid, messages


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _turns(messages: list[dict]) -> tuple[ContextTurn, ...]:
    turns = []
    for i, msg in enumerate(messages):
        text = strip_speaker(msg["content"], msg["role"])
        if text:
            turns.append(ContextTurn(i, msg["role"], text))
    return tuple(turns)


def parse_context_line(raw: bytes | str, file: str = "<line>", line: int = 1) -> SharedContext:
    """One line of a shared-contexts file → ``SharedContext``. Raises ``ContextError`` naming ``file``, ``line`` and
    the field.

    >>> ctx = parse_context_line('{"c1": [{"role": "system", "content": "Persona: Ana"}, '
    ...     '{"role": "user", "content": "User: I love  tea."}, {"role": "assistant", "content": "Assistant: "}]}')
    >>> ctx.id, ctx.n_messages, ctx.turns[1:]
    ('c1', 3, (ContextTurn(index=1, role='user', text='I love tea.'),))
    >>> parse_context_line('{"c1": [{"role": "narrator", "content": "Once"}]}', "ctx.jsonl", 7)
    Traceback (most recent call last):
    ...
    memstate.personamem.ContextError: ctx.jsonl:7: c1[0].role: 'narrator' is not one of ['system', 'user', 'assistant']
    """
    cid, messages = _check(raw, file, line)
    return SharedContext(cid, len(messages), _turns(messages), file, line)


class SharedContextFile:
    """Streams a shared-contexts JSONL file: iterating yields a ``SharedContext`` per well-formed line, in file order.

    Every line is checked, but only the contexts in ``context_ids`` (all when None) are yielded: a 1M-token file does
    not fit in memory as turns. A bad line — or a context id that repeats an earlier line's (``duplicate``) — raises
    ``ContextError``, or is handed to ``on_error`` when one is given and the reading goes on. ``skip_blank_lines``
    passes over blank lines instead (not counted as lines read); by default they are bad lines.

    After iterating: ``lines`` (lines read), ``parsed`` (well-formed lines, yielded or not, so ``lines == parsed``
    + the lines given to ``on_error``) and ``sha256`` (of the file's bytes). A file that cannot be opened raises
    ``ContextError`` at line 0.
    """

    def __init__(
        self,
        path: str | Path,
        *,
        context_ids: Container[str] | None = None,
        on_error: Callable[[ContextError], None] | None = None,
        skip_blank_lines: bool = False,
    ) -> None:
        self.path = Path(path)
        self.file = str(self.path)
        self.context_ids = context_ids
        self.on_error = on_error
        self.skip_blank_lines = skip_blank_lines
        self.lines = self.parsed = 0
        self._digest = hashlib.sha256()

    @property
    def sha256(self) -> str:
        return self._digest.hexdigest()

    def __iter__(self) -> Iterator[SharedContext]:
        self.lines = self.parsed = 0
        self._digest = hashlib.sha256()
        try:
            f = open(self.path, "rb")
        except OSError as e:
            raise ContextError(self.file, 0, "(file)", f"cannot read: {e.strerror}") from None
        first_line: dict[str, int] = {}
        with f:
            for lineno, raw in enumerate(f, 1):
                self._digest.update(raw)
                if self.skip_blank_lines and not raw.strip():
                    continue
                self.lines += 1
                try:
                    cid, messages = _check(raw, self.file, lineno)
                    if cid in first_line:
                        raise ContextError(
                            self.file,
                            lineno,
                            "shared_context_id",
                            f"{cid!r} repeats line {first_line[cid]}",
                            duplicate=True,
                        )
                except ContextError as e:
                    if self.on_error is None:
                        raise
                    self.on_error(e)
                    continue
                first_line[cid] = lineno
                self.parsed += 1
                if self.context_ids is None or cid in self.context_ids:
                    yield SharedContext(cid, len(messages), _turns(messages), self.file, lineno)
