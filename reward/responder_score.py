"""Score(A(q, M_q[, Z]), y*): how well the frozen responder answers one prompt, in one of two modes.

**likelihood** (dense): Score = the responder's probability of y*.
- Closed sets (``label``, ``choice``): the responder prompt shows the candidates as lettered options, so the
  answer is one token; Score = P(correct letter) renormalized over the option letters.
- Free text: the reference answer is appended to the prompt as the assistant's reply and teacher-forced;
  Score = exp(mean token log-prob) over its tokens — the geometric-mean per-token probability, so long and short
  references are comparable (a plain product would punish every extra token).

**exact** (as in the paper): the responder generates at temperature 0 and the answer is scored per
``answer_kind``: the option letter (or option text) for closed sets → {0, 1}; SQuAD token F1 for free text.

A judgement is ``None`` when the responder could not answer that prompt (HTTP backend, retries exhausted).

``responder_request`` is the one description of a call: what is sent and what the reply is scored against. The
judgements send it, and the baseline cache (``reward/cache.py``) hashes it as the key, so a change to the prompt, the
scored continuations or the decoding changes the key with it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from memstate.reward.score import compute_score, continuation_probability, option_probability

from memstate.prompts import responder_messages
from memstate.responders import Responder
from memstate.schema import Instance, option_letters

MODES = ("likelihood", "exact")
EXACT_MAX_NEW_TOKENS = 16  # a letter, or a short free answer


@dataclass(frozen=True)
class ResponderRequest:
    """One responder call for (instance, rules): the chat ``messages``; in likelihood mode the scored
    ``continuations``, in exact mode greedy decoding of at most ``max_new_tokens``; the ``reference`` the reply is
    scored against (not sent, yet it decides the score)."""

    mode: str
    messages: list[dict]
    reference: str
    continuations: list[str] | None = None
    max_new_tokens: int | None = None

    def key(self) -> dict:
        """Everything the judgement depends on besides the responder, as the cache hashes it."""
        request: dict = {"mode": self.mode, "messages": self.messages, "reference": self.reference}
        if self.mode == "likelihood":
            request["continuations"] = self.continuations
        else:
            request["decoding"] = {"greedy": True, "max_new_tokens": self.max_new_tokens}
        return request


def responder_request(instance: Instance, rules: tuple[str, ...] | None, mode: str) -> ResponderRequest:
    """The call that scores ``instance`` answered with ``rules`` (None: the no-state baseline prompt)."""
    if mode not in MODES:
        raise ValueError(f"unknown score mode {mode!r}; expected one of {list(MODES)}")
    closed = bool(instance.candidates)
    request = ResponderRequest(
        mode, responder_messages(instance, rules), instance.answer_letter if closed else instance.answer
    )
    if mode == "likelihood":
        return replace(request, continuations=option_letters(len(instance.candidates)) if closed else [instance.answer])
    return replace(request, max_new_tokens=EXACT_MAX_NEW_TOKENS)


@dataclass(frozen=True)
class Judgement:
    """Score in [0, 1]; ``answer`` is the responder's answer (the most likely option letter in likelihood mode,
    its generated text in exact mode; None for likelihood-mode free text); ``correct`` = the answer is y*."""

    score: float
    correct: bool | None
    answer: str | None = None


def judge(
    responder: Responder, instances: list[Instance], rules: list[tuple[str, ...] | None], mode: str
) -> list[Judgement | None]:
    """Score each (instance, rules) pair; ``rules=None`` is the no-state baseline prompt."""
    if mode == "likelihood":
        return likelihood_judgements(responder, instances, rules)
    if mode == "exact":
        return exact_judgements(responder, instances, rules)
    raise ValueError(f"unknown score mode {mode!r}; expected one of {list(MODES)}")


def likelihood_judgements(
    responder: Responder, instances: list[Instance], rules: list[tuple[str, ...] | None]
) -> list[Judgement | None]:
    requests = [responder_request(inst, r, "likelihood") for inst, r in zip(instances, rules, strict=True)]
    results = responder.answer_logprob([q.messages for q in requests], [q.continuations for q in requests])
    judgements: list[Judgement | None] = []
    for inst, lps in zip(instances, results, strict=True):
        if lps is None:
            judgements.append(None)
        elif inst.candidates:
            logprobs = [lp.logprob for lp in lps]
            letters = option_letters(len(inst.candidates))
            correct = letters.index(inst.answer_letter)
            best = max(range(len(logprobs)), key=logprobs.__getitem__)
            judgements.append(Judgement(option_probability(logprobs, correct), best == correct, letters[best]))
        else:
            judgements.append(Judgement(continuation_probability(*lps[0]), None))
    return judgements


def exact_judgements(
    responder: Responder, instances: list[Instance], rules: list[tuple[str, ...] | None]
) -> list[Judgement | None]:
    requests = [responder_request(inst, r, "exact") for inst, r in zip(instances, rules, strict=True)]
    answers = responder.answer([q.messages for q in requests], max_new_tokens=EXACT_MAX_NEW_TOKENS)
    judgements: list[Judgement | None] = []
    for inst, request, text in zip(instances, requests, answers, strict=True):
        if text is None:
            judgements.append(None)
            continue
        score = compute_score(text, request.reference, inst.candidates)
        judgements.append(Judgement(score, score == 1.0, text.strip()))
    return judgements
