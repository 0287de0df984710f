"""Dialogue sources as ``Session``s for ``MemoryStore.ingest``. The released formats are read and validated by the
core readers (``memstate.sources``); here their dialogues become sessions.

- ``read_dialogue_jsonl``: memstate's own dialogue file, one JSON object per line, ``{"role", "content", "time"?,
  "session"?}``. Consecutive lines with the same ``session`` value form one session (its id); a line whose
  ``session`` differs from the previous line's starts a new one. Lines without ``session`` are grouped the same way
  (so a file without the field is one session, identified by its content). Blank lines are skipped.
- ``memsyco_sessions``: a MemSyco-Bench row's dialogue, whole or in sessions of ``turns_per_session`` turns.
- ``memsyco_file_sessions``: every row of a MemSyco-Bench JSONL file (``memstate.sources.memsyco``: validated
  against the benchmark's ``schema.json`` beside the file).
- ``personamem_sessions``: a PersonaMem shared-contexts JSONL (``memstate.sources.personamem``, the reader
  ``data_build`` builds instances with; one context is one user's history): its user and assistant turns,
  ``User:`` / ``Assistant:`` tags stripped and each on one line, system turns (the persona card) left out, in
  sessions of ``turns_per_session`` turns.
- ``locomo_sessions``: a LoCoMo sample's sessions (``memstate.sources.locomo``): both speakers are people the
  questions ask about, so both are ``user`` turns, told apart by ``speaker``; every turn keeps its ``dia_id`` as
  ``source`` and its session's date as ``time``.

``read_sessions(path, fmt)`` reads any of them as ``(session id, turns)`` pairs. A store is meant to hold one user
(or one benchmark sample): ``read_samples(path, fmt)`` groups the sessions by sample (a MemSyco row, a PersonaMem
context, a LoCoMo conversation; a dialogue file is one sample), one store each.

Bad input raises ``IngestError`` with ``FILE:LINE: field: reason``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from memstate.data import loads_record, max_record_bytes, over_limit_reason, read_lines, text_problem
from memstate.errors import InputError
from memstate.memory.records import TURN_ROLES, Session, Turn
from memstate.sources.locomo import LocomoError, LocomoSample, read_locomo
from memstate.sources.memsyco import MemSycoError, MemSycoRow, load_memsyco
from memstate.sources.personamem import ContextError, SharedContextFile

_MISSING = object()


class IngestError(InputError):
    """Input that cannot be ingested; the message is ``FILE:LINE: field: reason``."""


def _turn(obj: Any, where: str) -> tuple[Turn, Any]:
    if not isinstance(obj, dict):
        raise IngestError(f"{where}: (line): expected a JSON object, got {type(obj).__name__}")
    unknown = sorted(set(obj) - {"role", "content", "time", "session"})
    if unknown:
        raise IngestError(f"{where}: {unknown[0]}: not a field of a dialogue turn (role, content, time, session)")
    role, content, time = obj.get("role"), obj.get("content"), obj.get("time")
    if role not in TURN_ROLES:
        raise IngestError(f"{where}: role: {role!r} is not one of {list(TURN_ROLES)}")
    if not isinstance(content, str) or not content.strip():
        raise IngestError(f"{where}: content: must be a non-empty string")
    if time is not None and not isinstance(time, str):
        raise IngestError(f"{where}: time: must be a string or null, got {type(time).__name__}")
    session = obj.get("session")
    if session is not None and not isinstance(session, (str, int)):
        raise IngestError(f"{where}: session: must be a string or an integer, got {type(session).__name__}")
    for name in ("content", "time", "session"):
        if isinstance(obj.get(name), str) and (problem := text_problem(obj[name])) is not None:
            raise IngestError(f"{where}: {name}: {problem}")
    return Turn(role, content, time), session


def _jsonl(path: Path) -> Iterator[tuple[int, str, Any]]:
    """``(line number, "FILE:LINE", object)`` for every non-blank line; unreadable files, lines over the record size
    limit (``memstate.data``), undecodable bytes and bad JSON say where."""
    try:
        f = open(path, "rb")
    except OSError as e:
        raise IngestError(f"{path}:0: (file): cannot read: {e.strerror}") from None
    limit = max_record_bytes()
    with f:
        for lineno, raw, size in read_lines(f, limit):
            where = f"{path}:{lineno}"
            if raw is None:
                raise IngestError(f"{where}: (line): {over_limit_reason(size, limit)}")
            try:
                line = raw.decode("utf-8-sig" if lineno == 1 else "utf-8")
            except UnicodeDecodeError as e:
                raise IngestError(f"{where}: (line): not valid UTF-8 ({e.reason} at byte {e.start})") from None
            if not line.strip():
                continue
            try:
                yield lineno, where, loads_record(line)
            except json.JSONDecodeError as e:
                array = line[:1] == "["  # LoCoMo's release is one JSON array: say so instead of "Expecting value"
                hint = " (a JSON array, not JSONL: LoCoMo's file is read with --format locomo)" if array else ""
                raise IngestError(f"{where}: (line): invalid JSON: {e.msg} (column {e.colno}){hint}") from None


def read_dialogue_jsonl(path: str | Path) -> Iterator[Session]:
    """The sessions of a dialogue JSONL file (see the module docstring), in file order."""
    path = Path(path)
    turns: list[Turn] = []
    current: Any = _MISSING
    start = 0
    for lineno, where, obj in _jsonl(path):
        turn, session = _turn(obj, where)
        if turns and session != current:
            yield _session(turns, current, f"{path}:{start}")
            turns = []
        if not turns:
            current, start = session, lineno
        turns.append(turn)
    if turns:
        yield _session(turns, current, f"{path}:{start}")


def _session(turns: list[Turn], sid: Any, where: str) -> Session:
    return Session(tuple(turns), id=None if sid is None else str(sid), where=where)


def _chunks(turns: list[Turn], size: int | None) -> list[list[Turn]]:
    if size is not None and size < 1:
        raise ValueError(f"turns_per_session must be ≥ 1, got {size}")
    size = size or max(len(turns), 1)
    return [turns[i : i + size] for i in range(0, len(turns), size)]


def memsyco_sessions(row: Any, *, turns_per_session: int | None = None, where: str | None = None) -> list[Session]:
    """A MemSyco-Bench row (``memstate.sources.memsyco.MemSycoRow`` or its raw dict) as sessions with ids
    ``<row id>#<i>``.

    Only the dialogue is ingested: the row's ``memory`` items are the benchmark's gold answer key, not input."""
    raw = row.raw if hasattr(row, "raw") else row
    where = where or getattr(row, "where", "memsyco row")
    if not isinstance(raw, dict) or not isinstance(raw.get("dialogue"), list):
        raise IngestError(f"{where}: dialogue: must be a list of turns")
    turns = []
    for i, t in enumerate(raw["dialogue"]):
        turn, _ = _turn(t, f"{where}: dialogue[{i}]")
        turns.append(replace(turn, source=f"{raw.get('id', 'row')}:{i}"))  # provenance: row id and dialogue index
    return [
        Session(tuple(chunk), id=f"{raw.get('id', 'row')}#{n}", where=where)
        for n, chunk in enumerate(_chunks(turns, turns_per_session))
    ]


def personamem_sessions(
    path: str | Path, *, turns_per_session: int = 20, context_ids: set[str] | None = None
) -> Iterator[tuple[str, list[Session]]]:
    """``(context id, sessions)`` per line of a PersonaMem shared-contexts JSONL (streamed: the files are large),
    session ids ``pm:<context id[:16]>#<i>``, turn times ``turn <message index>``; ``context_ids`` keeps only those
    contexts (every line is still checked). Blank lines are skipped; a bad line, or a context id that repeats an
    earlier line's, raises ``IngestError``."""
    try:
        for ctx in SharedContextFile(path, context_ids=context_ids, skip_blank_lines=True):
            turns = [Turn(t.role, t.text, f"turn {t.index}") for t in ctx.of_role("user", "assistant")]
            yield (
                ctx.id,
                [
                    Session(tuple(chunk), id=f"pm:{ctx.id[:16]}#{n}", where=ctx.where)
                    for n, chunk in enumerate(_chunks(turns, turns_per_session))
                ],
            )
    except ContextError as e:
        raise IngestError(str(e)) from None


def _memsyco_rows(path: str | Path) -> list[MemSycoRow]:
    try:
        return load_memsyco(path)
    except MemSycoError as e:
        raise IngestError(str(e)) from None


def memsyco_file_sessions(path: str | Path, *, turns_per_session: int | None = None) -> Iterator[Session]:
    """The sessions of every row of a MemSyco-Bench JSONL file, row after row; the file is validated whole first (a
    bad row raises ``IngestError`` before any session)."""
    for row in _memsyco_rows(path):
        yield from memsyco_sessions(row, turns_per_session=turns_per_session)


def locomo_sessions(sample: LocomoSample) -> list[Session]:
    """A LoCoMo sample's sessions (see the module docstring), in order."""
    return [
        Session(
            tuple(Turn("user", t.text, s.time, t.speaker, t.dia_id) for t in s.turns),
            id=s.id,
            time=s.time,
            where=s.where,
        )
        for s in sample.sessions
    ]


INPUT_FORMATS = ("dialogue", "memsyco", "personamem", "locomo")


@dataclass
class Samples:
    """A file's sessions grouped by sample (id None: the file is one sample) and the records skipped while reading
    it, each naming file, sample and field (only LoCoMo's broken evidence ids so far)."""

    samples: list[tuple[str | None, list[Session]]]
    skipped: list[str]


def read_samples(path: str | Path, fmt: str = "dialogue") -> Samples:
    """Every sample of a file in one of ``INPUT_FORMATS``, read whole (so bad input fails before any store); a
    string that cannot be stored as UTF-8 (a lone surrogate) is an ``IngestError`` naming where and the field."""
    samples = _read_samples(path, fmt)
    for _, sessions in samples.samples:
        for n, session in enumerate(sessions):
            _check_text(session, f"{session.where or path}: session {n}")
    return samples


def _check_text(session: Session, where: str) -> None:
    fields = {"id": session.id, "time": session.time}
    for i, turn in enumerate(session.turns):
        fields |= {f"turn {i} {name}": getattr(turn, name) for name in ("content", "time", "speaker", "source")}
    for name, value in fields.items():
        if isinstance(value, str) and (problem := text_problem(value)) is not None:
            raise IngestError(f"{where}: {name}: {problem}")


def _read_samples(path: str | Path, fmt: str) -> Samples:
    if fmt == "dialogue":
        return Samples([(None, list(read_dialogue_jsonl(path)))], [])
    if fmt == "memsyco":  # ids are unique: the reader checks them
        return Samples([(row.id, memsyco_sessions(row)) for row in _memsyco_rows(path)], [])
    if fmt == "personamem":
        return Samples(list(personamem_sessions(path)), [])
    if fmt == "locomo":
        try:
            locomo = read_locomo(path)
        except LocomoError as e:
            raise IngestError(str(e)) from None
        return Samples([(s.id, locomo_sessions(s)) for s in locomo.samples], locomo.skipped)
    raise ValueError(f"format {fmt!r} is not one of {list(INPUT_FORMATS)}")


def read_sessions(path: str | Path, fmt: str = "dialogue") -> Iterator[tuple[str | None, list[Turn]]]:
    """``(session id, turns)`` for every session of a file in one of ``INPUT_FORMATS`` (id None: derived from
    the content by the store)."""
    if fmt == "dialogue":
        sessions: Iterator[Session] = read_dialogue_jsonl(path)
    elif fmt == "memsyco":
        sessions = memsyco_file_sessions(path)
    elif fmt == "personamem":
        sessions = (s for _, ctx in personamem_sessions(path) for s in ctx)
    elif fmt == "locomo":
        sessions = (s for _, group in read_samples(path, fmt).samples for s in group)
    else:
        raise ValueError(f"format {fmt!r} is not one of {list(INPUT_FORMATS)}")
    for s in sessions:
        yield s.id, list(s.turns)
