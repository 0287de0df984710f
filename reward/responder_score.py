"""Score(A(q, M_q[, Z]), y*): how well the frozen responder answers one prompt, in one of the registered score modes.

The built-in modes (registered at the end of this module):

**likelihood** (dense): Score = the responder's probability of y*.
- Closed sets (``label``, ``choice``): the responder prompt shows the candidates as lettered options, so the
  answer is one token; Score = P(correct letter) renormalized over the option letters.
- Free text: the reference answer is appended to the prompt as the assistant's reply and teacher-forced;
  Score = exp(mean token log-prob) over its tokens — the geometric-mean per-token probability, so long and short
  references are comparable (a plain product would punish every extra token).

**exact** (as in the paper): the responder generates at temperature 0 and the answer is scored per
``answer_kind``: the option letter (or option text) for closed sets → {0, 1}; SQuAD token F1 for free text.

A judgement is ``None`` when the responder could not answer that prompt (HTTP backend, retries exhausted).

A score mode is a ``ScoreMode``: its ``request`` describes the call for (instance, rules) as a ``ResponderRequest``
(what is sent and what the reply is scored against), its ``judge`` sends a batch of them through the responder's
existing calls (``answer_logprob``, ``answer``; ``greedy_answers`` and ``continuation_logprobs`` send them as the
requests say) and scores the replies; ``likelihood`` says its requests ask for log-probs, so a server must serve
them (``make_responder``'s start-up check sends those then). A mode registers itself with
``register_score_mode(ScoreMode(...))`` in its module: this one, or its own ``memstate.reward.score_mode_<name>``
(every module of the package named so is imported on the first lookup; no list names them), or any module imported
before the mode is used (a plugin, a test). ``score_mode(name)`` looks one up (``ConfigError`` naming the registered
ones otherwise): the stages that score call it where they read their config, so an unknown mode is refused before any
model loads.

``responder_request`` is the one description of a call: the judgements send it, and the baseline cache
(``reward/cache.py``) hashes its ``key()``, so a change to the prompt, the scored continuations or the decoding changes
the key with it.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass

from memstate.prompts import responder_messages
from memstate.registry import Registry
from memstate.responders import ContinuationLogprob, Responder
from memstate.reward.score import compute_score, continuation_probability, option_probability
from memstate.schema import Instance, option_letters

EXACT_MAX_NEW_TOKENS = 16  # a letter, or a short free answer
MODULE_PREFIX = "score_mode_"  # memstate.reward.score_mode_<name>: a module that registers a mode (first lookup)

Rules = tuple[str, ...] | None


@dataclass(frozen=True)
class ResponderRequest:
    """One responder call for (instance, rules): the chat ``messages``; the scored ``continuations`` (log-probs) or
    greedy decoding of at most ``max_new_tokens`` (an answer); the ``reference`` the reply is scored against (not
    sent, yet it decides the score). ``mode`` names the score mode that built it."""

    mode: str
    messages: list[dict]
    reference: str
    continuations: list[str] | None = None
    max_new_tokens: int | None = None

    @classmethod
    def of(
        cls,
        mode: str,
        instance: Instance,
        rules: Rules,
        *,
        continuations: list[str] | None = None,
        max_new_tokens: int | None = None,
    ) -> ResponderRequest:
        """The responder prompt of ``instance`` with ``rules`` (None: the no-state baseline prompt), scored against
        its answer: the option letter for a closed set, the answer text for free text."""
        reference = instance.answer_letter if instance.candidates else instance.answer
        return cls(mode, responder_messages(instance, rules), reference, continuations, max_new_tokens)

    def key(self) -> dict:
        """Everything the judgement depends on besides the responder, as the cache hashes it: ``continuations``
        when the request scores them, ``decoding`` when it generates."""
        request: dict = {"mode": self.mode, "messages": self.messages, "reference": self.reference}
        if self.continuations is not None:
            request["continuations"] = self.continuations
        if self.max_new_tokens is not None:
            request["decoding"] = {"greedy": True, "max_new_tokens": self.max_new_tokens}
        return request


@dataclass(frozen=True)
class Judgement:
    """Score in [0, 1]; ``answer`` is the responder's answer (the most likely option letter in likelihood mode,
    its generated text in exact mode; None for likelihood-mode free text); ``correct`` = the answer is y*."""

    score: float
    correct: bool | None
    answer: str | None = None


@dataclass(frozen=True)
class ScoreMode:
    """``request(instance, rules) -> ResponderRequest``; ``judge(responder, instances, requests)`` -> one
    ``Judgement`` per request (None: the responder could not answer it). ``likelihood``: its requests ask the
    responder for log-probs (``answer_logprob``), which a responder server must then serve."""

    name: str
    summary: str
    request: Callable[[Instance, Rules], ResponderRequest]
    judge: Callable[[Responder, list[Instance], list[ResponderRequest]], list[Judgement | None]]
    likelihood: bool


def _load_modules() -> None:
    """Import the package's ``score_mode_*`` modules (not the whole package: its other modules are heavy)."""
    package = importlib.import_module("memstate.reward")
    names = sorted(m.name for m in pkgutil.iter_modules(package.__path__) if m.name.startswith(MODULE_PREFIX))
    for module in names:
        importlib.import_module(f"memstate.reward.{module}")


# Registration order (the built-ins first); the name as the config spells it.
SCORE_MODES: Registry[ScoreMode] = Registry("score_mode", lambda m: m.judge, load=_load_modules)
register_score_mode, unregister_score_mode = SCORE_MODES.register, SCORE_MODES.unregister


def score_mode_names() -> tuple[str, ...]:
    """The registered score modes, in the order they registered (the built-ins first).

    >>> score_mode_names()[:2]
    ('likelihood', 'exact')
    """
    return SCORE_MODES.names()


def score_mode(name: str) -> ScoreMode:
    """The score mode registered as ``name``; ConfigError naming the known ones otherwise.

    >>> score_mode("exact").likelihood
    False
    >>> score_mode("exakt")
    Traceback (most recent call last):
    ...
    memstate.errors.ConfigError: unknown score_mode 'exakt'; known: likelihood, exact
    """
    return SCORE_MODES.get(name)


def responder_request(instance: Instance, rules: Rules, mode: str) -> ResponderRequest:
    """The call that scores ``instance`` answered with ``rules`` (None: the no-state baseline prompt) in ``mode``."""
    return score_mode(mode).request(instance, rules)


def judge(responder: Responder, instances: list[Instance], rules: list[Rules], mode: str) -> list[Judgement | None]:
    """Score each (instance, rules) pair in ``mode``; ``rules=None`` is the no-state baseline prompt."""
    scorer = score_mode(mode)
    requests = [scorer.request(inst, r) for inst, r in zip(instances, rules, strict=True)]
    return scorer.judge(responder, instances, requests)


# ---- sending requests: what a mode's judge calls ------------------------------------------------------------------


def continuation_logprobs(
    responder: Responder, requests: list[ResponderRequest]
) -> list[list[ContinuationLogprob] | None]:
    """Each request's ``continuations`` scored by the responder (``answer_logprob``), in one batch."""
    if any(q.continuations is None for q in requests):
        raise ValueError("continuation_logprobs: a request without continuations")
    if not requests:
        return []
    return responder.answer_logprob([q.messages for q in requests], [q.continuations for q in requests])


def greedy_answers(responder: Responder, requests: list[ResponderRequest]) -> list[str | None]:
    """Each request's greedy answer (``answer``) of at most its ``max_new_tokens``: one batch per distinct budget."""
    if any(q.max_new_tokens is None for q in requests):
        raise ValueError("greedy_answers: a request without max_new_tokens")
    answers: list[str | None] = [None] * len(requests)
    for budget in sorted({q.max_new_tokens for q in requests}):
        where = [i for i, q in enumerate(requests) if q.max_new_tokens == budget]
        texts = responder.answer([requests[i].messages for i in where], max_new_tokens=budget)
        for i, text in zip(where, texts, strict=True):
            answers[i] = text
    return answers


# ---- the built-in modes -------------------------------------------------------------------------------------------


def likelihood_request(instance: Instance, rules: Rules) -> ResponderRequest:
    """The option letters (closed sets) or the reference answer (free text), scored by their log-probs."""
    closed = bool(instance.candidates)
    continuations = option_letters(len(instance.candidates)) if closed else [instance.answer]
    return ResponderRequest.of("likelihood", instance, rules, continuations=continuations)


def likelihood_judgements(
    responder: Responder, instances: list[Instance], requests: list[ResponderRequest]
) -> list[Judgement | None]:
    """P(correct letter) renormalized over the letters (closed sets); the reference's geometric-mean token
    probability (free text)."""
    results = continuation_logprobs(responder, requests)
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


def exact_request(instance: Instance, rules: Rules) -> ResponderRequest:
    """A greedy answer of at most ``EXACT_MAX_NEW_TOKENS``."""
    return ResponderRequest.of("exact", instance, rules, max_new_tokens=EXACT_MAX_NEW_TOKENS)


def exact_judgements(
    responder: Responder, instances: list[Instance], requests: list[ResponderRequest]
) -> list[Judgement | None]:
    """The greedy answer scored per ``answer_kind`` (``reward.score.compute_score``)."""
    answers = greedy_answers(responder, requests)
    judgements: list[Judgement | None] = []
    for inst, request, text in zip(instances, requests, answers, strict=True):
        if text is None:
            judgements.append(None)
            continue
        score = compute_score(text, request.reference, inst.candidates)
        judgements.append(Judgement(score, score == 1.0, text.strip()))
    return judgements


register_score_mode(
    ScoreMode(
        "likelihood",
        "dense: the responder's probability of the right answer (option letter, or the reference's tokens)",
        likelihood_request,
        likelihood_judgements,
        likelihood=True,
    )
)
register_score_mode(
    ScoreMode(
        "exact",
        "the responder's greedy answer compared to the right one (letter or option text: 0/1; free text: token F1)",
        exact_request,
        exact_judgements,
        likelihood=False,
    )
)
