import pytest

from memstate.schema import Fact, Instance
from reward.gates import leaks_answer

FACTS = (Fact("F1", "Evidence sentence.", "evidence"), Fact("F2", "I prefer tea now.", "preference"))


def label_instance(answer="not enough info"):
    return Instance(
        id="l", source="fever", task="evidence_conflict", perspective="belief", question="Is it supported?",
        options=(), answer=answer, answer_kind="label", labels=("supported", "refuted", "not enough info"),
        facts=FACTS, relations=(),
    )  # fmt: skip


def choice_instance(answer="A"):
    return Instance(
        id="c", source="personamem", task="preference_current", perspective="none", question="What should I drink?",
        options=("green tea", "black coffee", "orange juice"), answer=answer, answer_kind="choice", labels=(),
        facts=FACTS, relations=(),
    )  # fmt: skip


def free_instance():
    return Instance(
        id="f", source="personamem", task="preference_current", perspective="none", question="Where do I live?",
        options=(), answer="the city of Oslo", answer_kind="free", labels=(), facts=FACTS, relations=(),
    )  # fmt: skip


@pytest.mark.parametrize(
    ("state", "leak"),
    [
        ("- There is Not Enough Info here.\n- Use F1.", True),
        ("- Answer: not-enough info.\n- Use F1.", True),
        ("- Pick option (C).\n- Use F1.", True),
        ("- The answer is C.\n- Use F1.", True),
        ("- Weigh F1 against F2; the evidence may not be enough.\n- Use F1.", False),
        ("- Decide whether F1 supports or refutes the claim.\n- Ignore F2.", False),
        ("- Check (A) and (B) carefully.\n- Use F1.", False),  # naming the wrong options is not a leak
    ],
)
def test_label_leaks(state, leak):
    assert leaks_answer(state, label_instance()) is leak


@pytest.mark.parametrize(
    ("state", "leak"),
    [
        ("- Recommend green tea.\n- Use F2.", True),
        ("- Choose A.\n- Use F2.", True),
        ("- The correct option is (a).\n- Use F2.", True),
        ("- Pick a drink that matches F2.\n- Use F2 over older memories.", False),  # "pick a" is not option A
        ("- Prefer tea over coffee per F2.\n- Ignore older memories.", False),  # partial option text is not a leak
        ("- Choose B.\n- Use F2.", False),
    ],
)
def test_choice_leaks(state, leak):
    assert leaks_answer(state, choice_instance()) is leak


def test_free_text_span_leak():
    inst = free_instance()
    assert leaks_answer("- Say the user lives in the City of Oslo.\n- Use F2.", inst)
    assert not leaks_answer("- Use the most recent city the user named.\n- Ignore F1.", inst)
