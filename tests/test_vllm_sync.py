"""``check_vllm_weights`` (train/vllm_sync.py) on a stand-in for a colocated vLLM, without vLLM.

The stand-in lays the tiny policy's weights out as vLLM 0.31 does (q/k/v and gate/up fused along dim 0, bf16, the
embedding padded to a multiple of 64 rows, lm_head tied away) and loads them the way TRL's ``sync_weights`` does. The
real thing runs in tests/test_colocate.py (marker ``colocate``); here: a faithful copy passes, and every way a copy
can go wrong (one element off by one bf16 step, the k and v halves swapped, a tensor left stale, one missing) is
caught, names the tensor and stops training.
"""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
import torch
from torch import nn
from transformers import AutoModelForCausalLM

from memstate.errors import ConfigError
from memstate.train.vllm_sync import VLLMWeightCheck, VLLMWeightMismatch, compare_weights

FUSED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}


def vllm_layout(policy: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The policy's parameters as vLLM holds them: fused, bf16, vocabulary padded to a multiple of 64."""
    out: dict[str, torch.Tensor] = {}
    for name, tensor in policy.items():
        for fused, parts in FUSED.items():
            if f".{parts[0]}." in name:
                tensors = [policy[name.replace(f".{parts[0]}.", f".{p}.")] for p in parts]
                out[name.replace(f".{parts[0]}.", f".{fused}.")] = torch.cat(tensors).to(torch.bfloat16)
        if not any(f".{p}." in name for parts in FUSED.values() for p in parts):
            tensor = tensor.to(torch.bfloat16)
            if "embed_tokens" in name:
                padded = -(-tensor.shape[0] // 64) * 64
                tensor = torch.cat([tensor, torch.zeros(padded - tensor.shape[0], *tensor.shape[1:]).bfloat16()])
            out[name] = tensor
    return out


@pytest.fixture(scope="module")
def policy(tiny_models):
    model = AutoModelForCausalLM.from_pretrained(tiny_models["policy"])
    assert model.config.tie_word_embeddings and "lm_head.weight" not in dict(model.named_parameters())
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def test_faithful_copy_passes(policy):
    vllm = vllm_layout(policy)
    result = compare_weights(vllm, policy.items())
    assert result.mismatched == []
    assert result.checked == len(vllm) < len(policy)  # fused: fewer tensors in vLLM
    assert result.max_abs_diff == 0.0


def test_each_kind_of_bad_copy_is_caught(policy):
    qkv = "model.layers.1.self_attn.qkv_proj.weight"
    q_rows = policy["model.layers.1.self_attn.q_proj.weight"].shape[0]
    cases = {}
    vllm = vllm_layout(policy)
    # one element of the k slice, off by the smallest bf16 step
    vllm[qkv] = vllm[qkv].clone()
    vllm[qkv][q_rows, 0] = (vllm[qkv][q_rows, 0].float() * (1 + 2**-7) + 2**-20).bfloat16()
    assert vllm[qkv][q_rows, 0] != vllm_layout(policy)[qkv][q_rows, 0]
    cases["one element"] = vllm
    # k and v swapped (same shape with one KV head: only the values tell)
    vllm = vllm_layout(policy)
    k = policy["model.layers.1.self_attn.k_proj.weight"]
    v = policy["model.layers.1.self_attn.v_proj.weight"]
    assert k.shape == v.shape
    q = policy["model.layers.1.self_attn.q_proj.weight"]
    vllm[qkv] = torch.cat([q, v, k]).bfloat16()
    cases["k/v swapped"] = vllm
    # a stale tensor: the policy took a step, vLLM kept the old values
    vllm = vllm_layout(policy)
    updated = dict(policy)
    updated["model.norm.weight"] = policy["model.norm.weight"] + 0.01
    cases["stale"] = (vllm, updated)
    # a parameter vLLM does not have at all
    vllm = vllm_layout(policy)
    del vllm["model.layers.0.mlp.down_proj.weight"]
    cases["missing"] = vllm
    expected_name = {
        "one element": qkv,
        "k/v swapped": qkv,
        "stale": "model.norm.weight",
        "missing": "model.layers.0.mlp.down_proj.weight",
    }
    for case, value in cases.items():
        vllm, reference = value if isinstance(value, tuple) else (value, policy)
        result = compare_weights(vllm, reference.items())
        assert len(result.mismatched) == 1, (case, result.mismatched)
        assert result.mismatched[0].startswith(expected_name[case]), (case, result.mismatched)
        if case != "missing":
            assert result.max_abs_diff > 0, case


class FakeColocatedGeneration:
    """TRL 1.16's VLLMGeneration as the check sees it: ``llm`` (the in-process vLLM model), ``_iter_named_params``
    and ``sync_weights`` (which here loads the policy faithfully unless told to skip a tensor)."""

    def __init__(self, policy_module: nn.Module):
        self.policy_module = policy_module
        held = vllm_layout({n: p.detach() for n, p in policy_module.named_parameters()})
        self.vllm_model = nn.Module()
        self.vllm_model._params = nn.ParameterDict({n.replace(".", "__"): nn.Parameter(t) for n, t in held.items()})
        self.vllm_model.named_parameters = lambda: (
            (n.replace("__", "."), p) for n, p in self.vllm_model._params.items()
        )
        self.llm = SimpleNamespace(apply_model=lambda func: [func(self.vllm_model)])  # vllm.LLM.apply_model
        self.skip: str | None = None

    def _iter_named_params(self):
        yield from ((n, p.detach()) for n, p in self.policy_module.named_parameters())

    def sync_weights(self):
        fresh = vllm_layout(dict(self._iter_named_params()))
        with torch.no_grad():
            for name, tensor in fresh.items():
                if name != self.skip:
                    self.vllm_model._params[name.replace(".", "__")].copy_(tensor)


def fake_trainer(generation, **args):
    metrics: dict[str, list[float]] = {}
    defaults = {"use_vllm": True, "vllm_mode": "colocate", "vllm_tensor_parallel_size": 1}
    return SimpleNamespace(
        args=SimpleNamespace(**(defaults | args)),
        vllm_generation=generation,
        state=SimpleNamespace(global_step=0),
        metrics=metrics,
        _log_metric=lambda name, value: metrics.setdefault(name, []).append(value),
    )


def test_the_wrapped_sync_logs_each_check_and_stops_at_a_bad_one(tiny_models, caplog):
    model = AutoModelForCausalLM.from_pretrained(tiny_models["policy"])
    generation = FakeColocatedGeneration(model)
    trainer = fake_trainer(generation)
    check = VLLMWeightCheck(trainer)
    with caplog.at_level(logging.INFO, logger="memstate.train"):
        for step in (0, 1):
            trainer.state.global_step = step
            with torch.no_grad():
                model.model.norm.weight.add_(0.25)  # an optimizer step
            generation.sync_weights()
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("vllm weight sync")]
    n = len(list(generation.vllm_model.named_parameters()))
    assert lines == [f"vllm weight sync {i} at step {i - 1}: {n} tensors equal (max |diff| 0)" for i in (1, 2)]
    assert trainer.metrics == {
        "vllm_sync/checked": [n, n],
        "vllm_sync/max_abs_diff": [0.0, 0.0],
        "vllm_sync/syncs": [1.0, 2.0],
    }
    # A sync that leaves one tensor stale: the check raises, naming it.
    generation.skip = "model.norm.weight"
    with torch.no_grad():
        model.model.norm.weight.add_(0.25)
    with pytest.raises(VLLMWeightMismatch, match=r"vllm weight sync 3 at step 1: 1 tensor\(s\) differ.*model\.norm"):
        generation.sync_weights()
    assert check.syncs == 3 and trainer.metrics["vllm_sync/max_abs_diff"][-1] == pytest.approx(0.25, rel=0.01)


@pytest.mark.parametrize("args", [{"use_vllm": False}, {"vllm_mode": "server"}, {"vllm_tensor_parallel_size": 2}])
def test_only_colocate_with_one_rank_per_model(tiny_models, args):
    with pytest.raises(ConfigError, match="check_vllm_weights"):
        VLLMWeightCheck(fake_trainer(SimpleNamespace(), **args))
