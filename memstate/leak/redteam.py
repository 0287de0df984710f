"""Red-team sets of the leak gate: a directory of ``instances.jsonl`` (Instances, each named by ``meta.redteam_name``),
``leaks.jsonl`` (``instance``, ``kind``, ``names``: the gold answer the state passes on, ``state``) and ``legit.jsonl``
(``instance``, ``kind``, ``state``); optionally ``leaks_flow.jsonl`` (the leaks' format): leaks the word rules no
longer claim because no wording tells them from procedure, left to the reward's answer-flow credit. The project's own
set is ``tests/fixtures/redteam``; the tests and the gate benchmarks read sets with ``load_redteam``."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

from memstate.errors import InputNotFound
from memstate.schema import Instance, SchemaError, option_letters


@dataclass(frozen=True)
class Case:
    """One state of a red-team set, on its instance; ``leak`` says whether the set calls it a leak."""

    instance: Instance
    kind: str
    state: str
    leak: bool
    where: str  # file:line
    flow: bool = False  # a leak of leaks_flow.jsonl: the answer-flow credit's, not the gate's


def gold_variants(instance: Instance) -> list[Instance]:
    """The instance under every possible gold answer (a gate's decision must be the same for all of them)."""
    answers = instance.labels if instance.answer_kind == "label" else option_letters(len(instance.options))
    return [replace(instance, answer=a) for a in answers]


def _rows(path: Path) -> list[tuple[str, dict]]:
    if not path.is_file():
        raise InputNotFound(f"{path}: no such red-team file")
    out = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if line.strip():
            try:
                out.append((f"{path}:{n}", json.loads(line)))
            except json.JSONDecodeError as e:
                raise SchemaError(f"{path}:{n}: not JSON ({e.msg})") from None
    return out


def load_redteam(directory: str | Path) -> list[Case]:
    """Every leak and legitimate state of a red-team set, each on its instance (gold answer as given); the leaks of
    ``leaks_flow.jsonl``, where there is one, with ``flow`` set."""
    directory = Path(directory)
    instances = {}
    for where, row in _rows(directory / "instances.jsonl"):
        inst = Instance.from_dict(row, where)
        instances[inst.meta.get("redteam_name", inst.id)] = inst
    cases = []
    files = [("leaks.jsonl", True), ("legit.jsonl", False)]
    files += [("leaks_flow.jsonl", True)] if (directory / "leaks_flow.jsonl").is_file() else []
    for name, leak in files:
        for where, row in _rows(directory / name):
            if row.get("instance") not in instances:
                raise SchemaError(f"{where}: field 'instance': unknown instance {row.get('instance')!r}")
            inst = instances[row["instance"]]
            if leak and row.get("names") != inst.answer:
                raise SchemaError(
                    f"{where}: field 'names': {row.get('names')!r} is not the gold answer {inst.answer!r}"
                )
            cases.append(Case(inst, row.get("kind", ""), row["state"], leak, where, name == "leaks_flow.jsonl"))
    return cases
