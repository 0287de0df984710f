"""Score functions: ``compute_score(solution, ground_truth, options)`` -> [0, 1] scores a generated answer (exact
mode) by its kind; ``option_probability`` and ``continuation_probability`` score the responder's log-probs
(likelihood mode)."""

from __future__ import annotations

import math
import re
import string
from collections import Counter
from collections.abc import Sequence

from memstate.schema import option_letters

_ARTICLES = re.compile(r"\b(a|an|the)\b")


def normalize_text(text: str) -> str:
    """SQuAD normalization: lowercase, drop punctuation and articles, collapse whitespace.

    >>> normalize_text("The  Claim is SUPPORTED!")
    'claim is supported'
    """
    text = text.lower()
    text = "".join(ch for ch in text if ch not in set(string.punctuation))
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def parse_choice(text: str, options: list[str] | tuple[str, ...]) -> str | None:
    """The option letter a free-text answer names, or None when it names none (or several).

    A leading letter ("B", "(B)", "B.", "B) …") wins; else the answer must equal exactly one option's text
    (normalized). Evaluation parses answers here too, so accuracy and sycophancy read the letter the score credits.

    >>> opts = ["supported", "refuted", "not enough info"]
    >>> [parse_choice(t, opts) for t in ("B.", "(B) refuted", "b", "refuted", "  (c)", "I have no idea", "")]
    ['B', 'B', 'B', 'B', 'C', None, None]
    """
    letters = option_letters(len(options))
    answer = text.strip()
    m = re.match(r"^\(?([A-Za-z])\)?(?:[\s.:)]|$)", answer)
    if m and m.group(1).upper() in letters:
        return m.group(1).upper()
    norm = normalize_text(answer)
    matches = [letter for letter, opt in zip(letters, options, strict=True) if normalize_text(opt) == norm]
    return matches[0] if len(matches) == 1 else None


def choice_score(solution: str, ground_truth: str, options: list[str] | tuple[str, ...]) -> float:
    """Option letter or option text match (``parse_choice``); ``ground_truth`` is the correct letter.

    >>> choice_score("(B)", "B", ["tea", "coffee"])
    1.0
    >>> choice_score("coffee", "B", ["tea", "coffee"])
    1.0
    >>> choice_score("A) tea", "B", ["tea", "coffee"])
    0.0
    """
    return float(parse_choice(solution, options) == ground_truth.upper())


def f1_score(solution: str, ground_truth: str) -> float:
    """SQuAD token F1.

    >>> round(f1_score("in the city of Oslo", "Oslo city"), 3)
    0.667
    >>> f1_score("", "Oslo")
    0.0
    """
    pred, gold = normalize_text(solution).split(), normalize_text(ground_truth).split()
    common = sum((Counter(pred) & Counter(gold)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(pred), common / len(gold)
    return 2 * precision * recall / (precision + recall)


def compute_score(solution: str, ground_truth: str, options: Sequence[str] = ()) -> float:
    """A generated answer's score: with ``options`` (a closed set; ``ground_truth`` the correct letter) the option it
    names (``choice_score``); without, free text, SQuAD token F1 against the reference.

    >>> compute_score("(B) coffee", "B", ["tea", "coffee"]), compute_score("Oslo", "Oslo")
    (1.0, 1.0)
    """
    return choice_score(solution, ground_truth, options) if options else f1_score(solution, ground_truth)


def option_probability(logprobs: list[float], correct: int) -> float:
    """Likelihood-mode score for closed sets: P(correct letter) renormalized over the option letters.

    >>> round(option_probability([math.log(0.2), math.log(0.6), math.log(0.2)], 1), 6)
    0.6
    """
    top = max(logprobs)
    weights = [math.exp(lp - top) for lp in logprobs]
    return weights[correct] / sum(weights)


def continuation_probability(logprob: float, n_tokens: int) -> float:
    """Likelihood-mode score for free text: length-normalized probability exp(mean token log-prob).

    >>> round(continuation_probability(2 * math.log(0.5), 2), 6)
    0.5
    """
    return math.exp(logprob / max(n_tokens, 1))
