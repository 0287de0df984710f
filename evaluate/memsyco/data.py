"""MemSyco-Bench rows (read and validated by ``memstate.sources.memsyco``) mapped to Instances."""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from typing import Any

from memstate.schema import Fact, Instance, Relation, stable_id
from memstate.sources.memsyco import MemSycoError, MemSycoRow

logger = logging.getLogger("memstate.evaluate.memsyco")


# ---- rows to Instances ----------------------------------------------------------------------------------------------

_KIND_KEYS = ("preference", "belief", "constraint", "experience", "evidence")
_INFORMATION = re.compile(r"<information>(.*?)</information>", re.DOTALL)
_SOURCE_HEAD = re.compile(r"^\[([^\]\n]+)\]\s*$", re.MULTILINE)


def fact_kind(item_type: str) -> str:
    """The schema fact kind of a MemSyco-Bench memory item type.

    >>> fact_kind("reinforced_positive_preference"), fact_kind("preference"), fact_kind("biography")
    ('preference', 'preference', 'fact')
    """
    low = item_type.lower()
    return next((k for k in _KIND_KEYS if k in low), "fact")


def clip(text: str, limit: int) -> str:
    """Whitespace collapsed and cut to at most ``limit`` characters at a word boundary, marked with '…'.

    >>> clip("one  two three four", 12)
    'one two…'
    """
    text = " ".join(text.split())
    if len(text) <= limit:
        return text
    cut = text[: limit - 1]
    space = cut.rfind(" ")
    return (cut[:space] if space > limit // 2 else cut).rstrip() + "…"


def evidence_excerpts(content: str) -> list[str]:
    """The source excerpts of the ``<information>`` blocks of an assistant turn, as ``"Title: text"``.

    >>> evidence_excerpts("<information>\\n[Review, 2026]\\nB wins.\\n\\n[Blog]\\nA: ok\\n</information> Found.")
    ['Review, 2026: B wins.', 'Blog: A: ok']
    """
    out = []
    for block in _INFORMATION.findall(content):
        heads = list(_SOURCE_HEAD.finditer(block))
        if not heads:
            out += [block.strip()] if block.strip() else []
        for head, nxt in zip(heads, [*heads[1:], None], strict=True):
            out.append(f"{head.group(1)}: {block[head.end() : nxt.start() if nxt else len(block)].strip()}")
    return out


def _memory_role(status: str, policy: str) -> str:
    if status == "outdated":
        return "outdated"
    return "conflict" if policy in ("ignore_as_evidence", "defer_to_evidence") else "gold"


RELATION_SOURCES = ("pipeline", "gold")
GOLD_RELATIONS_LABEL = "gold relations (answer key shown)"
PIPELINE_RELATIONS_LABEL = "memory pipeline (default extractor over the memory items)"


def gold_relations(row: MemSycoRow) -> tuple[Relation, ...]:
    """Each ``current`` item SUPERSEDES each ``outdated`` one, from the benchmark's gold ``status``: the answer key.

    Memory item ``i`` is fact ``F{i+1}`` (as in ``to_instance``)."""
    status = [item["status"] for item in row.memory_items]
    return tuple(
        Relation(f"F{c + 1}", "SUPERSEDES", f"F{o + 1}")
        for c, sc in enumerate(status)
        if sc == "current"
        for o, so in enumerate(status)
        if so == "outdated"
    )


def pipeline_relations(row: MemSycoRow) -> tuple[Relation, ...]:
    """The edges the memory pipeline draws between the row's memory items, as between facts ``F{i+1}``.

    The items' text only (never ``status``) is ingested, one user turn per item in file order, as one session into
    a fresh in-memory store with the deployment extractor (``memory.extract.make_extractor()``, as
    ``run.pipeline_instance`` and ``memory ingest``); the
    store checks and commits the proposal as at deployment. An edge between two facts of one item is dropped. The
    store's vectors play no part: it starts empty, so the extractor sees no stored context."""
    from memstate.memory import MemoryStore, Turn
    from memstate.memory.embed import HashEmbedder
    from memstate.memory.extract import make_extractor

    turns = [Turn("user", item["content"]) for item in row.memory_items]
    with MemoryStore(":memory:", HashEmbedder(64)) as store:
        store.ingest_session(turns, make_extractor(), session_id=row.id)
        item_of = {f.id: f.turn for f in store.facts()}  # the first session: a fact's turn is its item's index
        edges = store.relations()
    return tuple(
        dict.fromkeys(
            Relation(f"F{item_of[s] + 1}", t, f"F{item_of[d] + 1}") for s, t, d in edges if item_of[s] != item_of[d]
        )
    )


def relation_agreement(
    rows: Sequence[MemSycoRow], drawn_per_row: Sequence[tuple[Relation, ...]] | None = None
) -> dict[str, Any]:
    """The pipeline's SUPERSEDES edges against the gold current→outdated pairs on ``rows`` (micro-averaged).
    ``drawn_per_row``: the pipeline's relations of each row when already drawn (else they are drawn here).

    ``precision`` is None when the pipeline drew no SUPERSEDES edge, ``recall`` when there is no gold pair;
    ``reversed`` counts pipeline edges that point from an outdated item to a current one."""
    gold_n = drawn_n = hits = flipped = conflicts = rows_with_edge = 0
    if drawn_per_row is None:
        drawn_per_row = [pipeline_relations(row) for row in rows]
    for row, drawn in zip(rows, drawn_per_row, strict=True):
        gold = {(r.src, r.dst) for r in gold_relations(row)}
        supersedes = {(r.src, r.dst) for r in drawn if r.type == "SUPERSEDES"}
        gold_n, drawn_n, hits = gold_n + len(gold), drawn_n + len(supersedes), hits + len(gold & supersedes)
        flipped += len({(d, s) for s, d in supersedes} & gold)
        conflicts += sum(r.type == "CONFLICTS_WITH" for r in drawn)
        rows_with_edge += bool(drawn)
    return {
        "rows": len(rows),
        "rows_with_a_pipeline_edge": rows_with_edge,
        "gold_pairs": gold_n,
        "pipeline_supersedes": drawn_n,
        "true_positives": hits,
        "reversed": flipped,
        "precision": hits / drawn_n if drawn_n else None,
        "recall": hits / gold_n if gold_n else None,
        "pipeline_conflicts_with": conflicts,
    }


def to_instance(
    row: MemSycoRow,
    *,
    include_memory: bool = True,
    max_fact_chars: int = 800,
    max_dialogue_facts: int = 12,
    relations: str = "pipeline",
) -> Instance:
    """The Instance the policy and the responder see for a row (see the module docstring for every choice).

    ``relations``: ``"pipeline"`` (default) draws them with the memory pipeline from the items' text;
    ``"gold"`` derives them from the benchmark's ``status`` (the answer key, for an oracle condition only)."""
    if relations not in RELATION_SOURCES:
        raise ValueError(f"relations {relations!r} is not one of {list(RELATION_SOURCES)}")
    facts: list[Fact] = []
    if include_memory:
        for item in row.memory_items:
            role = _memory_role(item["status"], row.memory_policy)
            facts.append(
                Fact(f"F{len(facts) + 1}", clip(item["content"], max_fact_chars), fact_kind(item["type"]), role=role)
            )
    dialogue: list[tuple[str, str, int]] = []
    for turn, message in enumerate(row.dialogue):
        if message["role"] == "user":
            dialogue.append(("experience", message["content"], turn))
        else:
            dialogue += [("evidence", text, turn) for text in evidence_excerpts(message["content"])]
    for kind, text, turn in dialogue[max(0, len(dialogue) - max_dialogue_facts) :]:
        facts.append(Fact(f"F{len(facts) + 1}", clip(text, max_fact_chars), kind, turn=turn, role="support"))
    if not facts:
        raise MemSycoError(f"{row.where}: no facts: memory items left out and no user turn or evidence kept")
    meta = {
        "memsyco_id": row.id,
        "where": row.where,
        "memory_policy": row.memory_policy,
        "subtype": row.metadata.get("subtype"),
        "topic": row.metadata.get("topic"),
        "source_id": row.metadata.get("source_id"),
        "group": row.id,
        "relations_source": relations,
    }
    return Instance(
        id=stable_id("memsyco", row.task, row.id),
        source="memsyco",
        task=row.task,
        perspective="none",
        question=row.question,
        options=(),
        answer=row.evaluation["reference_answer"],
        answer_kind="free",
        labels=(),
        facts=tuple(facts),
        relations=(gold_relations(row) if relations == "gold" else pipeline_relations(row)) if include_memory else (),
        meta={k: v for k, v in meta.items() if v is not None},
    )
