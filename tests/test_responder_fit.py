"""The responder's prompt is fitted to its context (reward/fit.py): facts dropped from the end, never the question, the
same facts with and without a state, the baseline cached under the request sent."""

import json

import pytest
from fake_openai_server import FaultyOpenAIServer
from reward_columns import columns

from memstate.evaluate.run import condition_records
from memstate.prompts import responder_messages
from memstate.responders.local import TransformersResponder
from memstate.responders.remote import OpenAIResponder
from memstate.reward.cache import BaselineCache, baseline_key
from memstate.reward.counterfactual import CounterfactualGainReward, RewardConfig
from memstate.reward.fit import RESERVE, cut_instance, fit_to_responder
from memstate.rules import parse_state
from memstate.schema import Fact, Instance, Relation

STATE = "- Weigh the evidence against the user's view.\n- Answer from the evidence facts only."
CONTEXT = 2048  # the fake server's max_model_len: RESERVE (1024) left for the no-state prompt, counted in bytes


def instance(iid: str, n_facts: int) -> Instance:
    facts = tuple(
        Fact(f"F{k}", f"Memory number {k}: the user mentioned a trip to a city on day {k}.", "fact")
        for k in range(1, n_facts + 1)
    )
    relations = (Relation("F2", "SUPERSEDES", "F1"), Relation(f"F{n_facts}", "SUPERSEDES", "F1"))
    return Instance(iid, "personamem", "preference_update", "none", "Which city does the user live in now?",
                    ("Bergen", "Oslo", "Tromso"), "B", "choice", (), facts, relations)  # fmt: skip


def prompt_bytes(messages) -> int:  # the fake server's token count of a chat prompt
    return len(json.dumps(messages).encode())


class Recording:
    """A responder that records every prompt it scores; everything else (context, counting) is the inner one's."""

    def __init__(self, inner):
        self.inner = inner
        self.prompts = []

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def answer_logprob(self, prompts, continuations):
        self.prompts += prompts
        return self.inner.answer_logprob(prompts, continuations)

    def answer(self, prompts, max_new_tokens=32):
        self.prompts += prompts
        return self.inner.answer(prompts, max_new_tokens)


def memories(messages) -> str:
    return messages[1]["content"].split("\n\nRequest:")[0]


def test_an_http_responder_is_shown_what_fits_its_context():
    big, small = instance("big", 40), instance("small", 3)
    assert prompt_bytes(responder_messages(big)) > CONTEXT  # today's prompt: refused, unscorable forever
    assert prompt_bytes(responder_messages(small)) <= CONTEXT - RESERVE
    with FaultyOpenAIServer(max_model_len=CONTEXT) as server:
        responder = OpenAIResponder(server.url, "fake-responder", timeout=5.0, max_retries=1, backoff=0.01)
        responder.check_health()
        assert responder.context_length == CONTEXT
        assert responder.answer_logprob([responder_messages(big)], [["A", "B", "C"]]) == [None]
        assert server.counts["too_long"] == 1

        recording, cache, metrics = Recording(responder), BaselineCache(), {}
        reward = CounterfactualGainReward(
            recording, RewardConfig(answer_flow_check=False), cache
        )  # memory prompts only
        out = reward(prompts=[None] * 4, completions=[STATE] * 4, log_metric=metrics.__setitem__,
                     **columns([big, big, small, small]))  # fmt: skip
        responder.close()
    assert all(isinstance(r, float) for r in out) and reward.unscorable == 0 and metrics["memstate/unscorable"] == 0
    assert server.counts["too_long"] == 1  # only the request sent above, before fitting
    assert metrics["memstate/responder_facts_cut"] == 1.0 and reward.facts_cut == 1

    [fitted] = fit_to_responder(responder, [big])
    n = len(fitted.facts)
    assert 1 < n < len(big.facts) and fitted.question == big.question and fitted == cut_instance(big, n)
    assert prompt_bytes(responder_messages(fitted)) <= CONTEXT - RESERVE  # fits...
    assert prompt_bytes(responder_messages(cut_instance(big, n + 1))) > CONTEXT - RESERVE  # ...with the most facts
    assert [r.dst for r in fitted.relations] == ["F1"]  # the edge from a dropped fact is gone, the other kept

    sent = {p[1]["content"]: p for p in recording.prompts}
    big_prompts = [p for p in sent.values() if "Memory number 4:" in p[1]["content"]]
    small_prompts = [p for p in sent.values() if p not in big_prompts]
    assert len(big_prompts) == 2 and len(small_prompts) == 2  # each: a baseline and one state (deduplicated)
    # The baseline and the with-state prompt show the same facts: those of the fitted instance.
    assert {memories(p) for p in big_prompts} == {memories(responder_messages(fitted))}
    assert responder_messages(fitted) in big_prompts
    assert all(prompt_bytes(p) + 1 <= CONTEXT for p in recording.prompts)
    # An instance within budget is sent as it is, with and without the state.
    assert responder_messages(small) in small_prompts
    assert responder_messages(small, parse_state(STATE).rules) in small_prompts
    # The baseline is cached under the request sent: the fitted instance's.
    assert cache.get_many([baseline_key(fitted, "likelihood", responder.identity)])
    assert not cache.get_many([baseline_key(big, "likelihood", responder.identity)])


def test_fitting_is_idempotent_and_a_responder_without_a_context_cuts_nothing():
    big = instance("big2", 40)

    class Counting:
        name = identity = "counting"
        context_length = CONTEXT

        def __init__(self):
            self.counted = 0

        def count_prompt_tokens(self, prompts):
            self.counted += len(prompts)
            return [prompt_bytes(p) for p in prompts]

    counting = Counting()
    [fitted] = fit_to_responder(counting, [big])
    assert fitted is not big and len(fitted.facts) < len(big.facts)
    counted = counting.counted
    again = fit_to_responder(counting, [big, fitted])
    assert again[0] == fitted and again[1] is fitted and counting.counted == counted  # measured once per process

    class Plain:  # a responder from before: no context_length, no count_prompt_tokens
        name = identity = "plain"

    assert all(a is b for a, b in zip(fit_to_responder(Plain(), [big, fitted]), [big, fitted], strict=True))
    unknown = Counting()
    unknown.context_length = None  # an HTTP server that reports no max_model_len
    assert fit_to_responder(unknown, [big])[0] is big and unknown.counted == 0


def test_an_in_process_responder_is_fitted_to_its_positions(tiny_models, fever_train):
    responder = TransformersResponder(str(tiny_models["responder"]), batch_size=8)
    assert responder.context_length == 4096  # the tiny model's max_position_embeddings
    inst = max(fever_train, key=lambda i: len(i.facts))
    tokens = responder.count_prompt_tokens([responder_messages(inst)])[0]
    assert tokens == len(responder.prompt_ids(responder_messages(inst)))
    assert fit_to_responder(responder, [inst])[0] is inst  # as today: every prompt fits

    responder.context_length = RESERVE + tokens - 1  # one token short
    recording, metrics = Recording(responder), {}
    reward = CounterfactualGainReward(recording, RewardConfig(answer_flow_check=False))  # the prompts with memories
    out = reward(prompts=[None], completions=[STATE], log_metric=metrics.__setitem__, **columns([inst]))
    assert isinstance(out[0], float) and metrics["memstate/responder_facts_cut"] == 1.0
    [fitted] = fit_to_responder(responder, [inst])
    assert len(fitted.facts) < len(inst.facts)
    assert len(responder.prompt_ids(responder_messages(fitted))) <= tokens - 1
    assert {memories(p) for p in recording.prompts} == {memories(responder_messages(fitted))}

    # Evaluation shows the responder the same fitted instance in every condition.
    rules = {"no_state": [None], "checkpoint": [parse_state(STATE).rules]}
    [record] = condition_records(responder, [inst], ["no_state", "checkpoint"], rules, {}, "likelihood")
    assert record["id"] == inst.id and record["no_state"]["tokens"] <= tokens - 1
    baseline = reward.baselines([inst])[inst.id]  # the reward's baseline of the same fitted prompt
    assert record["no_state"]["score"] == pytest.approx(baseline.score, abs=1e-6)
