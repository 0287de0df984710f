"""Shortcut probes: can the answer be predicted from what carries no evidence semantics?

A training signal with a shortcut teaches the shortcut. Every build fits simple classifiers (scikit-learn) on
features of each instance that a policy could read without understanding the evidence, and predicts the answer:

- ``relations``: relation types and counts, the kinds and positions of their ends;
- ``structure``: the above plus fact kinds, scopes, counts, positions and lengths, times shown, the injected
  memory's template id, and question/option lengths (with which option is longest/shortest);
- ``user_memory_bow``: a bag of words of the injected user memory alone, the quoted claim masked out (the claim is
  the question itself; FEVER's claim-only bias, Schuster et al. 2019, belongs to the source, not to the builder).

Accuracy is measured out of fold with group k-fold over the split group key (a probe never sees the claim or
persona it is tested on), per source, against the majority-class rate of that source. A probe that beats the
majority by more than ``margin`` means the builder hands the label over; the build fails (or, asked to, warns).
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

import numpy as np
from scipy.sparse import hstack
from sklearn.ensemble import RandomForestClassifier
from sklearn.feature_extraction import DictVectorizer
from sklearn.feature_extraction.text import CountVectorizer
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import StratifiedGroupKFold
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import MaxAbsScaler
from sklearn.tree import DecisionTreeClassifier

from memstate.errors import MemstateError
from memstate.schema import FACT_KINDS, Instance, option_letters, stable_id

MARGIN = 0.05  # how far above the majority-class rate a probe may score
MIN_INSTANCES = 30  # fewer per source: too few to probe (recorded as skipped)
MAX_INSTANCES = 10000  # per source, a seeded sample: keeps the probe to seconds on a full build
FOLDS = 5


class ShortcutError(MemstateError, ValueError):
    """A shortcut probe predicts the answer well above the majority class."""


def _relation_features(inst: Instance) -> dict[str, float]:
    pos = {f.id: i / max(len(inst.facts) - 1, 1) for i, f in enumerate(inst.facts)}
    kind = {f.id: f.kind for f in inst.facts}
    feats: Counter = Counter({"rel/n": len(inst.relations)})
    for r in inst.relations:
        feats[f"rel/{r.type}"] += 1
        feats[f"rel/{r.type}/{kind[r.src]}->{kind[r.dst]}"] += 1
        feats[f"rel/{r.type}/src_pos"] += pos[r.src]
        feats[f"rel/{r.type}/dst_pos"] += pos[r.dst]
    return dict(feats)


def _structure_features(inst: Instance) -> dict[str, float]:
    n = len(inst.facts)
    feats: Counter = Counter(_relation_features(inst))
    feats["facts/n"] = n
    feats["facts/with_time"] = sum(f.time is not None for f in inst.facts)
    feats["facts/with_turn"] = sum(f.turn is not None for f in inst.facts)
    for i, f in enumerate(inst.facts):
        feats[f"kind/{f.kind}"] += 1
        feats[f"scope/{f.scope}"] += 1
        feats[f"kind/{f.kind}/words"] += len(f.text.split())
        feats.setdefault(f"kind/{f.kind}/first_pos", i / max(n - 1, 1))
        feats[f"kind/{f.kind}/last_pos"] = i / max(n - 1, 1)
        feats[f"pos{i}/{f.kind}"] = 1
    for k in FACT_KINDS:
        if feats[f"kind/{k}"]:
            feats[f"kind/{k}/words"] /= feats[f"kind/{k}"]
    feats[f"template/{inst.meta.get('user_template', 'none')}"] = 1
    feats["question/words"] = len(inst.question.split())
    feats["question/chars"] = len(inst.question)
    feats["options/n"] = len(inst.options)
    if inst.options:
        lengths = [len(o.split()) for o in inst.options]
        letters = option_letters(len(inst.options))
        for letter, length in zip(letters, lengths, strict=True):
            feats[f"option/{letter}/words"] = length
        feats[f"option/longest/{letters[int(np.argmax(lengths))]}"] = 1
        feats[f"option/shortest/{letters[int(np.argmin(lengths))]}"] = 1
    return dict(feats)


def user_memory_text(inst: Instance) -> str | None:
    """The injected user memory with the quoted claim masked out (None when the instance has none).

    >>> from memstate.schema import Fact
    >>> inst = Instance(id="x", source="fever", task="evidence_conflict", perspective="belief", question="q",
    ...     options=(), answer="refuted", answer_kind="label", labels=("supported", "refuted"),
    ...     facts=(Fact("F1", 'I am sure "Oslo is big" is true.', "belief"),), relations=(), meta={"user_fact": "F1"})
    >>> user_memory_text(inst)
    'I am sure CLAIM is true.'
    """
    fid = inst.meta.get("user_fact")
    text = next((f.text for f in inst.facts if f.id == fid), None)
    return None if text is None else re.sub(r'"[^"]*"', "CLAIM", text)


def _relations_and_user_memory(inst: Instance) -> tuple[dict[str, float], str] | None:
    """Relations next to the user memory's words: an edge type plus the user's stance is enough to give a label
    away ("CONFLICTS_WITH and the user says true → refuted"), though neither alone is."""
    text = user_memory_text(inst)
    return None if text is None else (_relation_features(inst), text)


PROBES = {
    "relations": _relation_features,
    "structure": _structure_features,
    "user_memory_bow": user_memory_text,
    "relations+user_memory": _relations_and_user_memory,
}


@dataclass(frozen=True)
class ProbeResult:
    source: str
    probe: str
    classifier: str
    accuracy: float
    majority_rate: float
    n: int

    @property
    def margin(self) -> float:
        return self.accuracy - self.majority_rate

    def as_dict(self) -> dict:
        return {
            "source": self.source,
            "probe": self.probe,
            "classifier": self.classifier,
            "accuracy": round(self.accuracy, 4),
            "majority_rate": round(self.majority_rate, 4),
            "margin": round(self.margin, 4),
            "n": self.n,
        }


def _matrix(values: list):
    """Feature dicts, texts (binary bag of words) or (dict, text) pairs as one sparse matrix."""
    if isinstance(values[0], dict):
        return DictVectorizer().fit_transform(values)
    if isinstance(values[0], str):
        return CountVectorizer(binary=True, min_df=2).fit_transform(values)
    return hstack([_matrix([v[0] for v in values]), _matrix([v[1] for v in values])]).tocsr()


def _classifiers(seed: int) -> dict:
    # A linear model, a shallow tree, and a forest for interactions (edge type × the user's stance).
    return {
        "logistic": lambda: make_pipeline(MaxAbsScaler(), LogisticRegression(C=1.0, max_iter=300)),
        "tree": lambda: DecisionTreeClassifier(max_depth=4, min_samples_leaf=5, random_state=seed),
        "forest": lambda: RandomForestClassifier(
            n_estimators=30, max_depth=8, min_samples_leaf=2, random_state=seed, n_jobs=1
        ),
    }


def _folds(y: np.ndarray, groups: np.ndarray, seed: int) -> list[tuple[np.ndarray, np.ndarray]]:
    # Stratified so every fold sees every class; grouped so a claim/persona is never both fitted and tested. The
    # folds depend on the answers and groups only: made once per source, for every probe and classifier (making them
    # was half the probes' time).
    folds = min(FOLDS, len(set(groups)))
    return list(StratifiedGroupKFold(n_splits=folds, shuffle=True, random_state=seed).split(y, y, groups))


def _out_of_fold_accuracy(X, y: np.ndarray, folds: list[tuple[np.ndarray, np.ndarray]], make_model) -> float:
    correct = 0
    for fit, test in folds:
        if len(set(y[fit])) == 1:
            correct += int((y[test] == y[fit][0]).sum())
            continue
        model = make_model().fit(X[fit], y[fit])
        correct += int((model.predict(X[test]) == y[test]).sum())
    return correct / len(y)


def _answer(inst: Instance) -> str:
    return inst.answer if inst.answer_kind != "free" else "free"


def run_probes(instances: list[Instance], seed: int = 0) -> dict:
    """Every probe × classifier per source: out-of-fold accuracy next to the majority-class rate."""
    by_source: dict[str, list[Instance]] = {}
    for inst in instances:
        if inst.answer_kind != "free":
            by_source.setdefault(inst.source, []).append(inst)
    # A source with labels and lettered choices (synthetic) is probed per answer kind: the task, visible in the
    # question, tells a label from a letter, which is no shortcut to which label or letter.
    for source in list(by_source):
        kinds = sorted({i.answer_kind for i in by_source[source]})
        if len(kinds) > 1:
            insts = by_source.pop(source)
            by_source |= {f"{source}/{k}": [i for i in insts if i.answer_kind == k] for k in kinds}
    results: list[ProbeResult] = []
    skipped: dict[str, str] = {}
    for source, insts in sorted(by_source.items()):
        if len(insts) > MAX_INSTANCES:
            insts = sorted(insts, key=lambda i: stable_id("probe", seed, i.id))[:MAX_INSTANCES]
        y = np.array([_answer(i) for i in insts])
        groups = np.array([i.meta.get("group", i.id) for i in insts])
        counts = Counter(y.tolist())
        if len(insts) < MIN_INSTANCES or len(counts) < 2 or len(set(groups.tolist())) < 2:
            skipped[source] = f"{len(insts)} instances, {len(counts)} answer(s): too few to probe"
            continue
        majority = counts.most_common(1)[0][1] / len(y)
        folds = _folds(y, groups, seed)
        for probe, featurize in PROBES.items():
            values = [featurize(i) for i in insts]
            if any(v is None for v in values):
                continue  # the source injects no user memory (PersonaMem: the memories are the history)
            X = _matrix(values)
            for name, make_model in _classifiers(seed).items():
                accuracy = _out_of_fold_accuracy(X, y, folds, make_model)
                results.append(ProbeResult(source, probe, name, accuracy, majority, len(y)))
    worst = max(results, key=lambda r: r.margin, default=None)
    return {
        "margin_allowed": MARGIN,
        "method": f"out-of-fold accuracy, {FOLDS}-fold stratified group k-fold by meta.group, per source",
        "probes": [r.as_dict() for r in results],
        "skipped": skipped,
        "worst": worst.as_dict() if worst else None,
        "passed": worst is None or worst.margin <= MARGIN,
    }


def check_probes(report: dict) -> None:
    """Raise ``ShortcutError`` naming every probe over the margin."""
    over = [p for p in report["probes"] if p["margin"] > report["margin_allowed"]]
    if over:
        lines = [
            f"{p['source']}: probe {p['probe']} ({p['classifier']}) accuracy {p['accuracy']:.3f} vs majority "
            f"{p['majority_rate']:.3f} (+{p['margin']:.3f}, n={p['n']})"
            for p in over
        ]
        raise ShortcutError(
            "shortcut probes predict the answer from features without evidence semantics (allowed: majority + "
            f"{report['margin_allowed']:.2f}):\n  " + "\n  ".join(lines)
        )
