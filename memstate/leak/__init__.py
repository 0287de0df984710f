"""The leak gate: does a reasoning state name an answer? One decision for reward, evaluation and the serve API.

A state is rejected when it names **any** candidate answer, not only the reference one, so the decision is the same
whatever the gold answer is and a penalty tells the policy nothing about the label (a gate that fired only on the
gold answer would be an answer oracle: "mention supported; if not penalised, it is not supported").

Two layers, in order:

1. **Folding** (``memstate.leak.normalize``): Unicode NFKC, invisible characters and accents out, look-alike letters of
   other scripts and digits inside words read as the Latin letters they imitate — so every later rule sees what a
   reader sees;
2. **Lexical rules** (``memstate.leak.lexical``): verdicts in other words, negated, with the claim as subject or
   object, "not enough info" phrasings, verdicts in other languages and scripts, pointing at a memory as the answer;
   option letters in any form, an ordinal on an option/choice/answer, encodings (reversed, Caesar/ROT13, base64/hex,
   spelled letter by letter, split across rules), an option's full text.

The gate claims only what its words can tell from procedure (round 3 of issue 54 dropped the MiniLM semantic check: on
the sets it was not calibrated on it blocked as many legitimate rules as it caught leaks; round 5 anchored plain truth
words to the claim or the answer). On a legitimate set written fresh and measured once it blocked 1.9% of the states
and caught 62.5% of the leaks; the rest is the answer-flow credit's.

Free-text answers have no candidate set: the state must not contain the reference answer's span.
What wording cannot hide is checked by the reward's answer-flow check through the responder
(``memstate.reward.answer_flow``): a state that moves the responder's answer with every memory removed carries
answer content, whatever its words. See docs/reward.md, "Gates", for what the gate can and cannot catch.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from memstate.leak import lexical
from memstate.leak.lexical import normalize
from memstate.leak.normalize import fold, variants
from memstate.schema import Instance, option_letters

__all__ = [
    "CHECKS",
    "Check",
    "first_check",
    "fold",
    "instance_leak_reason",
    "leak_reason",
    "leaks_answer",
    "normalize",
]

_KNOWN_LABELS = frozenset({"supported", "refuted", "not enough info"})


@dataclass(frozen=True)
class Subject:
    """What a check reads besides the state: the candidates, their option letters, the request and the memories."""

    candidates: Sequence[str]
    letters: Sequence[str]
    question: str
    memories: str  # the request and the memories' texts, one string


@dataclass(frozen=True)
class Check:
    """One named rule of the gate: ``fn(text, subject)`` gives a reason or None; it runs on the instances whose
    ``answer_kind`` is in ``applies_to``, on the raw state (``folded`` False) or on each folded variant of it."""

    name: str
    applies_to: frozenset[str]
    fn: Callable[[str, Subject], str | None]
    folded: bool = True


def _label_words(text: str, s: Subject) -> str | None:
    """A label of an unfamiliar label set named outright (the known ones go through the verdict rules)."""
    norm = normalize(text)
    for label in s.candidates:
        lab = normalize(label)
        if lab not in _KNOWN_LABELS and re.search(rf"\b{re.escape(lab)}\b", norm):
            return f"names a candidate: {label!r}"
    return None


_LABEL, _CHOICE = frozenset({"label"}), frozenset({"choice"})
_CLOSED = _LABEL | _CHOICE
# Each check: what it catches; then, after issue 54's round 5, the leaks / legitimate states it was the first to
# reject on all eight red-team and legitimate sets together (benchmarks/results/leak_precision_after.json: 1,104
# leaks, 1,506 legitimate states; all development sets now) and on legit_fresh5 alone, measured once
# before any rule saw it (benchmarks/results/legit_fresh5_gate_once.json: 48 leaks, 208 legitimate states).
CHECKS: tuple[Check, ...] = (
    # a script (CJK, Cyrillic, …) or symbol (emoji) the request and memories do not use: 50 / 0; unseen 1 / 0
    Check("script", _CLOSED, lambda t, s: lexical.script_reason(t, " ".join([s.memories, *s.candidates])), False),
    # a rule in another language than the request's: 49 / 0; unseen 4 / 0
    Check("language", _CLOSED, lambda t, s: lexical.language_reason(t, s.memories), False),
    # a verdict anchored to the claim or the answer (the claim, "it", the user or the evidence its subject, an answer
    # word before it, or alone: "So, refuted."), not under a condition, a denied reason or a definition; a verdict
    # idiom anywhere; "not enough info" said of the claim or its evidence; labels ruled out or two offered as the
    # only choices; a foreign verdict: 262 / 3, precision 0.99 (260 / 3 since issue 59 removed idioms fitted to single
    # fixture sentences); unseen 8 / 1 (0.89)
    Check("verdict", _LABEL, lambda t, s: lexical.label_reason(t)),
    # a label of an unfamiliar label set named outright: 0 / 0 (no set has one)
    Check("label_words", _LABEL, _label_words),
    # the claim restated as a fact: 2 / 0; unseen 0 / 0
    Check("restatement", _LABEL, lambda t, s: lexical.restatement_reason(t, s.question)),
    # a memory pointed at as the answer ("answer as F2 says"): 48 / 0; unseen 0 / 0
    Check("pointing", _CLOSED, lambda t, s: lexical.pointing_reason(t)),
    # a candidate reversed, Caesar-shifted, base64/hex (on word boundaries), spelled letter by letter, split across
    # rules: 74 / 0; unseen 1 / 0
    Check("encoding", _CLOSED, lambda t, s: lexical.encoding_reason(t, s.candidates, s.letters)),
    # an option letter in any form, unless in a range or list of all the letters, compared ("B is no better than
    # C"), cautioned ("D isn't favoured for being last") or inside a word: 112 / 3, precision 0.97; unseen 10 / 2
    # (0.83: position cautions that name a letter as their example)
    Check("letter", _CLOSED, lambda t, s: lexical.letter_reason(t, s.letters)),
    # an ordinal or number on option/choice/answer ("the second option"), unless a caution about the order: 43 / 2,
    # precision 0.96; unseen 5 / 1 (0.83)
    Check("position", _CLOSED, lambda t, s: lexical.position_reason(t, len(s.candidates))),
    # an option's full text, unless quoted from a memory: 13 / 0; unseen 1 / 0
    Check("option_text", _CHOICE, lambda t, s: lexical.option_reason(t, s.candidates)),
)
"""The gate's checks, in the order they run."""


def _contains_span(haystack: list[str], needle: list[str]) -> bool:
    n = len(needle)
    return n > 0 and any(haystack[i : i + n] == needle for i in range(len(haystack) - n + 1))


def _fired(state_text: str, candidates, answer_kind, question, facts):
    """(check name, reason) of each lexical check that rejects ``state_text``, in order, lazily."""
    subject = Subject(candidates, option_letters(len(candidates)), question, " ".join([question, *facts]))
    texts = variants(state_text)
    for check in CHECKS:
        if answer_kind not in check.applies_to:
            continue
        for text in texts if check.folded else (state_text,):
            if reason := check.fn(text, subject):
                yield check.name, reason
                break


def leak_reason(
    state_text: str,
    candidates: Sequence[str],
    answer_kind: str,
    reference: str = "",
    *,
    question: str = "",
    facts: Sequence[str] = (),
) -> str | None:
    """Why ``state_text`` names an answer (the first of ``CHECKS`` that fires, on any folded variant of the state), or
    None. ``candidates``: the closed answer set (labels or options) shown to the responder as lettered options;
    ``reference``: the free-text answer (``answer_kind`` free); ``question`` and ``facts`` (texts): what the responder
    also reads — a rule may use their words and restate a memory. A free-text answer has no candidates: the state
    must not contain the reference answer's span.

    >>> labels = ("supported", "refuted", "not enough info")
    >>> leak_reason("- The claim is false.\\n- Use F1.", labels, "label")
    "states a verdict: 'false'"
    >>> leak_reason("- Choose the second option.\\n- Use F1.", labels, "label")
    "names an answer by position: 'second option'"
    >>> leak_reason("- Respond with B only.\\n- Use F1.", labels, "label")
    "names option letter B: 'Respond with B'"
    >>> leak_reason("- Trust the evidence over the user's belief.\\n- A newer memory replaces an older one.", labels,
    ...             "label") is None
    True
    """
    if answer_kind == "free":
        span = normalize(fold(reference)).split()
        found = any(_contains_span(normalize(v).split(), span) for v in variants(state_text))
        return "contains the reference answer" if found else None
    return next((reason for _, reason in _fired(state_text, candidates, answer_kind, question, facts)), None)


def instance_leak_reason(state_text: str, instance: Instance) -> str | None:
    """Why ``state_text`` names one of ``instance``'s candidate answers (or its free-text answer), or None."""
    return leak_reason(
        state_text,
        instance.candidates,
        instance.answer_kind,
        instance.answer,
        question=instance.question,
        facts=[f.text for f in instance.facts],
    )


def leaks_answer(state_text: str, instance: Instance) -> bool:
    """The gate on an instance: does the state name any of its candidate answers (or its free-text answer)?

    >>> from memstate.schema import Fact
    >>> inst = Instance(id="x", source="fever", task="evidence_conflict", perspective="belief",
    ...     question="Is it true?", options=(), answer="refuted", answer_kind="label",
    ...     labels=("supported", "refuted"), facts=(Fact("F1", "t", "evidence"),), relations=())
    >>> leaks_answer("- Decide whether the claim is supported or refuted.\\n- Ignore F2.", inst)
    True
    >>> leaks_answer("- Decide from the evidence, not the user's claim.\\n- Ignore F2.", inst)
    False
    """
    return instance_leak_reason(state_text, instance) is not None


def first_check(state_text: str, instance: Instance) -> str | None:
    """The name of the first check that rejects ``state_text`` on ``instance`` (a name of ``CHECKS``, or
    ``reference_span`` on a free-text instance), or None: which rule a rejection is owed to."""
    facts = [f.text for f in instance.facts]
    if instance.answer_kind == "free":
        return "reference_span" if leak_reason(state_text, (), "free", instance.answer) else None
    fired = _fired(state_text, instance.candidates, instance.answer_kind, instance.question, facts)
    return next((n for n, _ in fired), None)
