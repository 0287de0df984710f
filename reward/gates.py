"""Gates applied before any responder call: format (``parse_state``) and leakage of the reference answer."""

from __future__ import annotations

import re

from memstate.schema import Instance
from reward.score import normalize_text


def _words(text: str) -> list[str]:
    # Punctuation separates words here ("not-enough" → "not enough"), so hyphenation cannot hide a leak.
    return normalize_text(re.sub(r"[^\w\s]", " ", text)).split()


def _contains_span(haystack: list[str], needle: list[str]) -> bool:
    n = len(needle)
    return n > 0 and any(haystack[i : i + n] == needle for i in range(len(haystack) - n + 1))


def leaks_answer(state_text: str, instance: Instance) -> bool:
    """Does the state give away the reference answer (normalized label, option letter or text, answer span)?

    >>> from memstate.schema import Fact
    >>> inst = Instance(id="x", source="fever", task="evidence_conflict", perspective="belief",
    ...     question="Is it true?", options=(), answer="refuted", answer_kind="label",
    ...     labels=("supported", "refuted"), facts=(Fact("F1", "t", "evidence"),), relations=())
    >>> leaks_answer("- Say the claim is Refuted.\\n- Ignore F2.", inst)
    True
    >>> leaks_answer("- Pick option (B).\\n- Ignore F2.", inst)
    True
    >>> leaks_answer("- Trust the evidence F1 that refutes the belief.\\n- Ignore F2.", inst)
    False
    """
    tokens = _words(state_text)
    if instance.answer_kind == "free":
        return _contains_span(tokens, _words(instance.answer))
    letter = instance.answer_letter
    # The bare letter is matched case-sensitively: "pick a rule" must not count as naming option A.
    letter_patterns = (
        rf"\(\s*(?i:{letter})\s*\)",
        rf"\b(?i:option|answer|letter|choice|pick|choose|select)\s*(?i:is\s*)?:?\s*\(?{letter}\b",
    )
    if any(re.search(p, state_text) for p in letter_patterns):
        return True
    correct_text = instance.candidates[ord(letter) - ord("A")]
    return _contains_span(tokens, _words(correct_text))
