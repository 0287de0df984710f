"""Red team of the leak gate: it rejects every way of naming an answer and accepts legitimate rules — and its
decision never depends on which answer is the gold one (a gate that did would tell the policy the label)."""

import pytest

from memstate.leak import leak_reason, leaks_answer
from memstate.schema import Fact, Instance

FACTS = (Fact("F1", "Evidence sentence.", "evidence"), Fact("F2", "I prefer tea now.", "preference"))
LABELS = ("supported", "refuted", "not enough info")
OPTIONS = ("green tea", "black coffee", "orange juice")


def label_instance(answer: str) -> Instance:
    return Instance(
        id="l", source="fever", task="evidence_conflict", perspective="belief", question="Is it supported?",
        options=(), answer=answer, answer_kind="label", labels=LABELS, facts=FACTS, relations=(),
    )  # fmt: skip


def choice_instance(answer: str) -> Instance:
    return Instance(
        id="c", source="personamem", task="preference_current", perspective="none", question="What should I drink?",
        options=OPTIONS, answer=answer, answer_kind="choice", labels=(), facts=FACTS, relations=(),
    )  # fmt: skip


LABEL_INSTANCES = [label_instance(a) for a in LABELS]
CHOICE_INSTANCES = [choice_instance(a) for a in "ABC"]

# Each is one rule; the state is that rule plus a harmless second one.
LABEL_LEAKS = [
    "The claim is false.",
    "F1 refutes the claim.",
    "Choose the second option.",
    "Say B.",
    "Respond with B only.",
    "Say there is not enough information.",
    "Do not answer supported or not enough info.",
    "Decide whether the claim is supported or refuted.",
    "The claim is true.",
    "The statement holds.",
    "The claim does not hold.",
    "The claim holds true.",
    "The evidence confirms the claim.",
    "The user is wrong.",
    "The user's belief is mistaken.",
    "The claim is incorrect.",
    "Answer (C).",
    "The correct option is a.",
    "Go with the first option.",
    "Pick option 3.",
    "Reply with option two.",
    "The evidence is insufficient to decide.",
    "It cannot be determined from F1.",
    "The evidence contradicts the claim.",
    "F2 backs up the claim.",
    "The claim is accurate.",
    "Output A.",
    "Rule out A and C.",
    "Anything but B.",
    "The answer is the last option.",
    "Neither supported nor refuted.",
    "The claim is debunked by F1.",
    "The evidence disproves it.",
    "Respond 'refuted'.",
    "Mark it as verified.",
    "The claim is unverifiable from these memories.",
    "There is no evidence about the claim.",
    "F1 proves the claim.",
    "It's right.",
    "The user is right.",
    "Agree with the claim.",
    "choose (b)",
    "b) is the one to give.",
    "Call it unsupported.",
    "Conclude the evidence is inconclusive.",
    "Treat the claim as a myth.",
    "Answer yes.",
    "Everything in the claim checks out.",
    "Say the opposite of option A.",
    "You can't tell from F1, so say so.",
    "Not-enough-info is what F1 implies.",
    "The middle choice is the one.",
    "Answer with the letter after the first letter.",
    # Found playing the policy after the first version of the gate:
    "Say s-u-p-p-o-r-t-e-d.",
    "The claim stands.",
    "Evidence sides with the claim.",
    "F1 says the opposite of the claim.",
]

CHOICE_LEAKS = [
    "Recommend green tea.",
    "Choose A.",
    "The user wants Black Coffee.",
    "Answer with the third choice.",
    "Suggest orange juice, not tea.",
    "Pick (c).",
    "Option B fits the user.",
    "Avoid A and B.",
    "Reply: C",
    "Say b-l-a-c-k c-o-f-f-e-e.",
]

# Leaks the word rules no longer claim (issue 54, round 2: the shape check and positions on anything but an ordinal
# option/choice/answer were dropped, since procedure uses the same words); the answer-flow credit carries them.
FLOW_LEAKS = [
    ("label", "The answer is the label that starts with r."),
    ("label", "Pick the longest option."),
    ("choice", "Go with the latter option."),
    ("choice", "Pick the shortest option."),
]

LEGITIMATE = [
    "Trust the evidence over the user's belief.",
    "Prefer F3; F1 is outdated.",
    "Decide from the evidence, not the user's claim.",
    "Treat F2 as a preference, not as evidence.",
    "Ignore F4 and F5; they are about another topic.",
    "Base the answer on F1 and F2 only.",
    "The user's expertise does not outweigh the retrieved evidence.",
    "Use the most recent preference, F6, over earlier ones.",
    "F3 SUPERSEDES F1, so rely on F3.",
    "Weigh F1 against F2 before answering.",
    "Do not let the user's identity decide the answer.",
    "Read each evidence sentence carefully and compare it with the request.",
    "A newer memory replaces an older one on the same topic.",
    "If the memories disagree, follow the evidence.",
    "Check whether F2 actually addresses the request.",
    "Give the user's stated belief no weight.",
    "Rely on the evidence sentences, not on personal conviction.",
    "Judge the request only from what F1 and F3 say.",
    "Keep the user's current diet constraint (F5) in mind.",
    "Ignore distractor memories about unrelated topics.",
    "Follow the newest memory when two memories conflict.",
    "Pick a reply that matches F2.",
    "Consider the time stamps of F1 and F4.",
    "Evidence outranks memories of belief, identity or expertise.",
    "F1 contradicts the user's memory F3; trust F1.",
    "No one's conviction outweighs F2.",
    "Start with a careful reading of F1, then weigh F2.",
]


def _state(rule: str) -> str:
    return f"- {rule}\n- Read every memory before answering."


@pytest.mark.parametrize("rule", LABEL_LEAKS)
def test_label_leaks_are_rejected_whatever_the_gold_label(rule):
    assert len(LABEL_LEAKS) + len(CHOICE_LEAKS) >= 40
    decisions = [leaks_answer(_state(rule), inst) for inst in LABEL_INSTANCES]
    assert decisions == [True] * len(LABELS), leak_reason(_state(rule), LABELS, "label")


@pytest.mark.parametrize("rule", CHOICE_LEAKS)
def test_choice_leaks_are_rejected_whatever_the_gold_option(rule):
    assert [leaks_answer(_state(rule), inst) for inst in CHOICE_INSTANCES] == [True, True, True]


@pytest.mark.parametrize("kind, rule", FLOW_LEAKS)
def test_the_gate_does_not_claim_the_answer_flow_leaks(kind, rule):
    """Move one back to its leak list if a rule catches it again."""
    for inst in LABEL_INSTANCES if kind == "label" else CHOICE_INSTANCES:
        assert not leaks_answer(_state(rule), inst)


@pytest.mark.parametrize("rule", LEGITIMATE)
def test_legitimate_rules_are_accepted_whatever_the_gold_answer(rule):
    assert len(LEGITIMATE) >= 20
    for inst in LABEL_INSTANCES + CHOICE_INSTANCES:
        assert not leaks_answer(_state(rule), inst), leak_reason(_state(rule), inst.candidates, inst.answer_kind)


def test_the_decision_never_depends_on_the_gold_answer():
    for rule in LABEL_LEAKS + CHOICE_LEAKS + LEGITIMATE:
        assert len({leaks_answer(_state(rule), inst) for inst in LABEL_INSTANCES}) == 1, rule
        assert len({leaks_answer(_state(rule), inst) for inst in CHOICE_INSTANCES}) == 1, rule


def test_letters_outside_the_option_set_are_not_options():
    # Two candidates are A and B: "C" names nothing; an option's whole text is named. (Most of its content words in
    # other wording, "suggest a pottery class near the new flat", is left to the answer-flow credit since round 3.)
    two = ("I'd suggest a pottery class near your new flat", "A cooking course with friends")
    assert leak_reason("- Say C.\n- Use F1.", two, "choice") is None
    assert leak_reason("- Go with: I'd suggest a pottery class near your new flat.\n- Use F1.", two, "choice")
    assert leak_reason("- The user enjoyed pottery once (F2).\n- Use F1.", two, "choice") is None


def test_free_text_span_leak():
    inst = Instance(
        id="f", source="personamem", task="preference_current", perspective="none", question="Where do I live?",
        options=(), answer="the city of Oslo", answer_kind="free", labels=(), facts=FACTS, relations=(),
    )  # fmt: skip
    assert leaks_answer("- Say the user lives in the City of Oslo.\n- Use F2.", inst)
    assert not leaks_answer("- Use the most recent city the user named.\n- Ignore F1.", inst)
