"""The concept tree: concepts with PARENT_OF edges (``concepts.parent``) and CONTAINS edges to facts
(``concept_facts``). Unlike facts, concepts are state: MERGE retires one concept into another, SPLIT hands some of a
concept's facts to new children. Every edit is checked against the tree as the earlier edits left it and either
applied whole or rejected, so the tree stays a forest: one parent at most, no cycle.

Used only inside the store's write transaction (a rejected session leaves no trace).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable

from memstate.memory.records import CONCEPT_OPS, ConceptEdit

MAX_NAME_CHARS = 80


def concept_name(text: str) -> str:
    """Names compare lowercased with whitespace squashed.

    >>> concept_name("  Green   Tea ")
    'green tea'
    """
    return " ".join(str(text).lower().split())


class ConceptTree:
    """Reads and edits the concept tree through the store's connection, within its open transaction."""

    def __init__(self, db: sqlite3.Connection, session: int) -> None:
        self.db = db
        self.session = session
        self.split_from: dict[int, set[int]] = {}  # new fact → concepts a SPLIT took it from (not re-attached)

    def find(self, name: str) -> int | None:
        """The live concept called ``name``."""
        row = self.db.execute(
            "SELECT num FROM concepts WHERE name = ? AND merged_into IS NULL", (concept_name(name),)
        ).fetchone()
        return row[0] if row else None

    def resolve(self, name: str) -> int | None:
        """The live concept called ``name``, or the one a retired concept of that name was merged into."""
        num = self.find(name)
        if num is not None:
            return num
        row = self.db.execute(
            "SELECT merged_into FROM concepts WHERE name = ? ORDER BY num DESC LIMIT 1", (concept_name(name),)
        ).fetchone()
        seen = set()
        while row and row[0] is not None and row[0] not in seen:
            seen.add(num := row[0])
            row = self.db.execute("SELECT merged_into FROM concepts WHERE num = ?", (num,)).fetchone()
        return num

    def ancestors(self, num: int) -> list[int]:
        out: list[int] = []
        parent = self.db.execute("SELECT parent FROM concepts WHERE num = ?", (num,)).fetchone()[0]
        while parent is not None and parent not in out:
            out.append(parent)
            parent = self.db.execute("SELECT parent FROM concepts WHERE num = ?", (parent,)).fetchone()[0]
        return out

    def create(self, name: str, parent: int | None = None) -> int:
        cur = self.db.execute(
            "INSERT INTO concepts (name, parent, session) VALUES (?, ?, ?)", (concept_name(name), parent, self.session)
        )
        return int(cur.lastrowid)

    def attach(self, fact: int, name: str) -> bool:
        """``concept CONTAINS fact``; False when no concept has (or had) that name."""
        num = self.resolve(name)
        if num is None:
            return False
        if num in self.split_from.get(fact, ()):
            return True  # a SPLIT of this session already moved it into a child of that concept
        self.db.execute("INSERT OR IGNORE INTO concept_facts (concept, fact) VALUES (?, ?)", (num, fact))
        return True

    def apply(self, edit: ConceptEdit, fact_num: Callable[[str], int | None], new_facts: set[int]) -> str | None:
        """Apply ``edit``, or return why not (then nothing changed). A CREATE of an existing name is a no-op.

        ``fact_num`` maps a stored id or a proposal key to a fact number; ``new_facts`` are this session's facts
        (a SPLIT may hand them to a part without their being members of the split concept yet)."""
        if edit.op not in CONCEPT_OPS:
            return f"op {edit.op!r} is not one of {list(CONCEPT_OPS)}"
        name = concept_name(edit.name or "")
        if not name or len(name) > MAX_NAME_CHARS:
            return f"name must have 1..{MAX_NAME_CHARS} characters"
        if edit.op == "CREATE":
            return self._create(name, edit.parent)
        if edit.op == "MERGE":
            return self._merge(name, edit.into)
        return self._split(name, edit.parts, fact_num, new_facts)

    def _create(self, name: str, parent_name: str | None) -> str | None:
        if self.find(name) is not None:
            return None
        parent = None
        if parent_name:
            parent = self.find(parent_name)
            if parent is None:
                return f"parent concept {concept_name(parent_name)!r} does not exist"
        self.create(name, parent)
        return None

    def _merge(self, name: str, into_name: str | None) -> str | None:
        src, dst = self.find(name), self.find(into_name or "")
        if src is None:
            return f"concept {name!r} does not exist"
        if dst is None:
            return f"target concept {concept_name(into_name or '')!r} does not exist"
        if src == dst:
            return "a concept cannot merge into itself"
        if src in self.ancestors(dst):
            return f"{concept_name(into_name or '')!r} lies under {name!r}: the merge would make a cycle"
        self.db.execute(
            "INSERT OR IGNORE INTO concept_facts (concept, fact) SELECT ?, fact FROM concept_facts WHERE concept = ?",
            (dst, src),
        )
        self.db.execute("DELETE FROM concept_facts WHERE concept = ?", (src,))
        self.db.execute("UPDATE concepts SET parent = ? WHERE parent = ? AND merged_into IS NULL", (dst, src))
        self.db.execute("UPDATE concepts SET merged_into = ? WHERE num = ?", (dst, src))
        return None

    def _split(
        self,
        name: str,
        parts: tuple[tuple[str, tuple[str, ...]], ...],
        fact_num: Callable[[str], int | None],
        new_facts: set[int],
    ) -> str | None:
        parent = self.find(name)
        if parent is None:
            return f"concept {name!r} does not exist"
        if not parts:
            return "SPLIT needs at least one part"
        members = {r[0] for r in self.db.execute("SELECT fact FROM concept_facts WHERE concept = ?", (parent,))}
        names: set[str] = set()
        placed: set[int] = set()
        resolved: list[tuple[str, list[int]]] = []
        for child, refs in parts:
            child = concept_name(child)
            if not child or len(child) > MAX_NAME_CHARS:
                return f"part name must have 1..{MAX_NAME_CHARS} characters"
            if child in names or self.find(child) is not None:
                return f"part {child!r} already exists"
            names.add(child)
            nums = []
            for ref in refs:
                num = fact_num(ref)
                if num is None:
                    return f"part {child!r}: no fact {ref}"
                if num not in members and num not in new_facts:
                    return f"part {child!r}: fact {ref} is not in concept {name!r}"
                if num in placed:
                    return f"fact {ref} is in two parts"
                placed.add(num)
                nums.append(num)
            resolved.append((child, nums))
        for child, nums in resolved:
            num = self.create(child, parent)
            for fact in nums:
                self.db.execute("DELETE FROM concept_facts WHERE concept = ? AND fact = ?", (parent, fact))
                self.db.execute("INSERT INTO concept_facts (concept, fact) VALUES (?, ?)", (num, fact))
                self.split_from.setdefault(fact, set()).add(parent)
        return None
