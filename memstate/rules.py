"""Parse and validate a reasoning state: the one parser used by reward, serve and evaluate alike."""

from __future__ import annotations

import re
from dataclasses import dataclass

MIN_RULES = 2
MAX_RULES = 4
MAX_WORDS = 80

CUT_OFF = "cut off at the token limit before the state ended"
_THINK = re.compile(r"<think>.*?</think>", re.DOTALL)


@dataclass(frozen=True)
class State:
    """A well-formed reasoning state: 2–4 rules (without their '- ' markers)."""

    rules: tuple[str, ...]

    @property
    def text(self) -> str:
        return "\n".join(f"- {r}" for r in self.rules)

    @property
    def words(self) -> int:
        return sum(len(r.split()) for r in self.rules)


@dataclass(frozen=True)
class FormatError:
    """Why a policy output is not a reasoning state."""

    reason: str


def strip_think(text: str) -> str:
    """Remove ``<think>…</think>`` blocks; an unclosed ``<think>`` means no state was written.

    >>> strip_think("<think>hmm</think>\\n- Use F1.")
    '\\n- Use F1.'
    """
    text = _THINK.sub("", text)
    if "<think>" in text:
        return text[: text.index("<think>")]
    return text.replace("</think>", "")


def parse_state(text: str) -> State | FormatError:
    """Parse a policy output into a ``State`` or say why it is not one.

    >>> parse_state("- Trust the evidence F1 over belief F2.\\n- Ignore the user's stance.")
    State(rules=('Trust the evidence F1 over belief F2.', "Ignore the user's stance."))
    >>> parse_state("- Only one rule here.")
    FormatError(reason='1 rule(s); a state has 2 to 4')
    >>> parse_state("Sure! Here are rules:\\n- A rule.\\n- Another one.")
    FormatError(reason="line 1 does not start with '- '")
    """
    if not isinstance(text, str):
        return FormatError(f"expected text, got {type(text).__name__}")
    lines = [line.strip() for line in strip_think(text).strip().splitlines()]
    lines = [line for line in lines if line]
    if not lines:
        return FormatError("empty state")
    rules = []
    for n, line in enumerate(lines, 1):
        if not line.startswith("- "):
            return FormatError(f"line {n} does not start with '- '")
        rule = line[2:].strip()
        if not any(ch.isalpha() for ch in rule):
            return FormatError(f"rule {n} has no words")
        rules.append(rule)
    if not MIN_RULES <= len(rules) <= MAX_RULES:
        return FormatError(f"{len(rules)} rule(s); a state has {MIN_RULES} to {MAX_RULES}")
    state = State(tuple(rules))
    if state.words > MAX_WORDS:
        return FormatError(f"{state.words} words; a state has at most {MAX_WORDS}")
    return state


def parse_completion(text: str, *, cut_off: bool) -> State | FormatError:
    """``parse_state`` for a policy output that may have hit its token limit: one that did (generation stopped at
    ``max_completion_length`` / ``max_tokens`` instead of at an end-of-sequence token) is not a state, whatever its
    text. It is unfinished (its last rule may stop mid-sentence), and if such text could pass, never stopping would
    be a way around the rule-count check. Reward, evaluation and the serve API all use this.

    >>> parse_completion("- Use F1.\\n- Ignore F2.", cut_off=False)
    State(rules=('Use F1.', 'Ignore F2.'))
    >>> parse_completion("- Use F1.\\n- Ignore F2 unless the", cut_off=True)
    FormatError(reason='cut off at the token limit before the state ended')
    """
    return FormatError(CUT_OFF) if cut_off else parse_state(text)
