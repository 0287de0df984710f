"""The Instance / Fact / Relation schema: the contract between every stage (docs/design.md).

Instances are immutable dataclasses validated on construction. ``to_dict``/``from_dict`` round-trip
through plain JSON-compatible dicts, which is also how rows are stored with ``datasets``. The serve API's request
takes the same ``ShownFact`` and ``Relation`` classes (``memstate.serve.shapes``): pydantic reads their field
annotations to validate requests and to write the OpenAPI document.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import MISSING, asdict, dataclass, field, fields
from typing import Annotated, Any, Literal

from pydantic import StrictInt, StringConstraints, with_config

from memstate.errors import MemstateError

# A source is any name a data-build source registers (memstate.data_build.registry; today fever, scifact, personamem,
# synthetic) or an external benchmark reader uses (memsyco): not a closed list, so a new source edits no schema.
SOURCE_NAME = re.compile(r"[a-z][a-z0-9_]*")
TASKS = (
    "evidence_conflict",
    "evidence_consistent",
    "preference_current",
    "preference_history",
    "preference_update",
    "preference_generalization",
    "fact_recall",
    "idea_suggestion",
    # MemSyco-Bench (external benchmark, evaluation only)
    "objective_fact_judgment",
    "contextual_scope_control",
    "memory_evidence_conflict",
    "valid_memory_selection",
    "personalized_memory_use",
)
PERSPECTIVES = ("belief", "identity", "expertise", "none")
ANSWER_KINDS = ("label", "choice", "free")
FACT_KINDS = ("evidence", "preference", "fact", "belief", "experience", "constraint")
SCOPES = ("global", "domain", "task", "situation")
ROLES = ("gold", "conflict", "distractor", "outdated", "support")
RELATION_TYPES = ("SUPERSEDES", "CONFLICTS_WITH", "SUPPORTS")

# Field types in pydantic's vocabulary, for the API (see the module docstring). Data code constructs the classes
# directly and ``validate`` checks the same rules by hand: no pydantic per row, and its SchemaError names the file,
# line and field. tests/test_schema.py pins that both accept and reject the same values.
NonBlank = Annotated[str, StringConstraints(strict=True, pattern=r"\S")]
FactKind = Literal[*FACT_KINDS]
Scope = Literal[*SCOPES]
Role = Literal[*ROLES]
RelationType = Literal[*RELATION_TYPES]


class SchemaError(MemstateError, ValueError):
    """An instance, fact or relation that breaks the schema; the message names the field."""


def _check_choice(where: str, name: str, value: Any, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise SchemaError(f"{where}: field '{name}' is {value!r}, expected one of {list(allowed)}")


def _check_str(where: str, name: str, value: Any, *, empty_ok: bool = False) -> None:
    if not isinstance(value, str):
        raise SchemaError(f"{where}: field '{name}' must be a string, got {type(value).__name__}")
    if not empty_ok and not value.strip():
        raise SchemaError(f"{where}: field '{name}' must not be empty")


def _check_keys(where: str, data: dict, cls: type) -> None:
    if not isinstance(data, dict):
        raise SchemaError(f"{where}: expected an object, got {type(data).__name__}")
    names = {f.name for f in fields(cls)}
    required = {f.name for f in fields(cls) if f.default is MISSING and f.default_factory is MISSING}
    missing = sorted(n for n in required if n not in data)
    if missing:
        raise SchemaError(f"{where}: missing field(s) {missing}")
    unknown = sorted(set(data) - names)
    if unknown:
        raise SchemaError(f"{where}: unknown field(s) {unknown}")


@with_config(extra="forbid")
@dataclass(frozen=True)
class ShownFact:
    """A fact as the policy and the responder see it, and as the serve API takes it: all of Fact but its role."""

    id: NonBlank
    text: NonBlank
    kind: FactKind
    scope: Scope = "global"
    turn: StrictInt | None = None
    time: NonBlank | None = None

    def validate(self, where: str = "fact") -> None:
        _check_str(where, "id", self.id)
        _check_str(where, "text", self.text)
        _check_choice(where, "kind", self.kind, FACT_KINDS)
        _check_choice(where, "scope", self.scope, SCOPES)
        if self.turn is not None and (not isinstance(self.turn, int) or isinstance(self.turn, bool)):
            raise SchemaError(f"{where}: field 'turn' must be an int or null, got {self.turn!r}")
        if self.time is not None:
            _check_str(where, "time", self.time)


@dataclass(frozen=True)
class Fact(ShownFact):
    """One retrieved memory or evidence sentence. ``role`` is for analysis only: never shown to a model."""

    role: Role = "gold"

    def validate(self, where: str = "fact") -> None:
        super().validate(where)
        _check_choice(where, "role", self.role, ROLES)

    @classmethod
    def from_dict(cls, data: dict, where: str = "fact") -> Fact:
        _check_keys(where, data, cls)
        fact = cls(**data)
        fact.validate(where)
        return fact


@with_config(extra="forbid")
@dataclass(frozen=True)
class Relation:
    """A relational-state edge: ``src TYPE dst`` (e.g. ``F3 SUPERSEDES F1``)."""

    src: NonBlank
    type: RelationType
    dst: NonBlank

    def validate(self, where: str = "relation") -> None:
        _check_str(where, "src", self.src)
        _check_str(where, "dst", self.dst)
        _check_choice(where, "type", self.type, RELATION_TYPES)
        if self.src == self.dst:
            raise SchemaError(f"{where}: relation from {self.src} to itself")

    @classmethod
    def from_dict(cls, data: dict, where: str = "relation") -> Relation:
        _check_keys(where, data, cls)
        rel = cls(**data)
        rel.validate(where)
        return rel


@dataclass(frozen=True)
class Instance:
    """One conflicting-memory QA instance (one row of the built dataset)."""

    id: str
    source: str
    task: str
    perspective: str
    question: str
    options: tuple[str, ...]
    answer: str
    answer_kind: str
    labels: tuple[str, ...]
    facts: tuple[Fact, ...]
    relations: tuple[Relation, ...]
    meta: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        where = f"instance {self.id!r}"
        _check_str(where, "id", self.id)
        if not isinstance(self.source, str) or not SOURCE_NAME.fullmatch(self.source):
            expected = f"expected a source name ({SOURCE_NAME.pattern})"
            raise SchemaError(f"{where}: field 'source' is {self.source!r}, {expected}")
        _check_choice(where, "task", self.task, TASKS)
        _check_choice(where, "perspective", self.perspective, PERSPECTIVES)
        _check_str(where, "question", self.question)
        _check_str(where, "answer", self.answer)
        _check_choice(where, "answer_kind", self.answer_kind, ANSWER_KINDS)
        if self.answer_kind == "label":
            if not self.labels:
                raise SchemaError(f"{where}: field 'labels' must list the label set when answer_kind is 'label'")
            if self.answer not in self.labels:
                raise SchemaError(f"{where}: field 'answer' {self.answer!r} is not in labels {list(self.labels)}")
        if self.answer_kind == "choice":
            if len(self.options) < 2:
                raise SchemaError(f"{where}: field 'options' needs at least 2 options when answer_kind is 'choice'")
            if self.answer not in option_letters(len(self.options)):
                raise SchemaError(
                    f"{where}: field 'answer' {self.answer!r} must be an option letter "
                    f"{option_letters(len(self.options))}"
                )
        if not self.facts:
            raise SchemaError(f"{where}: field 'facts' must not be empty")
        ids = [f.id for f in self.facts]
        for i, fact in enumerate(self.facts):
            fact.validate(f"{where} facts[{i}]")
        if len(set(ids)) != len(ids):
            raise SchemaError(f"{where}: field 'facts' has duplicate ids {ids}")
        for i, rel in enumerate(self.relations):
            rel.validate(f"{where} relations[{i}]")
            for end in (rel.src, rel.dst):
                if end not in ids:
                    raise SchemaError(f"{where} relations[{i}]: unknown fact id {end!r} (facts are {ids})")
        if not isinstance(self.meta, dict):
            raise SchemaError(f"{where}: field 'meta' must be an object")

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["options"] = list(self.options)
        d["labels"] = list(self.labels)
        d["facts"] = [asdict(f) for f in self.facts]
        d["relations"] = [asdict(r) for r in self.relations]
        return d

    @classmethod
    def from_dict(cls, data: dict, where: str = "instance") -> Instance:
        _check_keys(where, data, cls)
        for name in ("options", "labels", "facts", "relations"):
            if not isinstance(data.get(name, []), (list, tuple)):
                raise SchemaError(f"{where}: field '{name}' must be a list")
        # Parquet/arrow fills keys absent from some rows with None; drop them so meta round-trips.
        meta = {k: v for k, v in (data.get("meta") or {}).items() if v is not None}
        return cls(
            id=data["id"],
            source=data["source"],
            task=data["task"],
            perspective=data["perspective"],
            question=data["question"],
            options=tuple(data.get("options", ())),
            answer=data["answer"],
            answer_kind=data["answer_kind"],
            labels=tuple(data.get("labels", ())),
            facts=tuple(Fact.from_dict(f, f"{where} facts[{i}]") for i, f in enumerate(data["facts"])),
            relations=tuple(
                Relation.from_dict(r, f"{where} relations[{i}]") for i, r in enumerate(data.get("relations", ()))
            ),
            meta=meta,
        )

    @property
    def candidates(self) -> tuple[str, ...]:
        """The closed answer set shown to the responder as lettered options (empty for free answers)."""
        return self.labels if self.answer_kind == "label" else self.options if self.answer_kind == "choice" else ()

    @property
    def answer_letter(self) -> str:
        """The option letter of the reference answer for closed-set kinds.

        >>> inst = Instance(id="x", source="fever", task="evidence_conflict", perspective="belief",
        ...     question="q", options=(), answer="refuted", answer_kind="label",
        ...     labels=("supported", "refuted"), facts=(Fact("F1", "t", "evidence"),), relations=())
        >>> inst.answer_letter
        'B'
        """
        if self.answer_kind == "label":
            return option_letters(len(self.labels))[self.labels.index(self.answer)]
        if self.answer_kind == "choice":
            return self.answer
        raise ValueError("free-text answers have no option letter")


def option_letters(n: int) -> list[str]:
    """Letters used for ``n`` lettered options.

    >>> option_letters(3)
    ['A', 'B', 'C']
    """
    if not 0 <= n <= 26:
        raise ValueError(f"cannot letter {n} options")
    return [chr(ord("A") + i) for i in range(n)]


def stable_id(*parts: object) -> str:
    """A stable 16-hex id from the parts (source, source id, variant…).

    >>> stable_id("fever", 75397, "belief")
    '2d5c8c46d1093116'
    """
    return hashlib.sha256("\x1f".join(map(str, parts)).encode()).hexdigest()[:16]
