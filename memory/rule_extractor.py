"""A rule-based extractor: no model, deterministic, the embedded default and the baseline to beat.

- **Facts**: each sentence of a user turn that speaks in the first person and carries a cue becomes one fact,
  the sentence itself as text and verbatim quote. Cues, first match wins: preference (a liking verb near "I",
  "favourite", "fan of", "gone off", …), constraint ("allergic", "I can't eat", "I must", "my budget", …), belief
  ("I think", "I believe", "in my opinion", …), experience (a past-tense event verb near "I", "last weekend",
  "yesterday", …), fact ("I am", "I live", "my … is", …). Questions and requests ("could you…", "I would like
  to…") are skipped, and so is a sentence already stored word for word as a current fact.
- **Scope**: situation ("today", "right now", "this trip"), task ("for this project"), domain ("at work", "when it
  comes to"), else global.
- **Relations**: the one relation rule (``memory.relation_rule``): a sentence saying its speaker's view changed
  (``revises``) SUPERSEDES the nearest earlier, still current statement of the same person about the same thing
  (earlier in the session or among the stored facts the store passes as context; chained updates read F9 → F5 →
  F1), and a one-sentence claim (fact, belief, experience) CONFLICTS_WITH the nearest earlier one of the same person
  about the same thing when exactly one of the two is negated. ``embedder`` (optional) makes the same-thing test a
  cosine ≥ ``threshold`` instead of shared topic words (``topic``: the sentence's content words, stop words and cue
  words removed, plural "s" stripped).
- **No cap here**: every cue sentence is proposed; a session with more facts than one may commit is split by the
  store (``memory.commit``), so none is dropped without a word.
- **Concepts**: the first two topic words of each fact (four letters or more) name its concepts; unknown names are
  CREATEd as roots. The rules never MERGE or SPLIT.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import replace

from memstate.embedding import Embedder
from memstate.memory.records import (
    ConceptEdit,
    FactProposal,
    Proposal,
    RelationProposal,
    StoredFact,
    Turn,
)

_SENTENCE = re.compile(r"[^.!?\n]+[.!?]*")
_MAX_SENTENCE_CHARS = 400
_FIRST_PERSON = re.compile(r"\b(?:i|i'm|i've|i'd|i'll|me|my|mine|we|we're|we've|our)\b")
_REQUEST = re.compile(
    r"^\s*(?:could|can|would|will) you\b|^\s*please\b|\b(?:i would like|i'd like|i want you|help me|let me know|"
    r"tell me|can you|could you|i'm looking for|i am looking for|i'm wondering|i was wondering)\b"
)
_I = r"\b(?:i|i'm|i've|i'd|we|we're|we've)\s+"
_LIKING = re.compile(
    _I + r"(?:(?!(?:would|could|should|feel|felt|look|looked|seem|seemed|sound|sounded)\b)[\w']+\s+){0,3}"
    r"(?:lov(?:e|es|ed|ing)|lik(?:e|es|ed|ing)|enjoy(?:s|ed|ing)?|prefer(?:s|red|ring)?|ador(?:e|es|ed|ing)|"
    r"hat(?:e|es|ed|ing)|dislik(?:e|es|ed|ing)|detest(?:s|ed|ing)?|loath(?:e|es|ed|ing)|appreciat(?:e|es|ed|ing))\b"
)
_PREFERENCE = re.compile(
    r"\b(?:favou?rites?|fan of|can'?t stand|cannot stand|gone off|fond of|keen on|sick of|tired of|crazy about|"
    r"passionate about|obsessed with|drawn to|soft spot for|leaning (?:towards?|in that direction)|"
    r"(?:i'd|i would) rather|(?:i'm|i am) (?:really |not |no longer )?into)\b"
)
_CONSTRAINT = re.compile(
    r"\b(?:allergic|intolerant|i can'?t (?:eat|drink|have|afford|travel|do)|i cannot (?:eat|drink|have|afford)|"
    r"i must|i have to|i need to|i'm not allowed|i am not allowed|i avoid|(?:i'm|i am) (?:a )?(?:vegan|vegetarian)|"
    r"my budget|no more than|at most|i never)\b"
)
_BELIEF = re.compile(
    r"\b(?:i (?:really |honestly |strongly |still )?(?:think|believe|reckon|suspect|doubt|guess)|"
    r"i don'?t (?:think|believe)|i do not (?:think|believe)|i feel that|(?:i'm|i am) (?:sure|convinced|certain)|"
    r"in my (?:opinion|view)|as far as i know)\b"
)
_EXPERIENCE = re.compile(
    _I + r"(?:[\w']+\s+){0,2}(?:went|visited|tried|attended|started|finished|ran|joined|bought|moved|met|took|spent|"
    r"saw|watched|read|learned|learnt|cooked|made|got|had|travell?ed|won|lost|played|adopted|signed|booked|"
    r"completed|quit|left|built|wrote)\b|\b(?:last (?:week|weekend|month|year|night|summer|winter|spring|autumn)|"
    r"yesterday|recently|(?:days|weeks|months|years) ago)\b"
)
_FACT = re.compile(
    r"\b(?:i am|i'm|i live|i work|i have|i've got|i own|i study|i was born|i grew up|i speak|i use|i drive|"
    r"my \w+(?: \w+)? (?:is|are|was|were))\b"
)
_NEGATION = re.compile(
    r"\b(?:not|no|never|don't|doesn't|didn't|isn't|aren't|wasn't|weren't|can't|cannot|won't|no longer|neither|nor|"
    r"hardly|doubt|false|wrong|myth)\b|n't\b"
)
# Cues that a statement revises an earlier view of the speaker (``change_score``; see ``memory.relation_rule``).
_REVISION_STRONG = re.compile(
    r"\b(?:no longer|anymore|changed my mind|change of heart|rethinking|from now on|used to|these days|nowadays|"
    r"(?:i'd|i would)(?: much)? rather|i'm done with|moved away from|shifting gears|"
    r"(?:i've|i have) (?:stopped|given up|switched))\b"
)
REVISION_SCORE = 2  # a statement revises when its cues score this much: one strong cue or two weak ones
_REVISION_WEAK = re.compile(r"\b(?:now|actually|lately|prefer|i want to|i've been thinking|completely)\b")
_SITUATION = re.compile(
    r"\b(?:today|tonight|tomorrow|this (?:morning|evening|afternoon|weekend|week|time|trip)|right now|"
    r"at the moment|for now)\b"
)
_TASK = re.compile(r"\bfor (?:this|the|my) (?:project|task|report|assignment|presentation|decision|proposal)\b")
_DOMAIN = re.compile(r"\b(?:at work|for work|when it comes to|in my job|professionally|in the kitchen)\b")
_WORD = re.compile(r"[a-z][a-z'-]+")
_STOP = frozenset(
    """a about above after again against all also am an and any are as at be because been before being below between
    both but by can could did do does doing down during each few for from further had has have having he her here hers
    him his how i if in into is it its itself just let me more most my myself no nor not now of off on once only or
    other our ours out over own same she should so some such than that the their them then there these they this those
    through to too under until up very was we were what when where which while who whom why will with would you your
    i'm i've i'd i'll don't doesn't didn't can't won't isn't aren't wasn't it's that's there's really actually
    honestly definitely absolutely still anymore lately longer though thing things lot much many always usually
    generally think believe reckon suspect doubt guess feel sure convinced certain opinion view love loves loved
    like likes liked enjoy enjoys enjoyed prefer prefers preferred adore hate hates hated dislike dislikes disliked
    detest loathe appreciate favourite favorite fan fond keen rather gone into kind sort bit quite pretty better best
    go going get getting got one ones something anything everything someone time times way day days year years
    say said know knew want wanted need needed must never also even well back these avoid eat drink last weekend
    week month ago recently yesterday today tonight tomorrow""".split()
)


def sentences(text: str) -> list[str]:
    """The sentences of a turn, each a verbatim slice of it (no trailing whitespace).

    >>> sentences("I love tea. Do you?\\nMy cat is Pepper")
    ['I love tea.', 'Do you?', 'My cat is Pepper']
    """
    return [s for s in (m.group().strip() for m in _SENTENCE.finditer(text)) if s]


def _low(text: str) -> str:
    return text.lower().replace("’", "'").replace("‘", "'")


def fact_kind(sentence: str) -> str | None:
    """The kind of a user sentence, or None when it states nothing about the user.

    >>> [fact_kind(s) for s in ("I love spicy food.", "I'm allergic to nuts.", "I don't think coffee is bad.",
    ...     "I ran a marathon last year.", "I live in Leeds.", "Could you suggest a dish?", "The sky is blue.")]
    ['preference', 'constraint', 'belief', 'experience', 'fact', None, None]
    """
    low = _low(sentence)
    if low.rstrip().endswith("?") or _REQUEST.search(low) or not _FIRST_PERSON.search(low):
        return None
    for kind, cue in (
        ("preference", _LIKING),
        ("preference", _PREFERENCE),
        ("constraint", _CONSTRAINT),
        ("belief", _BELIEF),
        ("experience", _EXPERIENCE),
        ("fact", _FACT),
    ):
        if cue.search(low):
            return kind
    return None


def change_score(text: str) -> int:
    """2 per distinct strong revision cue, 1 per distinct weak one, questions left out ("Any news lately?").

    >>> change_score("I used to love tea, but lately I prefer coffee."), change_score("Actually, I went out.")
    (4, 1)
    >>> change_score("Have you painted lately? I no longer paint.")
    2
    """
    low = " ".join(s for s in sentences(_low(text)) if not s.endswith("?"))
    return 2 * len(set(_REVISION_STRONG.findall(low))) + len(set(_REVISION_WEAK.findall(low)))


def revises(text: str) -> bool:
    """Whether a statement says that its speaker's view changed: first person, and cues scoring ``REVISION_SCORE``
    (why these cues: ``memory.relation_rule``).

    >>> revises("I've changed my mind about jazz."), revises("Actually, I went to a jazz club.")
    (True, False)
    >>> revises("Prices no longer rise.")  # nobody's view
    False
    """
    low = _low(text)
    return bool(_FIRST_PERSON.search(low)) and change_score(low) >= REVISION_SCORE


def scope_of(sentence: str) -> str:
    """The scope a sentence's wording suggests.

    >>> scope_of("Right now I can't eat dairy."), scope_of("At work I prefer tea."), scope_of("I love tea.")
    ('situation', 'domain', 'global')
    """
    low = _low(sentence)
    return "situation" if _SITUATION.search(low) else "task" if _TASK.search(low) else (
        "domain" if _DOMAIN.search(low) else "global"
    )  # fmt: skip


def topic(sentence: str) -> tuple[str, ...]:
    """Content words in order, de-duplicated, crude plurals stripped.

    >>> topic("I really love green teas in the morning!")
    ('green', 'tea', 'morning')
    """
    words = []
    for w in _WORD.findall(_low(sentence)):
        w = w.strip("'-")
        if w.endswith("'s"):
            w = w[:-2]
        if len(w) > 3 and w.endswith("s") and not w.endswith(("ss", "us", "is")):
            w = w[:-1]
        if len(w) > 2 and w not in _STOP:
            words.append(w)
    return tuple(dict.fromkeys(words))


def negated(sentence: str) -> bool:
    return bool(_NEGATION.search(_low(sentence)))


class RuleExtractor:
    """See the module docstring. ``embedder`` (optional) makes the relation rule's same-thing test a cosine ≥
    ``threshold``."""

    relation_rule = "relations-v1"  # memory.relation_rule.RELATION_RULE_VERSION (imported late: it imports this)

    def __init__(self, embedder: Embedder | None = None, *, threshold: float | None = None) -> None:
        self.embedder = embedder
        self.threshold = threshold

    def propose(self, turns: Sequence[Turn], context: Sequence[StoredFact]) -> Proposal:
        from memstate.memory.relation_rule import COSINE, Said, needs_vectors, relate, stance_kinds, stored_person

        found = [
            (i, s, kind)
            for i, turn in enumerate(turns)
            if turn.role == "user"
            for s in sentences(turn.content)
            if len(s) <= _MAX_SENTENCE_CHARS and (kind := fact_kind(s))
        ]
        said = [Said(f.id, stored_person(f), -1, f.quote, new=False, kind=f.kind, current=f.current) for f in context]
        # Said before (a current stored fact, or earlier in this session): nothing new.
        known_texts = {_low(f.text).strip() for f in context if f.current}
        known = {c for f in context for c in f.concepts}
        facts: list[FactProposal] = []
        concepts: list[ConceptEdit] = []
        for turn, sentence, kind in found:
            norm = _low(sentence).strip()
            if norm in known_texts:
                continue
            known_texts.add(norm)
            ref = f"n{len(facts) + 1}"
            words = topic(sentence)
            names = tuple(w for w in words if len(w) >= 4)[:2]
            for name in names:
                if name not in known:
                    known.add(name)
                    concepts.append(ConceptEdit("CREATE", name))
            facts.append(FactProposal(ref, sentence, kind, scope_of(sentence), sentence, turn, names))
            said.append(Said(ref, turns[turn].speaker or turns[turn].role, turn, sentence))
        vecs = None
        if self.embedder is not None and needs_vectors(said):
            vecs = self.embedder.encode([s.text for s in said])
        edges = relate(said, vecs, COSINE if self.threshold is None else self.threshold)
        kinds = stance_kinds(edges, said, {f.key: f.kind for f in facts})
        relations = tuple(RelationProposal(said[j].ref, rel, said[i].ref) for j, rel, i in edges)
        facts = [replace(f, kind=kinds[f.key]) for f in facts]
        return Proposal(tuple(facts), tuple(concepts), relations)
