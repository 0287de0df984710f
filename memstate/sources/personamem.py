"""PersonaMem, as released: the questions CSVs and the shared-contexts files, read and validated — the one reader
of the format, for every stage that needs it (``data_build`` builds instances from the questions and the user
turns, ``memory`` ingests a context's turns as sessions).

Questions (``questions_{32k,128k,1M}.csv``): one multiple-choice question per row, read by header name (column
order may vary and extra columns are ignored). Used columns: ``persona_id``, ``question_id``, ``question_type``,
``topic``, ``user_question_or_message``, ``correct_answer`` (``"(b)"``), ``all_options`` (a Python- or JSON-list
literal ``"['(a) …', '(b) …']"``), ``shared_context_id`` and ``end_index_in_shared_context``. CRLF line endings,
quoted commas and quoted newlines occur; rows are located by the physical line they start on (header = line 1).
``read_questions`` hands a bad row to a ``SkipLog`` (file, line and the column; strict by default) and raises
``DataError`` for an unreadable file or header.

Shared contexts: a ``shared_contexts_*.jsonl`` file holds one context (one user's chat history) per line:
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

import ast
import csv
import hashlib
import json
import re
from collections.abc import Callable, Container, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memstate.data import loads_record, max_record_bytes, over_limit_reason, read_lines
from memstate.errors import InputError
from memstate.schema import option_letters
from memstate.sources.skips import SKIP_DUPLICATE, SKIP_INVALID, DataError, SkipLog

REQUIRED_COLUMNS = (
    "persona_id",
    "question_id",
    "question_type",
    "topic",
    "user_question_or_message",
    "correct_answer",
    "all_options",
    "shared_context_id",
    "end_index_in_shared_context",
)
# The question types of the released files: the 32k file also uses older names for some of them. (What each becomes
# in memstate is the data build's: ``memstate.data_build.personamem.TASK_BY_QUESTION_TYPE``.)
QUESTION_TYPES = frozenset(
    {
        "recall_user_shared_facts",
        "recalling_facts_mentioned_by_the_user",
        "suggest_new_ideas",
        "acknowledge_latest_user_preferences",
        "acknowledge_latest_preferences",
        "provide_preference_aligned_recommendations",
        "track_full_preference_evolution",
        "track_full_preference_updates",
        "revisit_reasons_behind_preference_updates",
        "recalling_the_reasons_behind_previous_updates",
        "generalize_to_new_scenarios",
        "generalizing_to_new_scenarios",
    }
)
_OPTION_PREFIX = re.compile(r"^\s*\(([A-Za-z])\)\s*")
_ANSWER = re.compile(r"^\(?([A-Za-z])\)?$")
_INT = re.compile(r"^[0-9]+$")

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
        obj = loads_record(raw)
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
    >>> try:
    ...     parse_context_line('{"c1": [{"role": "narrator", "content": "Once"}]}', "ctx.jsonl", 7)
    ... except ContextError as e:
    ...     print(e)
    ctx.jsonl:7: c1[0].role: 'narrator' is not one of ['system', 'user', 'assistant']
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
        limit = max_record_bytes("context")
        with f:
            for lineno, raw, size in read_lines(f, limit, self._digest.update):
                if self.skip_blank_lines and raw is not None and not raw.strip():
                    continue
                self.lines += 1
                try:
                    if raw is None:  # over the limit: not read whole
                        raise ContextError(self.file, lineno, "(line)", over_limit_reason(size, limit, "context"))
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


# ---- questions ------------------------------------------------------------------------------------------------------


class BadRow(ValueError):
    """A row or line that breaks PersonaMem's format; the message names the column or field."""

    def __init__(self, reason: str, kind: str = SKIP_INVALID) -> None:
        super().__init__(reason)
        self.kind = kind


@dataclass(frozen=True)
class QuestionRow:
    """A well-formed question row, before its context is looked up."""

    line: int  # physical line the row starts on; the header is line 1
    persona_id: str
    question_id: str
    question_type: str
    topic: str
    question: str
    options: tuple[str, ...]  # option texts without their "(a) " prefixes
    answer: str  # option letter, uppercase
    context_id: str
    end_index: int


def parse_options(value: str) -> tuple[str, ...]:
    """The ``all_options`` literal → option texts without their ``(a) `` prefixes. Raises ``BadRow``.

    >>> parse_options('[\\'(a) Yes, "really"\\', "(b) No, it\\'s fine"]')
    ('Yes, "really"', "No, it's fine")
    """
    try:
        items = ast.literal_eval(value.strip())
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError) as e:
        raise BadRow(f"column 'all_options' is not a list literal ({type(e).__name__}: {e})") from None
    if not isinstance(items, (list, tuple)) or len(items) < 2:
        raise BadRow(f"column 'all_options' must be a list of at least 2 options, got {type(items).__name__}")
    if len(items) > 26:
        raise BadRow(f"column 'all_options' has {len(items)} options; at most 26 can be lettered")
    texts = []
    for i, (item, letter) in enumerate(zip(items, "abcdefghijklmnopqrstuvwxyz", strict=False)):
        if not isinstance(item, str):
            raise BadRow(f"column 'all_options' item {i + 1} is a {type(item).__name__}, expected a string")
        m = _OPTION_PREFIX.match(item)
        # The answer is given as a prefix letter, so a list whose prefixes are missing or out of order is ambiguous.
        if not m or m.group(1).lower() != letter:
            raise BadRow(f"column 'all_options' item {i + 1} does not start with '({letter})': {item[:40]!r}")
        text = " ".join(item[m.end() :].split())
        if not text:
            raise BadRow(f"column 'all_options' item {i + 1} ('({letter})') has no text")
        texts.append(text)
    return tuple(texts)


def parse_answer(value: str, n_options: int) -> str:
    """``correct_answer`` (``"(b)"``; a bare ``"b"`` is accepted too) → ``"B"``. Raises ``BadRow``.

    >>> parse_answer(" (b) ", 4)
    'B'
    """
    m = _ANSWER.match(value.strip())
    if not m:
        raise BadRow(f"column 'correct_answer' is {value!r}, expected an option letter like '(b)'")
    letter = m.group(1).upper()
    letters = option_letters(n_options)
    if letter not in letters:
        raise BadRow(
            f"column 'correct_answer' is {value!r} but 'all_options' has {n_options} options "
            f"({letters[0]}–{letters[-1]})"
        )
    return letter


def parse_row(line: int, header: Sequence[str], row: Sequence[str]) -> QuestionRow:
    """Validate one CSV row (a list of fields, matched to ``header`` by name). Raises ``BadRow``."""
    if len(row) != len(header):
        missing = [c for c in header[len(row) :] if c in REQUIRED_COLUMNS]
        detail = f": column(s) {', '.join(repr(c) for c in missing)} missing" if missing else ""
        raise BadRow(f"row has {len(row)} fields but the header has {len(header)}{detail}")
    values = dict(zip(header, row, strict=True))
    empty = [c for c in REQUIRED_COLUMNS if not values[c].strip()]
    if empty:
        raise BadRow(f"column(s) {', '.join(repr(c) for c in empty)} empty")
    qtype = values["question_type"].strip()
    if qtype not in QUESTION_TYPES:
        raise BadRow(f"column 'question_type' is {qtype!r}, expected one of {sorted(QUESTION_TYPES)}")
    end = values["end_index_in_shared_context"].strip()
    if not _INT.match(end) or int(end) < 1:
        raise BadRow(f"column 'end_index_in_shared_context' is {end!r}, expected an integer ≥ 1")
    options = parse_options(values["all_options"])
    # The request keeps its line breaks (it is shown as is); a leading speaker tag is dropped like in the turns.
    question = remove_speaker_tag(values["user_question_or_message"]).replace("\r\n", "\n").strip()
    if not question:
        raise BadRow("column 'user_question_or_message' holds only a speaker tag")
    return QuestionRow(
        line=line,
        persona_id=values["persona_id"].strip(),
        question_id=values["question_id"].strip(),
        question_type=qtype,
        topic=values["topic"].strip(),
        question=question,
        options=options,
        answer=parse_answer(values["correct_answer"], len(options)),
        context_id=values["shared_context_id"].strip(),
        end_index=int(end),
    )


def read_questions(
    path: Path, log: SkipLog, max_questions: int | None = None
) -> tuple[list[QuestionRow], int, dict | None]:
    """Read a questions CSV → (well-formed rows, rows read, stopped_at). Bad rows go to ``log``."""
    file = str(path)
    rows: list[QuestionRow] = []
    seen: dict[tuple[str, str], int] = {}
    n_read = 0
    # newline="" lets csv handle CRLF and newlines inside quoted fields; utf-8-sig drops a BOM before the header.
    with open(path, encoding="utf-8-sig", newline="") as f:
        reader = csv.reader(f)
        header = _read_header(reader, file)
        line = reader.line_num + 1  # physical line the next row starts on
        while True:
            if max_questions is not None and len(rows) >= max_questions:
                return rows, n_read, _stopped(file, line, max_questions, reader)
            try:
                row = next(reader)
            except StopIteration:
                break
            except (csv.Error, UnicodeDecodeError) as e:
                raise DataError(f"{file}:{line}: unreadable CSV ({type(e).__name__}: {e})") from None
            n_read += 1
            try:
                if not any(field.strip() for field in row):
                    raise BadRow("empty row")
                rec = parse_row(line, header, row)
                key = (rec.question_id, rec.context_id)
                if key in seen:
                    raise BadRow(
                        f"column 'question_id' {rec.question_id!r} repeats line {seen[key]} (same shared_context_id)",
                        SKIP_DUPLICATE,
                    )
                seen[key] = line
                rows.append(rec)
            except BadRow as e:
                log.skip(file, line, str(e), e.kind, _row_id(header, row))
            line = reader.line_num + 1
    return rows, n_read, None


def _read_header(reader: Any, file: str) -> list[str]:
    try:
        header = [h.strip() for h in next(reader)]
    except StopIteration:
        raise DataError(f"{file}:1: empty file, expected a header row") from None
    except (csv.Error, UnicodeDecodeError) as e:
        raise DataError(f"{file}:1: unreadable header ({type(e).__name__}: {e})") from None
    missing = [c for c in REQUIRED_COLUMNS if c not in header]
    dup = sorted({h for h in header if header.count(h) > 1})
    if missing or dup:
        what = f"missing column(s) {missing}" if missing else f"duplicate column(s) {dup}"
        raise DataError(f"{file}:1: header has {what}; is this a PersonaMem questions file?")
    return header


def _stopped(file: str, line: int, max_questions: int, reader: Any) -> dict | None:
    try:
        next(reader)
    except StopIteration:
        return None  # the cap fell exactly at the end: nothing was left unread
    except (csv.Error, UnicodeDecodeError):
        pass
    return {"file": file, "next_line": line, "reason": f"max_questions={max_questions} reached; later rows not read"}


def _row_id(header: Sequence[str], row: Sequence[str]) -> str | None:
    if "question_id" in header and header.index("question_id") < len(row):
        return row[header.index("question_id")].strip() or None
    return None
