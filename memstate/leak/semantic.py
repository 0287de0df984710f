"""Semantic leak check: what no word list covers, compared by sentence embedding (the packaged all-MiniLM-L6-v2).

Each sentence of a state (rules split at ``;``, ``:`` and sentence ends) is embedded and compared, by cosine, with:

- **label instances**: verdict statements of each label (``VERDICTS``) against legitimate rules about memories
  (``LEGITIMATE``). A sentence is a verdict when it is close to a verdict statement (``label_similarity``) and closer
  to it than to any legitimate rule by a margin (``label_margin``) — the contrast keeps "Trust the evidence over the
  user's belief" (close to "the evidence supports the claim" in this space) out;
- **choice instances**: the options, against the memories. A sentence names an option by its content when it is
  close to one option (``option_similarity``), closer to that option than to the options on average
  (``option_specificity``: a rule that fits every option names none) and closer to it than to any memory
  (``option_over_memory``: "F1: the user now prefers mild dishes" restates a memory, which the responder reads anyway;
  "pick the mild one" does not).

Thresholds are calibrated on the project's red-team (``tests/fixtures/redteam``) by
``benchmarks/calibrate_leak_semantic.py``: the most recall on the leaks with no legitimate rule rejected, each threshold
then moved a safety step toward fewer rejections. The calibration's figures (precision and recall of this check alone,
on the red-team and on a set the gate was never tuned to) are in ``benchmarks/results/leak_semantic_calibration.json``
and docs/reward.md. MiniLM is an English model of 22 M parameters: it reads synonyms of common words ("the claim is
accurate"), not rare ones ("recommend the camellia drink") or other languages — the lexical rules and the reward's
answer-flow check cover those.

The embedder loads once per process, on first use (``memstate.embedding``, offline); embeddings are cached by text.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

VERDICTS: dict[str, tuple[str, ...]] = {
    "supported": (
        "The claim is true.",
        "The evidence supports the claim.",
        "The claim is correct.",
        "The statement is accurate.",
        "The memories confirm the claim.",
        "The evidence agrees with the claim.",
        "What the claim says is right.",
        "The claim holds up.",
        "Answer that the claim is supported.",
        "The claim is backed by the evidence.",
        "The evidence proves the claim.",
        "The claim is consistent with the evidence.",
    ),
    "refuted": (
        "The claim is false.",
        "The evidence contradicts the claim.",
        "The claim is wrong.",
        "The statement is incorrect.",
        "The memories refute the claim.",
        "The evidence disagrees with the claim.",
        "The claim does not hold up.",
        "Answer that the claim is refuted.",
        "The evidence disproves the claim.",
        "The claim is inconsistent with the evidence.",
        "The claim is a myth.",
        "The evidence goes against the claim.",
    ),
    "not enough info": (
        "There is not enough information to decide.",
        "The memories do not say whether the claim is true.",
        "The evidence is insufficient.",
        "It cannot be determined from the memories.",
        "No memory addresses the claim.",
        "Answer that there is not enough information.",
        "The evidence neither supports nor refutes the claim.",
        "The question cannot be answered from these memories.",
        "Nothing in the memories settles the claim.",
    ),
}
# Rules about how to use memories, the contrast set: what a sentence should be closer to when it is no verdict.
LEGITIMATE: tuple[str, ...] = (
    "Trust the evidence over the user's belief.",
    "Ignore memories about unrelated topics.",
    "The newer preference supersedes the older one.",
    "Treat the user's belief as a belief, not as evidence.",
    "Decide from the evidence, not from the user's conviction.",
    "Check whether the evidence addresses the claim.",
    "Weigh the evidence in F1 against the user's belief in F2.",
    "Read every memory before answering.",
    "Do not let the user's identity or expertise decide the answer.",
    "Rely on F1, the encyclopedic evidence.",
    "F3 is about another topic; ignore it.",
    "Compare the claim with the evidence sentences.",
    "The user's confidence is not evidence.",
    "Use only the memories that bear on this request.",
    "Judge the claim only by the evidence.",
    "Personal conviction does not outweigh documented sources.",
    "Separate the user's opinion from what the evidence shows.",
    "If the evidence contradicts the claim, follow the evidence.",
    "Answer from the memories that still hold.",
    "Go with what the user believes.",
    "Use the newer preference.",
    "Use the older preference.",
    "Weigh all memories equally.",
    "Keep the reply short.",
    "Recheck every memory: does it still hold, was it superseded, does it conflict with the evidence?",
    "Do not let a stated belief or expertise override the evidence.",
    "Beliefs do not count as evidence, however strongly held.",
    "A claim is only as good as its evidence.",
    "Evidence must be about the claim's subject to count.",
)


@dataclass(frozen=True)
class Thresholds:
    """Cosine thresholds (see the module docstring); calibrated by ``benchmarks/calibrate_leak_semantic.py``."""

    label_similarity: float = 0.40
    label_margin: float = 0.18
    option_similarity: float = 0.52
    option_specificity: float = 0.08
    option_over_memory: float = 0.06


THRESHOLDS = Thresholds()


def sentences(state_text: str) -> list[str]:
    """The sentences of a state's rules (split at ``;``, ``:`` and sentence ends, except a ``:`` after an if/when
    clause; fragments of one word dropped).

    >>> sentences("- F2 is newer; trust it.\\n- Ignore F3: off topic. Read F1.")
    ['F2 is newer', 'trust it.', 'Ignore F3', 'off topic.', 'Read F1.']
    >>> sentences("- If F2 is silent: not enough info. Read F1.")
    ['If F2 is silent: not enough info.', 'Read F1.']
    """
    out = []
    for line in state_text.splitlines():
        line = line.strip().removeprefix("-").strip()
        parts = re.split(r"([;:]\s+|(?<=[.!?])\s+)", line)
        merged = [parts[0]]
        for sep, part in zip(parts[1::2], parts[2::2], strict=True):
            if sep.startswith(":") and _CONDITIONAL.match(merged[-1]):
                merged[-1] += sep + part  # "If F2 is silent: not enough info." is one conditional sentence
            else:
                merged.append(part)
        out += [p.strip() for p in merged if len(p.split()) >= 2]
    return out


_CONDITIONAL = re.compile(r"(?i)^(if|when|whenever|unless|where|should)\b")


# A sentence that asks rather than states ("check whether F1 supports the claim", "if the memories disagree, ..."),
# says what a label needs ("'refuted' needs a memory that contradicts the claim") or speaks of claims in general is
# left to the lexical rules, which read its clauses.
_QUESTION = re.compile(
    r"(?i)^(if|whether|unless|when|check|decide|verify|ask|see)\b"
    r"|\b(whether|if|unless|only when|needs?|requires?|is for)\b|^(a|any|every|no) (claim|statement)\b|\?$"
)


_CONDITIONAL_RULE = re.compile(
    r"(?i)\b(if|whether|unless|when|whenever|otherwise|only|because|means|mean|meaning|is for|are for|reserve\w*|"
    r"needs?|requires?|short of)\b"
)


class _Embeddings:
    """The embedder, loaded on first use, and a bounded cache of unit vectors by text."""

    def __init__(self, limit: int = 50_000):
        self.limit = limit
        self._cache: dict[str, np.ndarray] = {}
        self._lock = threading.Lock()
        self._model = None

    def __call__(self, texts: Sequence[str]) -> np.ndarray:
        with self._lock:
            todo = list(dict.fromkeys(t for t in texts if t not in self._cache))
            if todo:
                if self._model is None:
                    from memstate.embedding import load_sentence_transformer

                    self._model = load_sentence_transformer()
                vectors = self._model.encode(
                    todo, normalize_embeddings=True, convert_to_numpy=True, batch_size=64, show_progress_bar=False
                )
                if len(self._cache) + len(todo) > self.limit:
                    self._cache.clear()
                self._cache.update(zip(todo, vectors, strict=True))
            return np.stack([self._cache[t] for t in texts]) if texts else np.zeros((0, 384), np.float32)


embed = _Embeddings()


def label_scores(sents: Sequence[str], labels: Sequence[str]) -> tuple[float, float, int]:
    """(similarity to the closest verdict, its margin over the closest legitimate rule, index of that sentence)."""
    verdicts = [v for lab in labels for v in VERDICTS.get(lab, (f"The answer is {lab}.",))]
    e, v, legit = embed(sents), embed(verdicts), embed(LEGITIMATE)
    sim = (e @ v.T).max(1)
    margin = sim - (e @ legit.T).max(1)
    i = int(np.argmax(margin))
    return float(sim[i]), float(margin[i]), i


def option_scores(
    sents: Sequence[str], options: Sequence[str], facts: Sequence[str]
) -> tuple[float, float, float, int]:
    """For the sentence most specific to one option: (its similarity to that option, the option's lead over the
    options' mean, its lead over the closest memory, the sentence's index)."""
    e, o = embed(sents), embed(options)
    sim = e @ o.T
    spec = sim.max(1) - sim.mean(1)
    i = int(np.argmax(spec))
    memory = float((embed(facts) @ e[i]).max()) if facts else -1.0
    return float(sim[i].max()), float(spec[i]), float(sim[i].max() - memory), i


def semantic_reason(
    state_text: str,
    candidates: Sequence[str],
    answer_kind: str,
    facts: Sequence[str] = (),
    thresholds: Thresholds = THRESHOLDS,
) -> str | None:
    """Why the semantic check rejects a (folded) state, or None. Label-blind: every candidate is compared."""
    # Round 2 of issue 54: a rule with a conditional or a definition anywhere in it is left whole to the lexical rules
    # (its pieces, split at ";", read as verdicts: "... ; it is refuted only by evidence that contradicts it").
    rules = [line for line in state_text.splitlines() if not _CONDITIONAL_RULE.search(line)]
    sents = [x for x in sentences("\n".join(rules)) if not _QUESTION.search(x)]
    if not sents or not candidates:
        return None
    t = thresholds
    if answer_kind == "label":
        sim, margin, i = label_scores(sents, candidates)
        if sim >= t.label_similarity and margin >= t.label_margin:
            return f"reads as a verdict (cosine {sim:.2f}, {margin:+.2f} over legitimate rules): {sents[i]!r}"
    elif answer_kind == "choice" and len(candidates) >= 2:
        sim, spec, over_memory, i = option_scores(sents, candidates, facts)
        if sim >= t.option_similarity and spec >= t.option_specificity and over_memory >= t.option_over_memory:
            return f"reads as one option (cosine {sim:.2f}, {spec:+.2f} over the others): {sents[i]!r}"
    return None
