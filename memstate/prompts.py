"""Every prompt the policy and the responder see, in one place.

``PROMPT_VERSION`` is saved in every checkpoint, cache key and report: change it whenever a prompt
changes, so cached baselines and old reports are never mixed with new prompts.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence

from memstate.schema import Fact, Instance, Relation, option_letters

logger = logging.getLogger("memstate.prompts")

# v2: the responder sees the relational state too (the paper's A(q, F_q, R_q, Z_q)).
# v3: a memory's attributes leave out a time the text already shows, and are left out when only the defaults remain.
PROMPT_VERSION = "ms-prompts-v3"
# The policy prompt budget when neither a config nor a checkpoint names one (training, the serve API, evaluation).
DEFAULT_MAX_PROMPT_TOKENS = 8192

Message = dict[str, str]

POLICY_SYSTEM = (
    "You guide an assistant that answers a user's request using the user's long-term memories and "
    "retrieved evidence. Some memories still hold, some were superseded, some are only preferences, and "
    "some conflict with objective evidence. Write a reasoning state: 2 to 4 short imperative rules that tell "
    "the assistant how to use these memories for this request. Each rule is one line starting with '- '. "
    "Use at most 80 words in all. Refer to memories by their ids. Do not answer the request yourself."
)

RESPONDER_SYSTEM = "You are a helpful personal assistant. Answer the user's request using the memories provided."

STATE_HEADER = "Rules for using the memories:"

# The "self-recheck" evaluation condition: no policy, the responder is told to recheck its memories itself, in the
# same place a reasoning state would go (so it is compared with states on equal terms).
SELF_RECHECK_RULES = (
    "Before answering, recheck every memory: does it still hold, was it superseded by a newer one, does it "
    "conflict with the evidence?",
    "Answer only from the memories that still hold and from the evidence.",
)


# A time of day before or after the date ("1:56 pm on 8 May, 2023"; "2023-05-08T13:56:00Z"): a memory's label keeps
# the date, which temporal questions need; the time of day answers almost none and costs a fifth of a short fact's
# tokens.
_TIME_OF_DAY = re.compile(
    r"^\s*\d{1,2}[:.]\d{2}(?:[:.]\d{2})?\s*(?:[ap]\.?m\.?)?\s*(?:on\s+|,\s*)?"
    r"|(?:T|,?\s+(?:at\s+)?)\d{1,2}:\d{2}(?::\d{2}(?:\.\d+)?)?\s*(?:[ap]\.?m\.?|Z|[+-]\d{2}:?\d{2})?\s*$",
    re.IGNORECASE,
)


def date_of(time: str) -> str:
    """``time`` without its time of day (``time`` itself when that would leave nothing).

    >>> date_of("1:56 pm on 8 May, 2023"), date_of("2023-05-08T13:56:00Z"), date_of("May 8, 2023 at 1:56pm")
    ('8 May, 2023', '2023-05-08', 'May 8, 2023')
    >>> date_of("8 May, 2023"), date_of("12:30")
    ('8 May, 2023', '12:30')
    """
    return _TIME_OF_DAY.sub("", time).strip() or time


def format_fact(fact: Fact) -> str:
    """``[F1] (kind, scope, time) text``, without what the text already gives: a time whose date the text shows (a
    stored turn's ``"Caroline (8 May, 2023): "`` label) is left out, and so are the attributes altogether when
    nothing but the defaults (kind ``fact``, scope ``global``) would be left. Every token here is read by both models
    and counted against a retrieval budget (``memory.retrieve``); on LoCoMo the full form cost ~15 tokens a fact. The
    role is never shown.

    >>> format_fact(Fact("F2", "I live in Oslo.", "fact", "global", turn=3, time="2024-05-01", role="outdated"))
    '[F2] (fact, global, 2024-05-01) I live in Oslo.'
    >>> format_fact(Fact("F3", "Ana (8 May, 2023): I ran.", "experience", "global", time="1:56 pm on 8 May, 2023"))
    '[F3] (experience, global) Ana (8 May, 2023): I ran.'
    >>> format_fact(Fact("F4", "Ana (8 May, 2023): Hi!", "fact", "global", time="1:56 pm on 8 May, 2023"))
    '[F4] Ana (8 May, 2023): Hi!'
    """
    time = None if not fact.time or date_of(fact.time) in fact.text else fact.time
    if fact.kind == "fact" and fact.scope == "global" and time is None:
        return f"[{fact.id}] {fact.text}"
    attrs = ", ".join(a for a in (fact.kind, fact.scope, time) if a)
    return f"[{fact.id}] ({attrs}) {fact.text}"


def format_relation(rel: Relation) -> str:
    """``F3 SUPERSEDES F1``.

    >>> format_relation(Relation("F3", "SUPERSEDES", "F1"))
    'F3 SUPERSEDES F1'
    """
    return f"{rel.src} {rel.type} {rel.dst}"


def _request_block(question: str, candidates: Sequence[str]) -> str:
    letters = option_letters(len(candidates))
    options = "\n".join(f"({letter}) {text}" for letter, text in zip(letters, candidates, strict=True))
    return question + (f"\nOptions:\n{options}" if options else "")


def _relations_block(facts: Sequence[Fact], relations: Sequence[Relation]) -> str:
    """``Relations:`` and one edge a line; edges whose ends are not among ``facts`` are left out (facts may have
    been truncated to a token budget).

    >>> print(_relations_block([Fact("F1", "a", "fact"), Fact("F2", "b", "fact")], [Relation("F2", "SUPERSEDES", "F1"),
    ...     Relation("F3", "SUPERSEDES", "F1")]))
    Relations:
    F2 SUPERSEDES F1
    """
    kept = {f.id for f in facts}
    lines = [format_relation(r) for r in relations if r.src in kept and r.dst in kept]
    return "Relations:\n" + ("\n".join(lines) or "(none)")


def policy_request_messages(
    question: str, candidates: Sequence[str], facts: Sequence[Fact], relations: Sequence[Relation]
) -> list[Message]:
    """The policy's chat prompt for a bare request (what the serve API receives): request, facts, relational state."""
    user = (
        f"Request:\n{_request_block(question, candidates)}\n\n"
        "Memories:\n" + "\n".join(format_fact(f) for f in facts) + "\n\n" + _relations_block(facts, relations) + "\n\n"
        "Write 2 to 4 rules, each on its own line starting with '- ', about how to use these memories. "
        "Do not state the answer."
    )
    return [{"role": "system", "content": POLICY_SYSTEM}, {"role": "user", "content": user}]


def policy_messages(instance: Instance, facts: tuple[Fact, ...] | None = None) -> list[Message]:
    """The policy's chat prompt for an instance; ``facts`` overrides ``instance.facts`` (truncated to a budget)."""
    facts = instance.facts if facts is None else facts
    return policy_request_messages(instance.question, instance.candidates, facts, instance.relations)


def fit_policy_prompt(
    tokenizer,
    question: str,
    candidates: Sequence[str],
    facts: Sequence[Fact],
    relations: Sequence[Relation],
    max_tokens: int,
) -> tuple[list[Message], int]:
    """The policy prompt with facts dropped from the end until it fits ``max_tokens`` (the question is never cut).

    Returns the messages and how many facts were dropped. Training and the serve API share it, so a served policy
    sees prompts built exactly as in training. A request whose question alone does not fit keeps one fact (the
    caller's token limits then apply)."""

    def build(n: int) -> list[Message]:
        return policy_request_messages(question, candidates, facts[:n], relations)

    def tokens(n: int) -> int:
        ids = tokenizer.apply_chat_template(build(n), add_generation_prompt=True, tokenize=True, return_dict=False)
        return len(ids)

    if tokens(len(facts)) <= max_tokens:
        return build(len(facts)), 0
    lo, hi = 1, len(facts)  # binary search for the most facts that fit
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if tokens(mid) <= max_tokens:
            lo = mid
        else:
            hi = mid - 1
    return build(lo), len(facts) - lo


def prompt_tokens(tokenizer, instance: Instance, facts=None) -> int:
    messages = policy_messages(instance, facts)
    return len(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False))


def fit_prompt(tokenizer, instance: Instance, max_tokens: int) -> tuple[list[Message], int]:
    """An instance's policy prompt within ``max_tokens`` (facts dropped from the end, never the question) and how
    many facts were dropped; an instance whose question alone does not fit is reported. Training and evaluation
    both build their prompts with it."""
    messages, dropped = fit_policy_prompt(
        tokenizer, instance.question, instance.candidates, instance.facts, instance.relations, max_tokens
    )
    if dropped and prompt_tokens(tokenizer, instance, instance.facts[: len(instance.facts) - dropped]) > max_tokens:
        logger.warning("instance %s: the question alone exceeds %d prompt tokens", instance.id, max_tokens)
    return messages, dropped


def responder_request_messages(
    question: str,
    candidates: Sequence[str],
    facts: Sequence[Fact],
    relations: Sequence[Relation] = (),
    rules: Sequence[str] | None = None,
) -> list[Message]:
    """The responder's prompt for a bare request (what the memory pipeline asks), with or without a state: the
    paper's A(q, F_q, R_q[, Z_q]) — memories, their relational state, the request, then the rules.

    The rules go after everything shared, so every candidate prompt of one instance shares its whole prefix
    with the others and with the baseline prompt (prefix caching in vLLM).
    """
    parts = [
        # No memories at all (the reward's answer-flow check asks so): "(none)", as an empty relation list reads.
        "Memories:\n" + ("\n".join(format_fact(f) for f in facts) or "(none)"),
        _relations_block(facts, relations),
        f"Request:\n{_request_block(question, candidates)}",
    ]
    if rules:
        parts.append(STATE_HEADER + "\n" + "\n".join(f"- {r}" for r in rules))
    parts.append("Answer with the letter of the correct option only." if candidates else "Answer briefly.")
    return [{"role": "system", "content": RESPONDER_SYSTEM}, {"role": "user", "content": "\n\n".join(parts)}]


def responder_messages(instance: Instance, rules: tuple[str, ...] | None = None) -> list[Message]:
    """The responder's prompt for an instance (its closed answer set as lettered options), with or without rules."""
    return responder_request_messages(instance.question, instance.candidates, instance.facts, instance.relations, rules)
