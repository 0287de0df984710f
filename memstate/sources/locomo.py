"""LoCoMo (Maharana et al., 2024), as released: ``locomo10.json``, one JSON array of samples, read and validated —
the one reader of the format (``memory`` ingests its conversations, ``evaluate retrieval`` asks its questions).

Each sample is one conversation between two people (``conversation.speaker_a`` / ``speaker_b``) over sessions
``session_<N>`` (turns ``{speaker, dia_id, text, img_url?, blip_caption?, query?}``) dated by
``session_<N>_date_time``, and its QA items (``question``, ``answer`` or ``adversarial_answer``, ``category``,
``evidence``: the ``dia_id`` s of the turns that hold the answer).

A sample, shortened::

    {"sample_id": "conv-26", "conversation": {"speaker_a": "Caroline", "speaker_b": "Melanie",
     "session_1_date_time": "1:56 pm on 8 May, 2023", "session_1": [{"speaker": "Caroline", "dia_id": "D1:1",
     "text": "Hey Mel! …"}, …], …}, "qa": [{"question": "…", "answer": "7 May 2023", "evidence": ["D1:3"],
     "category": 2}, …]}

A shared image is kept as text — ``[shares an image: <blip caption>]`` after the turn's words
(``LocomoTurn.text``) — because questions ask about what was shown. Every turn keeps its ``dia_id`` and speaker;
each session its date (``LocomoSession.time``).

A malformed conversation (a turn without text, an unknown speaker, a repeated ``dia_id``) raises ``LocomoError``
naming file, sample and field: its turns are what a memory store is given. Evidence ids are only the benchmark's
answer key, and the release has a few broken ones (``"D"``, ``"D:11:26"``, one that names no turn): those are
skipped, counted and listed (``LocomoFile.skipped``, each naming file, sample and field). ``"D8:6; D9:17"`` is two
ids and read as such.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from memstate.data import loads_record
from memstate.errors import InputError

_SESSION = re.compile(r"^session_([0-9]+)$")
DIA_ID = re.compile(r"^D([0-9]+):([0-9]+)$")
_TURN_FIELDS = frozenset({"speaker", "dia_id", "text", "img_url", "blip_caption", "query", "re-download"})


class LocomoError(InputError):
    """A LoCoMo file or record that breaks the format; the message names the file, the sample and the field."""


@dataclass(frozen=True)
class LocomoTurn:
    """One turn: who spoke, its dialogue id (``D<session>:<turn>``) and its words, a shared image's caption after."""

    speaker: str
    dia_id: str
    text: str


@dataclass(frozen=True)
class LocomoSession:
    """One ``session_<N>`` with turns: ``id`` ``<sample id>:session_<N>``, ``time`` its ``session_<N>_date_time``."""

    id: str
    time: str | None
    turns: tuple[LocomoTurn, ...]
    where: str  # "FILE: sample ID: conversation.session_<N>", for messages


@dataclass(frozen=True)
class LocomoQA:
    """One question; ``answer`` is the adversarial answer for category 5 (unanswerable) items."""

    question: str
    answer: str
    category: int
    evidence: tuple[str, ...]


@dataclass(frozen=True)
class LocomoSample:
    id: str
    speakers: tuple[str, str]
    sessions: tuple[LocomoSession, ...]
    qa: tuple[LocomoQA, ...]

    @property
    def turn_ids(self) -> set[str]:
        return {t.dia_id for s in self.sessions for t in s.turns}


@dataclass
class LocomoFile:
    samples: list[LocomoSample] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # "FILE: sample ID: qa[i].evidence[j]: reason"


def _str(obj: dict, key: str, where: str, *, optional: bool = False) -> str | None:
    value = obj.get(key)
    if value is None and optional:
        return None
    if not isinstance(value, str):
        raise LocomoError(f"{where}.{key}: must be a string, got {type(value).__name__}")
    return value


def _turn(raw: Any, where: str, speakers: tuple[str, str]) -> LocomoTurn:
    if not isinstance(raw, dict):
        raise LocomoError(f"{where}: expected a JSON object, got {type(raw).__name__}")
    unknown = sorted(set(raw) - _TURN_FIELDS)
    if unknown:
        raise LocomoError(f"{where}.{unknown[0]}: not a field of a LoCoMo turn ({', '.join(sorted(_TURN_FIELDS))})")
    speaker, dia_id, text = (_str(raw, k, where) for k in ("speaker", "dia_id", "text"))
    if speaker not in speakers:
        raise LocomoError(f"{where}.speaker: {speaker!r} is neither speaker_a nor speaker_b {list(speakers)}")
    if not DIA_ID.match(dia_id or ""):
        raise LocomoError(f"{where}.dia_id: {dia_id!r} is not a dialogue id D<session>:<turn>")
    caption = _str(raw, "blip_caption", where, optional=True)
    content = " ".join(x for x in ((text or "").strip(), caption and f"[shares an image: {caption.strip()}]") if x)
    if not content:
        raise LocomoError(f"{where}.text: empty, and no blip_caption")
    return LocomoTurn(speaker or "", dia_id or "", content)


def _sessions(conv: dict, where: str, speakers: tuple[str, str], sample_id: str) -> tuple[LocomoSession, ...]:
    numbered = sorted((int(m.group(1)), key) for key in conv if (m := _SESSION.match(key)))  # 10 after 9
    sessions, seen = [], set()
    for _, key in numbered:
        turns_raw = conv[key]
        if not isinstance(turns_raw, list):
            raise LocomoError(f"{where}.{key}: must be a list of turns, got {type(turns_raw).__name__}")
        time = _str(conv, f"{key}_date_time", where, optional=True)
        turns = [_turn(t, f"{where}.{key}[{i}]", speakers) for i, t in enumerate(turns_raw)]
        for i, t in enumerate(turns):
            if t.dia_id in seen:
                raise LocomoError(f"{where}.{key}[{i}].dia_id: {t.dia_id!r} repeats an earlier turn's")
            seen.add(t.dia_id)
        if turns:
            sessions.append(LocomoSession(f"{sample_id}:{key}", time, tuple(turns), f"{where}.{key}"))
    if not sessions:
        raise LocomoError(f"{where}: no session_<N> with turns")
    return tuple(sessions)


def _evidence(raw: Any, where: str, turn_ids: set[str], skipped: list[str]) -> tuple[str, ...]:
    if not isinstance(raw, list):
        raise LocomoError(f"{where}: must be a list of dialogue ids, got {type(raw).__name__}")
    out = []
    for j, item in enumerate(raw):
        ids = [x.strip() for x in item.split(";")] if isinstance(item, str) else [item]
        for ev in ids:
            if not isinstance(ev, str) or not DIA_ID.match(ev):
                skipped.append(f"{where}[{j}]: {ev!r} is not a dialogue id D<session>:<turn>")
            elif ev not in turn_ids:
                skipped.append(f"{where}[{j}]: {ev!r} names no turn of the conversation")
            elif ev not in out:
                out.append(ev)
    return tuple(out)


def _qa(raw: Any, where: str, turn_ids: set[str], skipped: list[str]) -> LocomoQA:
    if not isinstance(raw, dict):
        raise LocomoError(f"{where}: expected a JSON object, got {type(raw).__name__}")
    question = _str(raw, "question", where)
    category = raw.get("category")
    if isinstance(category, bool) or not isinstance(category, int) or not 1 <= category <= 5:
        raise LocomoError(f"{where}.category: must be an integer 1..5, got {category!r}")
    answer = raw.get("answer", raw.get("adversarial_answer"))
    if not isinstance(answer, (str, int, float)) or isinstance(answer, bool):  # the release has a few numbers
        raise LocomoError(f"{where}.answer: must be a string or a number (or adversarial_answer), got {answer!r}")
    evidence = _evidence(raw.get("evidence", []), f"{where}.evidence", turn_ids, skipped)
    return LocomoQA(question or "", str(answer), category, evidence)


def read_locomo(path: str | Path) -> LocomoFile:
    """Every sample of a LoCoMo JSON file, validated (see the module docstring)."""
    path = Path(path)
    try:
        data = loads_record(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise LocomoError(f"{path}: (file): cannot read: {e.strerror}") from None
    except json.JSONDecodeError as e:
        raise LocomoError(f"{path}:{e.lineno}: (file): invalid JSON: {e.msg} (column {e.colno})") from None
    if not isinstance(data, list):
        raise LocomoError(f"{path}: (file): a LoCoMo file is a JSON array of samples, got {type(data).__name__}")
    out = LocomoFile()
    ids: set[str] = set()
    for i, raw in enumerate(data):
        where = f"{path}: sample[{i}]"
        if not isinstance(raw, dict):
            raise LocomoError(f"{where}: expected a JSON object, got {type(raw).__name__}")
        sample_id = _str(raw, "sample_id", where) or ""
        if not sample_id or sample_id in ids:
            raise LocomoError(f"{where}.sample_id: {sample_id!r} is empty or repeats an earlier sample's")
        ids.add(sample_id)
        where = f"{path}: sample {sample_id}"
        conv = raw.get("conversation")
        if not isinstance(conv, dict):
            raise LocomoError(f"{where}: conversation: must be a JSON object")
        speakers = tuple(_str(conv, k, f"{where}: conversation") for k in ("speaker_a", "speaker_b"))
        sessions = _sessions(conv, f"{where}: conversation", speakers, sample_id)  # type: ignore[arg-type]
        turn_ids = {t.dia_id for s in sessions for t in s.turns}
        qa_raw = raw.get("qa", [])
        if not isinstance(qa_raw, list):
            raise LocomoError(f"{where}: qa: must be a list")
        qa = tuple(_qa(q, f"{where}: qa[{j}]", turn_ids, out.skipped) for j, q in enumerate(qa_raw))
        out.samples.append(LocomoSample(sample_id, speakers, sessions, qa))  # type: ignore[arg-type]
    return out
