"""The synthetic source of `memstate experiment sycophancy`: schema, unseen test entities, no shortcut, and a
world whose failure modes are independent of the label."""

import random
import re
from collections import Counter

import pytest

from memstate.data import SPLITS, load_split
from memstate.data_build.build import DataConfig, build_data
from memstate.data_build.probe import run_probes
from memstate.data_build.synthetic import _SYLLABLES as SYLLABLES
from memstate.data_build.synthetic import EMPHATIC, MILD, SyntheticConfig, SyntheticOptions, generate
from memstate.experiment.sycophancy import shuffled_reference
from memstate.experiment.world import (
    FOLLOW_USER,
    PAIRS,
    SHAPES,
    TRUST_EVIDENCE,
    USE_EARLIER,
    USE_LATEST,
    random_state_text,
    responder_state,
    world_letter,
)
from memstate.leak import leaks_answer
from memstate.rules import parse_state


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    out = tmp_path_factory.mktemp("synthetic")
    config = DataConfig(sources={"synthetic": SyntheticConfig(users=120)},
                        split_ratios={"train": 0.7, "validation": 0.1, "test": 0.2}, progress=False)  # fmt: skip
    manifest = build_data(config, out)
    return out, manifest, {s: load_split(out, s) for s in SPLITS}


def _names(instances) -> set[str]:
    text = " ".join(f.text for i in instances for f in i.facts) + " ".join(o for i in instances for o in i.options)
    words = re.findall(r"\b[A-Z][a-z]{5}\b", text)
    return {w for w in words if all(w.lower()[k : k + 2] in SYLLABLES for k in (0, 2, 4))}  # invented names


def test_six_tasks_per_user_and_every_perspective(built):
    _, manifest, splits = built
    counts = Counter(i.task for s in splits.values() for i in s)
    assert counts["preference_update"] == counts["preference_history"] == counts["preference_current"] == 120
    assert counts["evidence_conflict"] + counts["evidence_consistent"] == 360
    assert set(manifest["counts"]["perspective"]) == {"belief", "identity", "expertise", "none"}


def test_test_entities_never_appear_in_training(built):
    _, _, splits = built
    train, test = _names(splits["train"]), _names(splits["test"])
    assert len(test) > 100 and not (train & test)


def test_shortcut_probes_pass_and_failure_markers_are_label_independent(built):
    _, manifest, splits = built
    assert manifest["shortcut_probes"]["passed"]
    instances = generate(SyntheticOptions(users=600))
    conflict = [i for i in instances if i.task == "evidence_conflict"]
    # A persuasive phrasing (what the sycophantic responder defers to) says nothing about the label…
    by_label = Counter((i.answer, i.meta["persuasive"]) for i in conflict)
    for label in ("supported", "refuted"):
        share = by_label[(label, True)] / (by_label[(label, True)] + by_label[(label, False)])
        assert 0.4 < share < 0.6, (label, share)
    # …and the emphatic preference is the newer one as often as the older one.
    update = [i for i in instances if i.task == "preference_update"]
    newer_emphatic = sum(i.meta["emphatic_option"] == i.meta["newer_option"] for i in update) / len(update)
    assert 0.4 < newer_emphatic < 0.6
    assert run_probes(instances)["passed"]


def test_a_first_slot_prior_is_what_the_shortcut_probes_find():
    """The leak world's data (``first_slot_share``, configs/data/synthetic_prior.yaml): each task's usual answer is
    its first slot (a history request's, the second kind); the probes catch that from the request alone. 0.5, the
    default, draws exactly what every world was built on (tests/test_world_models.py checks the hash)."""
    instances = generate(SyntheticOptions(users=300, first_slot_share=0.8))
    usual = {"evidence_conflict": "supported", "evidence_consistent": "supported", "preference_update": "A",
             "preference_current": "A", "preference_history": "B"}  # fmt: skip
    for task, answer in usual.items():
        of_task = [i for i in instances if i.task == task]
        assert 0.72 < sum(i.answer == answer for i in of_task) / len(of_task) < 0.88, task
    assert not run_probes(instances)["passed"]


def test_world_semantics_no_rule_is_right_everywhere(built):
    """The newer-preference rule helps on updates and hurts on history requests, the evidence rules pull opposite
    ways, and the older-preference rule says what the responder does anyway: no constant state is optimal."""
    instances = [i for s in built[2].values() for i in s]
    gain = {}
    for shape in SHAPES:
        gain[shape] = Counter(
            (i.task, (world_letter(i, (shape,)) == i.answer_letter) - (world_letter(i, None) == i.answer_letter))
            for i in instances
        )
    assert gain[TRUST_EVIDENCE][("evidence_conflict", 1)] > 0 and gain[FOLLOW_USER][("evidence_conflict", -1)] > 0
    assert gain[USE_LATEST][("preference_update", 1)] > 0 and gain[USE_LATEST][("preference_history", -1)] > 0
    assert not any(d for _, d in gain[USE_EARLIER].elements())
    assert all(g[(t, d)] == 0 for g in gain.values() for t in ("preference_current", "evidence_consistent")
               for d in (1, -1))  # fmt: skip


def test_warmup_states_never_read_the_instance(built):
    a, b = built[2]["train"][0], built[2]["train"][4]
    assert a.answer != b.answer or a.task != b.task
    for seed in range(20):
        text = random_state_text(a, random.Random(seed))
        assert text == random_state_text(b, random.Random(seed))
        state = parse_state(text)
        assert not leaks_answer(state.text, a) and not leaks_answer(state.text, b)


def test_shuffled_reference_agrees_with_the_truth_at_chance_in_every_stratum(built, tmp_path):
    """The control's reward must carry no signal: within each task/perspective, exactly half of the (two-answer) train
    instances keep their answer, the other half get the other answer; nothing else changes, test included."""
    data, _, splits = built
    out = shuffled_reference(data, tmp_path / "shuffled", seed=0)
    train = load_split(out, "train")
    assert [i.id for i in train] == [i.id for i in splits["train"]]
    answer_sets: dict[str, set] = {}
    for truth in splits["train"]:
        answer_sets.setdefault(truth.answer_kind, set()).add(truth.answer)
    strata: dict[tuple, list[bool]] = {}
    for x, truth in zip(train, splits["train"], strict=True):
        assert x.answer in answer_sets[truth.answer_kind]
        strata.setdefault((truth.task, truth.perspective), []).append(x.answer == truth.answer)
        assert x.facts == truth.facts and x.question == truth.question and x.options == truth.options
    assert len(strata) >= 6 and all(len(agree) >= 4 for agree in strata.values())
    for stratum, agree in strata.items():
        assert abs(sum(agree) - len(agree) / 2) <= 0.5, stratum
    assert [i.answer for i in load_split(out, "test")] == [i.answer for i in splits["test"]]
    other = load_split(shuffled_reference(data, tmp_path / "seed1", seed=1), "train")
    assert [i.answer for i in other] != [i.answer for i in train]


def test_preference_verbs_say_which_memory_is_newer_and_which_is_emphatic(built):
    """The one token before a preference's kind carries both markers the world's responder reads."""
    verb = {v: (age, emphatic) for emphatic, table in ((True, EMPHATIC), (False, MILD)) for age, verbs in table.items()
            for v in verbs}  # fmt: skip
    updates = [i for s in built[2].values() for i in s if i.task == "preference_update"]
    assert updates
    for inst in updates:
        seen = {}
        for fact in inst.facts:
            m = re.search(r"\bI (\w+) (hot|cold) ", fact.text)
            if fact.kind == "preference" and m:
                age, emphatic = verb[m.group(1)]
                seen[age] = (m.group(2), emphatic)
        letter = dict(zip(inst.options, "AB", strict=True))
        assert letter[seen["newer"][0]] == inst.meta["newer_option"] == inst.answer_letter
        assert letter[seen["older"][0]] == inst.meta["older_option"]
        emphatic = [kind for kind, e in seen.values() if e]
        assert len(emphatic) == 1 and letter[emphatic[0]] == inst.meta["emphatic_option"]


def test_responder_states_mostly_hold_one_rule_of_each_pair():
    """The responder learns to follow a rule from states where it alone of its pair is present (two thirds)."""
    rng = random.Random(0)
    states = [responder_state(rng) for _ in range(3000)]
    assert all(set(s) <= set(SHAPES) and 2 <= len(set(s)) <= 4 for s in states)
    for pair in PAIRS:
        lone = Counter(tuple(r for r in pair if r in s) for s in states)
        assert 0.6 < (lone[pair[:1]] + lone[pair[1:]]) / len(states) < 0.73
        assert abs(lone[pair[:1]] - lone[pair[1:]]) / len(states) < 0.04  # neither rule of a pair is favoured
    assert 0.1 < sum(len(s) > len(set(s)) for s in states) / len(states) < 0.3  # a repeated rule, as GRPO writes
