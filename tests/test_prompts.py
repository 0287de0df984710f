"""The responder's prompt is the paper's A(q, F_q, R_q[, Z_q]): memories, relations, request, then the rules."""

from memstate.prompts import (
    PROMPT_VERSION,
    RESPONDER_SYSTEM,
    policy_messages,
    responder_messages,
    responder_request_messages,
)
from memstate.schema import Fact, Instance, Relation

INSTANCE = Instance(
    id="p", source="personamem", task="preference_update", perspective="none", question="Which city do I live in?",
    options=("Bergen", "Oslo"), answer="B", answer_kind="choice", labels=(),
    facts=(Fact("F1", "I live in Bergen.", "fact", time="2023-01-02", role="outdated"),
           Fact("F2", "I moved to Oslo.", "fact", time="2024-05-01")),
    relations=(Relation("F2", "SUPERSEDES", "F1"),),
)  # fmt: skip

PINNED_USER = """Memories:
[F1] (fact, global, 2023-01-02) I live in Bergen.
[F2] (fact, global, 2024-05-01) I moved to Oslo.

Relations:
F2 SUPERSEDES F1

Request:
Which city do I live in?
Options:
(A) Bergen
(B) Oslo

Rules for using the memories:
- Prefer F2; F1 is outdated.
- Answer from the current memory.

Answer with the letter of the correct option only."""


def test_the_responder_prompt_shows_the_relations_and_is_pinned():
    assert PROMPT_VERSION == "ms-prompts-v3"
    messages = responder_messages(INSTANCE, ("Prefer F2; F1 is outdated.", "Answer from the current memory."))
    assert messages == [{"role": "system", "content": RESPONDER_SYSTEM}, {"role": "user", "content": PINNED_USER}]


def test_the_state_comes_after_everything_shared():
    base = responder_messages(INSTANCE)[1]["content"]
    with_state = responder_messages(INSTANCE, ("Use F2.", "Ignore F1."))[1]["content"]
    shared = base.rsplit("\n\n", 1)[0]  # all but the answer instruction
    assert with_state.startswith(shared + "\n\nRules for using the memories:")
    assert "Relations:\nF2 SUPERSEDES F1" in shared


def test_policy_and_responder_see_the_same_relations_and_never_a_role():
    no_edges = Instance(**{**INSTANCE.__dict__, "relations": ()})
    assert "Relations:\n(none)" in responder_messages(no_edges)[1]["content"]
    for messages in (policy_messages(INSTANCE), responder_messages(INSTANCE)):
        text = messages[1]["content"]
        assert "F2 SUPERSEDES F1" in text and "outdated" not in text


def test_a_request_without_memories_reads_none():
    # The reward's answer-flow check asks with no memory at all; prompts with memories are unchanged (pinned above).
    text = responder_request_messages("Which city?", ("Bergen", "Oslo"), (), (), ("Prefer F2.", "Be brief."))
    assert text[1]["content"].startswith("Memories:\n(none)\n\nRelations:\n(none)\n\nRequest:\nWhich city?")
