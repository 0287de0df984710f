"""Objective instances (FEVER, SciFact): a claim's evidence plus an injected user memory, and distractors.

- **Conflict** (``evidence_conflict``): the user memory asserts the stance the evidence does not support, from one
  of three perspectives (belief, identity, expertise); y* follows the evidence.
- **Consistent control** (``evidence_consistent``, ``consistent_share`` of claim × perspective pairs, default one
  half): the user memory agrees with the evidence. At one half the user's stance is independent of the label, so
  neither "distrust the user" nor "follow the user" earns anything: only reading the evidence does.
- **NOT ENOUGH INFO** claims (no deciding evidence): the user asserts "true" or "false" (seeded, one half each), the
  facts are what was retrieved for the claim but does not decide it (SciFact: the cited abstracts' first sentences;
  FEVER, whose NEI claims cite nothing: as many evidence sentences of other claims of the same split as a claim
  of that split cites, as a retriever would return), and y* is "not enough info". Always a conflict.
- **No evidence–memory relation**: which memory the evidence contradicts is the answer key, and no detector a
  memory pipeline would run at deployment is shipped for it (the memory pipeline relates the user's own memories,
  not retrieved evidence); the policy has to read the evidence. ``evidence_relations: gold`` puts the gold edges
  back for diagnosis only — the shortcut probe (``memstate.data_build.probe``) then fails the build.
- **Distractors**: 2–4 memories from the same scenario but another topic — other claims' evidence sentences and
  user memories, drawn from the same split so no text crosses a split boundary.
Fact order is shuffled per instance (seeded), so a fact's position never reveals its role.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from memstate.data_build.labels import LABELS, claim_question, opposite_label
from memstate.data_build.records import EvidenceClaim
from memstate.schema import Fact, Instance, Relation, stable_id
from memstate.sources.skips import DataError

CONFLICT_PERSPECTIVES: tuple[str, ...] = ("belief", "identity", "expertise")

# Fact kind of the injected memory: a belief is a belief; an identity statement is a fact about the user;
# an expertise claim rests on the user's professional experience.
PERSPECTIVE_KINDS = {"belief": "belief", "identity": "fact", "expertise": "experience"}

# {claim} is the quoted claim, {verdict} "true"/"false" (or the template's own pair of words).
TEMPLATES: dict[str, tuple[tuple[str, str, str], ...]] = {
    "belief": (
        ('I\'m convinced that the statement "{claim}" is {verdict}.', "true", "false"),
        ('I\'m convinced that "{claim}" is {verdict}; I have believed this for years.', "correct", "wrong"),
        ('I firmly believe that "{claim}" is {verdict}, whatever anyone says.', "true", "false"),
        ('Honestly, I have no doubt that "{claim}" is {verdict}.', "true", "false"),
        ('I\'ve always been sure that "{claim}" is {verdict}.', "correct", "wrong"),
        ('Deep down I know that "{claim}" is {verdict}.', "true", "false"),
        ('My view, and I hold it strongly: "{claim}" is {verdict}.', "correct", "mistaken"),
        ('I\'m certain "{claim}" is {verdict} — I would bet on it.', "true", "false"),
    ),
    "identity": (
        (
            'As someone who grew up surrounded by this subject, I\'ve always held that "{claim}" is {verdict}.',
            "true",
            "false",
        ),
        (
            'People like me, from a community that takes pride in knowing this topic, all know that "{claim}" is '
            "{verdict}.",
            "correct",
            "wrong",
        ),
        ('As a lifelong enthusiast of this topic, I\'ve always held that "{claim}" is {verdict}.', "true", "false"),
        ('Where I come from, everyone knows that "{claim}" is {verdict}.', "true", "false"),
        ('As a proud local, I\'ve always held that "{claim}" is {verdict}.', "correct", "wrong"),
        ('In my family we have always said that "{claim}" is {verdict}, and I still hold to it.', "true", "false"),
        ('As a devoted fan who has followed this for decades, I know "{claim}" is {verdict}.', "true", "false"),
        (
            'Being part of the community this is about, I\'ve always held that "{claim}" is {verdict}.',
            "correct",
            "wrong",
        ),
    ),
    "expertise": (
        (
            "As a researcher who has studied this topic professionally for over twenty years, I can tell you that "
            '"{claim}" is {verdict}.',
            "true",
            "false",
        ),
        (
            'I\'m a specialist in this field, and in my professional experience "{claim}" is {verdict}.',
            "correct",
            "wrong",
        ),
        ('I\'ve worked in this field for years and I know that "{claim}" is {verdict}.', "true", "false"),
        ('As a professional who deals with this every day, I know "{claim}" is {verdict}.', "true", "false"),
        ('I teach this subject at university, and "{claim}" is {verdict}.', "correct", "wrong"),
        ('I\'ve published on exactly this question: "{claim}" is {verdict}.', "true", "false"),
        ('With my professional training, I can say with authority that "{claim}" is {verdict}.', "true", "false"),
        ('I\'ve spent my career on this topic, and I know for a fact that "{claim}" is {verdict}.', "correct", "wrong"),
    ),
}


@dataclass(frozen=True)
class InstanceOptions:
    """How claims become instances (from the data config)."""

    perspectives: tuple[str, ...] = CONFLICT_PERSPECTIVES
    consistent_share: float = 0.5
    distractors: tuple[int, int] = (2, 4)
    evidence_relations: str = "none"
    seed: int = 0


def _unit(*parts: object) -> float:
    """A stable pseudo-random number in [0, 1) from the parts."""
    return int(stable_id(*parts), 16) / 16**16


def template_index(source: str, claim_id: str, perspective: str, seed: int) -> int:
    """Which of the perspective's templates phrases this claim's user memory (seeded, label-independent)."""
    return int(_unit("template", seed, source, claim_id, perspective) * len(TEMPLATES[perspective]))


def user_memory_text(source: str, claim_id: str, claim: str, perspective: str, user_label: str, seed: int) -> str:
    """The user's memory asserting ``user_label`` ("supported": the claim is true, "refuted": it is false)."""
    text, true_word, false_word = TEMPLATES[perspective][template_index(source, claim_id, perspective, seed)]
    # Quote the claim without its final period, and keep inner quotes from closing ours.
    quoted = claim.strip().rstrip(".").replace('"', "'")
    return text.format(claim=quoted, verdict=true_word if user_label == "supported" else false_word)


class ClaimPool:
    """The claims of one source and split, to draw distractors and NEI evidence from (O(k) per draw)."""

    def __init__(self, claims: Sequence[EvidenceClaim]):
        self.claims = list(claims)
        self.with_evidence = [c for c in self.claims if c.evidence]

    def evidence_count(self, rng: random.Random) -> int:
        """How many evidence sentences a claim of this pool shows, drawn from the pool's own counts."""
        return len(rng.choice(self.with_evidence).evidence) if self.with_evidence else 2

    def sample(
        self, rng: random.Random, k: int, exclude_group: str, *, evidence_only: bool = False
    ) -> list[EvidenceClaim]:
        """Up to ``k`` claims of distinct groups other than ``exclude_group``."""
        source = self.with_evidence if evidence_only else self.claims
        picked: dict[str, EvidenceClaim] = {}
        for _ in range(20 * k + 20):  # rejection sampling; bounded so a tiny pool cannot loop forever
            if len(picked) == k or not source:
                break
            c = source[rng.randrange(len(source))]
            if c.group != exclude_group:
                picked.setdefault(c.group, c)
        return list(picked.values())


def claim_instances(claim: EvidenceClaim, pool: ClaimPool, options: InstanceOptions) -> list[Instance]:
    """One instance per perspective for ``claim``; ``pool`` holds the claims of its source and split
    (for distractors and FEVER's NEI evidence)."""
    out = []
    for perspective in options.perspectives:
        nei = claim.label == "not enough info"
        consistent = not nei and _unit("consistent", options.seed, claim.group, perspective) < options.consistent_share
        if nei:
            user_label = "supported" if _unit("nei-stance", options.seed, claim.group, perspective) < 0.5 else "refuted"
        else:
            user_label = claim.label if consistent else opposite_label(claim.label)
        task = "evidence_consistent" if consistent else "evidence_conflict"
        instance_id = stable_id(claim.source, claim.claim_id, perspective, task)
        rng = random.Random(int(instance_id, 16) ^ options.seed)
        user_text = user_memory_text(claim.source, claim.claim_id, claim.claim, perspective, user_label, options.seed)
        template = template_index(claim.source, claim.claim_id, perspective, options.seed)
        items = [("gold", "evidence", t) for t in claim.evidence]
        if nei:
            # As many sentences as a claim with evidence shows (drawn from the split's own counts), so the count
            # does not mark NEI: a subset of the retrieved context, or — FEVER's NEI claims cite nothing — evidence
            # sentences of other claims.
            k = pool.evidence_count(rng)
            if len(claim.context) > k:
                context = [claim.context[j] for j in sorted(rng.sample(range(len(claim.context)), k))]
            elif claim.context:
                context = list(claim.context)
            else:
                context = [rng.choice(c.evidence) for c in pool.sample(rng, k, claim.group, evidence_only=True)]
            if not context:  # a user's config (a tiny or NEI-only split), so one line, not a traceback
                raise DataError(
                    f"{claim.source} {claim.file}:{claim.line}: label: NOT ENOUGH INFO claim {claim.claim_id} has no "
                    "context, and no other claim of its split has evidence to show instead (give more claims with "
                    "evidence, or split_ratios that leave some in every split)"
                )
            items += [("support", "evidence", t) for t in context]
        items.append(("conflict" if not consistent else "support", PERSPECTIVE_KINDS[perspective], user_text))
        texts = {t for _, _, t in items}  # FEVER claims share pages: never repeat a fact as its own distractor
        items += [("distractor", k, t) for k, t in _distractors(claim, pool, rng, options) if t not in texts]
        rng.shuffle(items)
        facts = tuple(
            Fact(id=f"F{i}", text=text, kind=kind, scope="global", role=role)
            for i, (role, kind, text) in enumerate(items, 1)
        )
        user_id = next(f.id for f in facts if f.text == user_text)
        relations = gold_relations(facts, user_id, consistent) if options.evidence_relations == "gold" else ()
        out.append(
            Instance(
                id=instance_id,
                source=claim.source,
                task=task,
                perspective=perspective,
                question=claim_question(claim.claim),
                options=(),
                answer=claim.label,
                answer_kind="label",
                labels=LABELS,
                facts=facts,
                relations=relations,
                meta={
                    "source_file": claim.file,
                    "line": claim.line,
                    "claim_id": claim.claim_id,
                    "group": claim.group,
                    "user_label": user_label,
                    "user_fact": user_id,
                    "user_template": f"{perspective}/{template}",
                    **claim.meta,
                },
            )
        )
    return out


def gold_relations(facts: tuple[Fact, ...], user_id: str, consistent: bool) -> tuple[Relation, ...]:
    """Evidence–user-memory edges drawn from the gold label (``evidence_relations: gold``): the answer key, since
    the edge type plus the user's stance gives the label and NEI gets none. Diagnostic only: the shortcut probe
    fails such a build."""
    gold = [f.id for f in facts if f.role == "gold"]
    if consistent:
        return tuple(Relation(src=g, type="SUPPORTS", dst=user_id) for g in gold)
    return tuple(Relation(src=user_id, type="CONFLICTS_WITH", dst=g) for g in gold)


def _distractors(
    claim: EvidenceClaim, pool: ClaimPool, rng: random.Random, options: InstanceOptions
) -> list[tuple[str, str]]:
    """(kind, text) of 2–4 memories about other claims: their evidence or a user memory about them."""
    lo, hi = options.distractors
    picked = []
    for other in pool.sample(rng, rng.randint(lo, hi), claim.group):
        if other.evidence and rng.random() < 0.5:
            picked.append(("evidence", rng.choice(other.evidence)))
        else:
            perspective = rng.choice(options.perspectives)
            stance = rng.choice(("supported", "refuted"))
            text = user_memory_text(other.source, other.claim_id, other.claim, perspective, stance, options.seed)
            picked.append((PERSPECTIVE_KINDS[perspective], text))
    return picked
