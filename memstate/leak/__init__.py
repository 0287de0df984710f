"""The leak gate: does a reasoning state name an answer? One decision for reward, evaluation and the serve API.

A state is rejected when it names **any** candidate answer, not only the reference one, so the decision is the same
whatever the gold answer is and a penalty tells the policy nothing about the label (a gate that fired only on the
gold answer would be an answer oracle: "mention supported; if not penalised, it is not supported").

Three layers, in order:

1. **Folding** (``memstate.leak.normalize``): Unicode NFKC, invisible characters and accents out, look-alike letters of
   other scripts and digits inside words read as the Latin letters they imitate — so every later rule sees what a
   reader sees;
2. **Lexical rules** (``memstate.leak.lexical``): verdicts in other words, negated, with the claim as subject or
   object, "not enough info" phrasings, verdicts in other languages and scripts, pointing at a memory as the answer;
   option letters in any form, positions in any phrasing, hints at the answer's shape or spelling, encodings
   (reversed, Caesar/ROT13, base64/hex, spelled out, split across rules), an option's text or a word only it has;
3. **Semantic check** (``memstate.leak.semantic``): each rule compared by sentence embedding with verdict statements
   (label instances) or with the options against the memories (choice instances), for what no word list covers.

Free-text answers have no candidate set: the state must not contain the reference answer's span.
What wording cannot hide is checked by the reward's answer-flow check through the responder
(``memstate.reward.answer_flow``): a state that moves the responder's answer with every memory removed carries
answer content, whatever its words. See docs/reward.md, "Gates", for what the gate can and cannot catch.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from memstate.leak import lexical, semantic
from memstate.leak.lexical import normalize
from memstate.leak.normalize import fold, variants
from memstate.schema import Instance, option_letters

__all__ = ["leak_reason", "instance_leak_reason", "leaks_answer", "normalize", "fold"]

_KNOWN_LABELS = frozenset({"supported", "refuted", "not enough info"})


def _label_words(text: str, labels: Sequence[str]) -> str | None:
    """A label of an unfamiliar label set named outright (the known ones go through the verdict rules)."""
    for label in labels:
        norm = normalize(label)
        if norm not in _KNOWN_LABELS and re.search(rf"\b{re.escape(norm)}\b", text):
            return f"names a candidate: {label!r}"
    return None


def _contains_span(haystack: list[str], needle: list[str]) -> bool:
    n = len(needle)
    return n > 0 and any(haystack[i : i + n] == needle for i in range(len(haystack) - n + 1))


def lexical_reason(
    state_text: str,
    candidates: Sequence[str],
    answer_kind: str,
    reference: str = "",
    question: str = "",
    facts: Sequence[str] = (),
) -> str | None:
    """Why the lexical rules reject ``state_text`` (on every folded variant of it), or None."""
    if answer_kind == "free":
        span = normalize(fold(reference)).split()
        found = any(_contains_span(normalize(v).split(), span) for v in variants(state_text))
        return "contains the reference answer" if found else None
    memories = " ".join([question, *facts])
    if reason := lexical.script_reason(state_text, " ".join([memories, *candidates])):
        return reason
    if reason := lexical.language_reason(state_text, memories):
        return reason
    letters = option_letters(len(candidates))
    for text in variants(state_text):
        reason = (
            (
                answer_kind == "label"
                and (
                    lexical.label_reason(text)
                    or _label_words(normalize(text), candidates)
                    or lexical.restatement_reason(text, question)
                )
            )
            or lexical.pointing_reason(text)
            or lexical.encoding_reason(text, candidates, letters)
            or lexical.shape_reason(text)
            or lexical.letter_reason(text, letters)
            or lexical.position_reason(text, len(candidates))
            or (answer_kind == "choice" and lexical.option_reason(text, candidates, memories))
        )
        if reason:
            return reason
    return None


def leak_reason(
    state_text: str,
    candidates: Sequence[str],
    answer_kind: str,
    reference: str = "",
    *,
    question: str = "",
    facts: Sequence[str] = (),
    semantic_check: bool = True,
) -> str | None:
    """Why ``state_text`` names an answer (a short reason), or None. ``candidates``: the closed answer set (labels or
    options) shown to the responder as lettered options; ``reference``: the free-text answer (``answer_kind`` free);
    ``question`` and ``facts`` (texts): what the responder also reads — a rule may use their words and restate a
    memory, and the semantic check tells a restated memory from a named option by them.

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
    reason = lexical_reason(state_text, candidates, answer_kind, reference, question, facts)
    if reason or not semantic_check or answer_kind == "free":
        return reason
    return semantic.semantic_reason(fold(state_text), candidates, answer_kind, facts)


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
