"""What deployment sends is what training sent: for the same facts, relations, options and state, the policy prompt
of training, of the serve API and of ``memory ask`` (through the API), and the responder prompt of the reward and of
``memory ask``, are byte-identical (compared as the JSON that goes over the wire).

The deployed chain runs for real: ``memory.answer.ask`` (retrieval replaced by the instance's facts) posts the memory
pipeline's payload to the serve API (a FastAPI TestClient with the tiny policy's tokenizer, so facts are fitted to
the budget as in training), the API prompts a scripted policy, its state comes back through the client's parser and
goes to a responder that records what it is asked.
"""

from __future__ import annotations

import json

import pytest
from test_serve_api import GOOD, INSTANCE, ScriptedPolicy, client
from transformers import AutoTokenizer

from memstate.memory import answer as memory_answer
from memstate.memory.retrieve import Retrieved
from memstate.prompts import responder_messages
from memstate.reward.responder_score import judge
from memstate.serve.client import PATH, _state
from memstate.train.data import grpo_dataset


def wire(messages) -> str:
    return json.dumps(messages, ensure_ascii=False, sort_keys=True)


class RecordingResponder:
    """Records the prompts it is sent; answers "B" / a fixed log-prob."""

    name = identity = "recording"

    def __init__(self):
        self.prompts: list = []

    def answer(self, prompts, max_new_tokens=32):
        self.prompts += prompts
        return ["B"] * len(prompts)

    def answer_logprob(self, prompts, continuations):
        from memstate.responders import ContinuationLogprob

        self.prompts += prompts
        return [[ContinuationLogprob(-1.0, 1) for _ in c] for c in continuations]


class StateAPI:
    """``memory ask``'s view of the serve API: the request body it builds, posted to the app, the reply parsed by the
    client's own parser."""

    def __init__(self, api):
        self.api = api

    def reasoning_state(self, body: dict):
        reply = self.api.post(PATH, json=body)
        assert reply.status_code == 200, reply.text
        return _state(reply.json())


@pytest.mark.parametrize("budget", [None, 120], ids=["all-facts", "facts-truncated"])
def test_deployed_prompts_equal_training_prompts(tiny_models, monkeypatch, budget):
    tokenizer = AutoTokenizer.from_pretrained(tiny_models["policy"])
    max_prompt_tokens = budget or 8192
    # Training: the GRPO dataset's prompt (facts fitted to the budget).
    dataset, truncated = grpo_dataset([INSTANCE], tokenizer, max_prompt_tokens)
    assert truncated == (budget is not None)  # the small budget really cuts a fact
    training_policy_prompt = dataset[0]["prompt"]

    # Deployment: memory ask -> serve API -> policy; its rules -> responder.
    retrieved = Retrieved(INSTANCE.facts, INSTANCE.relations, tuple(f.id for f in INSTANCE.facts))
    monkeypatch.setattr(memory_answer, "retrieve", lambda *args, **kwargs: retrieved)
    policy, responder = ScriptedPolicy(GOOD), RecordingResponder()
    with client(policy, tokenizer=str(tiny_models["policy"]), max_prompt_tokens=max_prompt_tokens) as api:
        reply = memory_answer.ask(None, INSTANCE.question, responder, state_api=StateAPI(api),
                                  options=INSTANCE.candidates)  # fmt: skip
    (chat,) = policy.chats
    assert wire(chat["messages"]) == wire(training_policy_prompt)

    # The responder prompt: what the reward's judge sends for the same instance and state.
    assert reply.rules == ("Prefer F2 over F1: F2 supersedes it.", "Answer from the current memory only.")
    (deployed,) = responder.prompts
    training = RecordingResponder()
    judge(training, [INSTANCE], [reply.rules], "likelihood")
    (trained,) = training.prompts
    assert wire(deployed) == wire(trained) == wire(responder_messages(INSTANCE, reply.rules))
