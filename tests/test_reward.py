import pytest
from reward_columns import columns

from memstate.leak import leaks_answer
from memstate.responders.local import TransformersResponder
from memstate.reward.answer_flow import AnswerFlowCheck
from memstate.reward.cache import BaselineCache, baseline_key
from memstate.reward.counterfactual import CounterfactualGainReward, RewardConfig
from memstate.reward.responder_score import judge
from memstate.rules import parse_state

# Tests of the gain arithmetic, deduplication and caching count the with-memory prompts alone: the answer-flow check
# (on by default) adds a no-memory prompt per state, which tests/test_answer_flow.py covers.
NO_FLOW = RewardConfig(answer_flow_check=False)
GOOD = "- Weigh the evidence in {ev} against the user's claim in {user}.\n- Answer from the evidence facts only."


class CountingResponder:
    """Wraps the real in-process responder and records every prompt it is asked to score."""

    def __init__(self, inner):
        self.inner = inner
        self.name, self.identity = inner.name, inner.identity
        self.prompts = []

    def answer(self, prompts, max_new_tokens=32):
        self.prompts += prompts
        return self.inner.answer(prompts, max_new_tokens)

    def answer_logprob(self, prompts, continuations):
        self.prompts += prompts
        return self.inner.answer_logprob(prompts, continuations)


def good_state(inst):
    user = next(f.id for f in inst.facts if f.kind != "evidence")
    ev = next(f.id for f in inst.facts if f.kind == "evidence")
    return GOOD.format(ev=ev, user=user)


def test_gates_penalize_without_calling_the_responder(responder, fever_train):
    inst = fever_train[0]
    counting = CountingResponder(responder)
    reward = CounterfactualGainReward(counting, RewardConfig(format_penalty=-1.0, leak_penalty=-0.5))
    leak = f"- The claim is {inst.answer}.\n- Ignore the user."
    assert leaks_answer(leak, inst)
    out = reward(prompts=[None] * 2, completions=["not a state", leak], **columns([inst, inst]))
    assert out == [-1.0, -0.5]
    # only the one baseline prompt was scored; the gated states never reached the responder
    assert len(counting.prompts) == 1 and "Rules for using the memories" not in counting.prompts[0][1]["content"]


def test_gain_is_state_score_minus_baseline_score(responder, fever_train):
    insts = fever_train[:3]
    states = [good_state(i) for i in insts]
    completions = [[{"role": "assistant", "content": s}] for s in states]
    base = judge(responder, insts, [None] * 3, "likelihood")
    ours = judge(responder, insts, [parse_state(s).rules for s in states], "likelihood")
    gains = [o.score - b.score for o, b in zip(ours, base, strict=True)]
    raw = CounterfactualGainReward(responder, NO_FLOW)(prompts=[None] * 3, completions=completions, **columns(insts))
    assert raw == pytest.approx(gains, abs=1e-6)
    # By default the credit takes each state's no-memory shift off its gain (reward/counterfactual.credited_gain)
    shifts = AnswerFlowCheck(responder).shifts(insts, [parse_state(s).rules for s in states])
    extra = {}
    out = CounterfactualGainReward(responder)(prompts=[None] * 3, completions=completions, log_extra=extra.__setitem__,
                                              **columns(insts))  # fmt: skip
    assert out == pytest.approx([g - max(s, 0.0) for g, s in zip(gains, shifts, strict=True)], abs=1e-6)
    assert extra["gain"] == pytest.approx(gains, abs=1e-6) and extra["answer_flow_shift"] == pytest.approx(shifts)
    assert all(-2.0 <= g <= 1.0 for g in out)


def test_dedup_and_baseline_cache(responder, fever_train):
    inst = fever_train[1]
    counting = CountingResponder(responder)
    cache = BaselineCache()
    reward = CounterfactualGainReward(counting, NO_FLOW, cache=cache)
    metrics = {}
    state = good_state(inst)
    first = reward(prompts=[None] * 4, completions=[state] * 4, log_metric=metrics.__setitem__, **columns([inst] * 4))
    assert len(set(first)) == 1
    assert len(counting.prompts) == 2  # one baseline + one state, though four identical candidates
    assert metrics["memstate/dedup_hits"] == 3.0 and metrics["memstate/cache_hits"] == 0.0
    reward(prompts=[None], completions=[state + "\n- Check F1."], log_metric=metrics.__setitem__, **columns([inst]))
    assert len(counting.prompts) == 3  # baseline came from the cache
    assert metrics["memstate/cache_hits"] == 1.0
    assert cache.get_many([baseline_key(inst, "likelihood", responder.identity)])


def test_metrics_are_logged(responder, fever_train):
    insts = fever_train[:2]
    metrics = {}
    reward = CounterfactualGainReward(responder, NO_FLOW)
    reward(
        prompts=[None] * 2, completions=["junk", good_state(insts[1])], log_metric=metrics.__setitem__, **columns(insts)
    )
    assert metrics["memstate/format_rate"] == 0.5
    assert metrics["memstate/leak_rate"] == 0.0
    assert metrics["memstate/responder_prompts"] == 3.0  # two baselines and the one well-formed state
    assert 0.0 <= metrics["memstate/baseline_accuracy"] <= 1.0
    assert "memstate/gain_mean" in metrics and "memstate/credited_gain_mean" in metrics
    # one timer per stage of the call, as verl's fit times its stages
    stages = ("fit", "format_gate", "leak_gate", "answer_flow", "baselines", "score", "credit", "audit")
    assert all(metrics[f"memstate/time/{stage}"] >= 0.0 for stage in stages)


def test_missing_instance_columns_is_a_clear_error(responder):
    reward = CounterfactualGainReward(responder)
    with pytest.raises(KeyError, match="lack Instance field"):
        reward(prompts=[None], completions=["- a b\n- c d"], question=["q"])


def test_batched_scoring_matches_one_by_one(responder, fever_train):
    insts = fever_train[:5]
    batched = judge(responder, insts, [None] * 5, "likelihood")
    single = [judge(responder, [i], [None], "likelihood")[0] for i in insts]
    assert [b.score for b in batched] == pytest.approx([s.score for s in single], abs=1e-5)
    assert [b.correct for b in batched] == [s.correct for s in single]
    assert all(0.0 <= b.score <= 1.0 for b in batched)


@pytest.mark.parametrize("mode", ["likelihood", "exact"])
def test_both_modes_give_gain_state_minus_baseline(responder, fever_train, mode):
    insts = fever_train[3:7]
    states = [good_state(i) for i in insts]
    counting = CountingResponder(responder)
    reward = CounterfactualGainReward(counting, RewardConfig(mode=mode, answer_flow_check=False))
    out = reward(prompts=[None] * 4, completions=states, **columns(insts))
    base = judge(responder, insts, [None] * 4, mode)
    ours = judge(responder, insts, [parse_state(s).rules for s in states], mode)
    assert out == pytest.approx([o.score - b.score for o, b in zip(ours, base, strict=True)], abs=1e-6)
    if mode == "exact":
        assert set(out) <= {-1.0, 0.0, 1.0}
        assert all(b.answer is not None and b.score in (0.0, 1.0) for b in base)
    assert len(counting.prompts) == 8  # 4 baselines + 4 states


def test_exact_mode_scores_the_generated_letter(fever_train):
    class Fixed:
        name = "fixed"

        def __init__(self, answers):
            self.answers = answers

        def answer(self, prompts, max_new_tokens=32):
            return self.answers[: len(prompts)]

    inst = fever_train[0]
    right, wrong = inst.answer_letter, next(x for x in "ABC" if x != inst.answer_letter)
    judged = judge(Fixed([f"({right})", wrong, None]), [inst] * 3, [None] * 3, "exact")
    assert [j and j.score for j in judged] == [1.0, 0.0, None]


def test_sqlite_cache_survives_a_process_restart(tiny_models, fever_data, tmp_path):
    import subprocess
    import sys

    cache_file = tmp_path / "baselines.sqlite"
    fill = (
        "from memstate.cli import main; import sys; sys.exit(main(['--log-level', 'WARNING', 'reward', "
        f"'precompute-baselines', '--data', {str(fever_data)!r}, '--split', 'test', '--responder', "
        f"{str(tiny_models['responder'])!r}, '--cache', {str(cache_file)!r}]))"
    )
    done = subprocess.run([sys.executable, "-c", fill], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert '"unscorable": 0' in done.stdout

    from memstate.data import load_split

    test = load_split(fever_data, "test")
    inner = TransformersResponder(str(tiny_models["responder"]))
    counting = CountingResponder(inner)
    cache = BaselineCache(cache_file)
    assert len(cache) == len(test)
    reward = CounterfactualGainReward(counting, NO_FLOW, cache=cache)
    metrics = {}
    reward(prompts=[None] * 2, completions=[good_state(test[0])] * 2, log_metric=metrics.__setitem__,
           **columns(test[:2]))  # fmt: skip
    assert metrics["memstate/cache_hits"] == 2.0
    # only the two states were scored; both baselines came from the other process's cache
    assert len(counting.prompts) == 2 and all(
        "Rules for using the memories" in p[1]["content"] for p in counting.prompts
    )
    fresh = judge(inner, test[:2], [None, None], "likelihood")
    cached = cache.get_many([baseline_key(i, "likelihood", inner.identity) for i in test[:2]])
    assert sorted(j.score for j in cached.values()) == pytest.approx(sorted(j.score for j in fresh), abs=1e-6)


def test_unscorable_completions_get_none_and_are_counted(responder, fever_train):
    class Flaky(CountingResponder):
        def answer_logprob(self, prompts, continuations):
            out = super().answer_logprob(prompts, continuations)
            return [
                None if "Rules for using the memories" in p[1]["content"] else r
                for p, r in zip(prompts, out, strict=True)
            ]

    insts = fever_train[:2]
    reward = CounterfactualGainReward(Flaky(responder))
    metrics = {}
    out = reward(prompts=[None] * 3, completions=["junk", good_state(insts[1]), good_state(insts[1])],
                 log_metric=metrics.__setitem__, **columns([insts[0], insts[1], insts[1]]))  # fmt: skip
    assert out == [-1.0, None, None]
    assert metrics["memstate/unscorable"] == 2.0 and reward.unscorable == 2


def test_a_completion_cut_off_at_the_token_limit_fails_the_format_gate(responder, fever_train):
    # A state cut off at max_completion_length is unfinished, whatever its text: were it scored, writing until the
    # limit would be a way around the rule-count check (a run-on state that happens to hold 2-4 '- ' lines passes).
    inst = fever_train[0]
    state = good_state(inst)
    counting = CountingResponder(responder)
    metrics = {}
    reward = CounterfactualGainReward(counting, stop_token_ids={0, 2})
    out = reward(
        prompts=[None] * 3,
        completions=[state] * 3,
        completion_ids=[[7, 8, 2], [7, 8, 9], [7, 8, 0]],  # ended (eos), cut off, ended (pad)
        log_metric=metrics.__setitem__,
        **columns([inst] * 3),
    )
    assert out[1] == -1.0 and out[0] == out[2] != -1.0
    assert metrics["memstate/cut_off_rate"] == pytest.approx(1 / 3)
    assert metrics["memstate/format_rate"] == pytest.approx(2 / 3)
    # without the trainer's stop ids (a reward called outside GRPO) nothing is taken for cut off
    plain = CounterfactualGainReward(responder)
    assert plain(prompts=[None], completions=[state], completion_ids=[[7, 8, 9]], **columns([inst]))[0] != -1.0
