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
"""

from __future__ import annotations

from dataclasses import dataclass

from memstate.reward.score import choice_score, continuation_probability, f1_score, option_probability

from memstate.prompts import responder_messages
from memstate.responder import Responder
from memstate.schema import Instance, option_letters

MODES = ("likelihood", "exact")
EXACT_MAX_NEW_TOKENS = 16  # a letter, or a short free answer


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
    prompts = [responder_messages(inst, r) for inst, r in zip(instances, rules, strict=True)]
    continuations = [option_letters(len(i.candidates)) if i.candidates else [i.answer] for i in instances]
    results = responder.answer_logprob(prompts, continuations)
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
    prompts = [responder_messages(inst, r) for inst, r in zip(instances, rules, strict=True)]
    answers = responder.answer(prompts, max_new_tokens=EXACT_MAX_NEW_TOKENS)
    judgements: list[Judgement | None] = []
    for inst, text in zip(instances, answers, strict=True):
        if text is None:
            judgements.append(None)
            continue
        if inst.candidates:
            score = choice_score(text, inst.answer_letter, inst.candidates)
            judgements.append(Judgement(score, score == 1.0, text.strip()))
        else:
            score = f1_score(text, inst.answer)
            judgements.append(Judgement(score, score == 1.0, text.strip()))
    return judgements
