"""Likelihood-mode scoring: Score = the responder's probability of the reference answer y*.

Closed sets (``label``, ``choice``): the responder prompt shows the candidates as lettered options, so the
answer is one token; Score = P(correct letter) renormalized over the option letters, from one forward pass.
Free text: the length-normalized probability of the reference continuation, exp(mean token log-prob).
"""

from __future__ import annotations

from dataclasses import dataclass

from memstate.prompts import responder_messages
from memstate.responder import Responder
from memstate.schema import Instance, option_letters
from reward.score import continuation_probability, option_probability


@dataclass(frozen=True)
class Judgement:
    """Score in [0, 1]; ``correct`` is whether the responder's most likely option is y* (None for free text)."""

    score: float
    correct: bool | None


def likelihood_judgements(
    responder: Responder, instances: list[Instance], rules: list[tuple[str, ...] | None]
) -> list[Judgement]:
    """Score each (instance, rules) pair; ``rules=None`` is the no-state baseline prompt."""
    prompts = [responder_messages(inst, r) for inst, r in zip(instances, rules, strict=True)]
    continuations = [option_letters(len(i.candidates)) if i.candidates else [i.answer] for i in instances]
    results = responder.answer_logprob(prompts, continuations)
    judgements = []
    for inst, lps in zip(instances, results, strict=True):
        if inst.candidates:
            logprobs = [lp.logprob for lp in lps]
            correct = option_letters(len(inst.candidates)).index(inst.answer_letter)
            best = max(range(len(logprobs)), key=logprobs.__getitem__)
            judgements.append(Judgement(option_probability(logprobs, correct), best == correct))
        else:
            judgements.append(Judgement(continuation_probability(*lps[0]), None))
    return judgements
