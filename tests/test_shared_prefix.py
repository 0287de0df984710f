"""The shared-prefix log-prob path (train/shared_prefix.py) against TRL's own: per-token log-probs and entropies,
GRPO-loss gradients, the first-use check and its fallback, the cases it hands back to TRL."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch
from datasets import Dataset
from peft import LoraConfig
from transformers import AutoConfig, AutoTokenizer
from trl import GRPOConfig

from memstate.train import packing, shared_prefix
from memstate.train.packing import pack_groups
from memstate.train.shared_prefix import (
    SUPPORTED_TRL,
    SharedPrefixConfig,
    SharedPrefixGRPOTrainer,
    UnsupportedTRL,
    unsupported_model_reason,
)

PROMPT_LENGTHS = (4, 13, 9)  # three groups of different prompt lengths, so the shorter prompts are left-padded
GROUP_OF_ROW = (0, 1, 0, 2, 1, 0, 2, 1, 0)  # rows of a group interleaved, as after TRL's shuffle; sizes 4, 3, 2
COMPLETION_WIDTH = 11
ROOT = Path(__file__).resolve().parents[1]


def zero_reward(completions, **kwargs):
    return [0.0] * len(completions)


def make_trainer(tiny_models, tmp_path, *, lora: bool, check: str = "logps") -> SharedPrefixGRPOTrainer:
    tokenizer = AutoTokenizer.from_pretrained(tiny_models["policy"])
    config = GRPOConfig(
        output_dir=str(tmp_path / "out"), use_cpu=True, bf16=False, per_device_train_batch_size=8,
        num_generations=4, max_completion_length=COMPLETION_WIDTH, report_to="none", beta=0.001, seed=0,
    )  # fmt: skip
    peft = LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, target_modules=["q_proj", "v_proj", "up_proj"])
    trainer = SharedPrefixGRPOTrainer(
        model=str(tiny_models["policy"]),
        reward_funcs=[zero_reward],
        args=config,
        train_dataset=Dataset.from_list([{"prompt": [{"role": "user", "content": "hi"}]}] * 8),
        processing_class=tokenizer,
        peft_config=peft if lora else None,
        shared_prefix=SharedPrefixConfig(check=check),
    )
    if lora:  # a fresh adapter is a no-op (B = 0): give it weight so the adapted path is really exercised
        with torch.no_grad():
            for name, param in trainer.model.named_parameters():
                if "lora_B" in name:
                    param.normal_(std=0.05)
    return trainer


@pytest.fixture(scope="module", params=[False, True], ids=["full", "lora"])
def trainer(request, tiny_models, tmp_path_factory):
    return make_trainer(tiny_models, tmp_path_factory.mktemp("shared-prefix"), lora=request.param)


@pytest.fixture(params=["dense", "flex", "split"])
def fresh(trainer, request):
    """The module's trainer with the path on (its mask dense, a FlexAttention block mask, or split attention) and the
    check done, restored after the test."""
    trainer.shared_prefix_reason, trainer._logps_checked = None, True
    trainer.shared_prefix_attention = request.param
    yield trainer
    trainer.shared_prefix_reason, trainer._logps_checked = None, True
    trainer.shared_prefix_attention = "dense"


def leaky(correct):
    """``attends`` broken: every completion also sees the other completions of its group (dense and flex alike)."""
    return lambda q, kv, q_segment, kv_segment, kv_valid: correct(q, kv, 0 * q_segment, 0 * kv_segment, kv_valid)


def leaky_split(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """Split attention broken: one unmasked call over each packed row, so completions see their siblings (and
    every token the future)."""
    out = torch.nn.functional.scaled_dot_product_attention(query, key, value, scale=scaling, enable_gqa=True)
    return out.transpose(1, 2), None


def grpo_batch(vocab: int, pad: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, int]:
    """TRL's layout: prompts left-padded to a common width, completions right-padded, one ending at its first token
    and one with no scored token at all (a masked truncated completion)."""
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(5, vocab, (n,), generator=g) for n in PROMPT_LENGTHS]
    width = max(PROMPT_LENGTHS)
    rows = len(GROUP_OF_ROW)
    prompt_ids, prompt_mask = torch.full((rows, width), pad), torch.zeros(rows, width, dtype=torch.long)
    for row, group in enumerate(GROUP_OF_ROW):
        prompt_ids[row, width - len(prompts[group]) :] = prompts[group]
        prompt_mask[row, width - len(prompts[group]) :] = 1
    completion_ids = torch.randint(5, vocab, (rows, COMPLETION_WIDTH), generator=g)
    ends = [COMPLETION_WIDTH, 5, 1, 8, 0, COMPLETION_WIDTH, 3, 6, 10]
    completion_mask = (torch.arange(COMPLETION_WIDTH)[None] < torch.tensor(ends)[:, None]).long()
    completion_ids = completion_ids.masked_fill(completion_mask == 0, pad)
    return torch.cat([prompt_ids, completion_ids], 1), torch.cat([prompt_mask, completion_mask], 1), COMPLETION_WIDTH


def stock(trainer, *args, **kwargs):
    """TRL's path, through the same trainer (its shared-prefix path switched off for the call)."""
    reason, trainer.shared_prefix_reason = trainer.shared_prefix_reason, "stock path for comparison"
    try:
        return trainer._get_per_token_logps_and_entropies(*args, **kwargs)
    finally:
        trainer.shared_prefix_reason = reason


def batch(trainer, seed=0):
    return grpo_batch(len(trainer.processing_class), trainer.processing_class.pad_token_id, seed)


@pytest.mark.parametrize("batch_size", [None, 4])
def test_logps_and_entropies_equal_trl(fresh, batch_size):
    input_ids, attention_mask, keep = batch(fresh)
    fresh.model.eval()
    with torch.no_grad():
        ref_logps, ref_entropy, _ = stock(fresh, fresh.model, input_ids, attention_mask, keep, batch_size, True)
        logps, entropy, _ = fresh._get_per_token_logps_and_entropies(
            fresh.model, input_ids, attention_mask, keep, batch_size, True
        )
    assert fresh.shared_prefix_active and fresh.shared_prefix_mask == fresh.shared_prefix_attention
    scored = attention_mask[:, -keep:].bool()
    assert (logps - ref_logps).abs()[scored].max() <= 1e-5
    assert (entropy - ref_entropy).abs()[scored].max() <= 1e-5
    assert logps[~scored].abs().max() == 0 and ref_logps[~scored].abs().max() == 0
    assert ref_logps[scored].std() > 0.05  # the comparison has something to compare: log-probs vary by token


def test_grpo_loss_gradients_equal_trl(fresh):
    input_ids, attention_mask, keep = batch(fresh, seed=1)
    model = fresh.model
    model.train()
    prompt_len = input_ids.size(1) - keep
    with torch.no_grad():
        current, _, _ = stock(fresh, model, input_ids, attention_mask, keep)
    g = torch.Generator().manual_seed(2)
    inputs = {
        "prompt_ids": input_ids[:, :prompt_len],
        "prompt_mask": attention_mask[:, :prompt_len],
        "completion_ids": input_ids[:, prompt_len:],
        "completion_mask": attention_mask[:, prompt_len:],
        "advantages": torch.randn(input_ids.size(0), generator=g),
        # off-policy and reference log-probs away from the current ones, so ratio, clipping and KL all take part
        "old_per_token_logps": current + 0.3 * torch.randn(current.shape, generator=g),
        "ref_per_token_logps": current + 0.5 * torch.randn(current.shape, generator=g),
        "num_items_in_batch": attention_mask[:, prompt_len:].sum(),
    }
    params = [p for p in model.parameters() if p.requires_grad]
    fresh.current_gradient_accumulation_steps = 1  # set by the training loop, read by the loss's normalizer

    def gradients() -> list[torch.Tensor]:
        return torch.autograd.grad(fresh._compute_loss(model, inputs), params)

    packed = gradients()
    # torch has no FlexAttention backward on CPU: there flex's gradient pass is split attention (the GPU check,
    # benchmarks/gpu/, compares flex gradients)
    assert fresh.shared_prefix_mask == {"flex": "split"}.get(
        fresh.shared_prefix_attention, fresh.shared_prefix_attention
    )
    fresh.shared_prefix_reason = "stock path for comparison"
    reference = gradients()
    worst = max(((a - b).norm() / b.norm()).item() for a, b in zip(packed, reference, strict=True) if b.norm() > 0)
    assert worst <= 1e-4
    assert sum(b.norm() > 0 for b in reference) >= len(params) // 2


def test_one_prompt_per_group_is_encoded_once(trainer):
    input_ids, attention_mask, keep = batch(trainer)
    packed = pack_groups(input_ids, attention_mask, keep, pad_token_id=0)
    assert packed.input_ids.shape[0] == len(set(GROUP_OF_ROW))
    scored_ends = attention_mask[:, -keep:].sum(1)
    # each group: its prompt minus the last token once, then each completion's scored span (led by that last token)
    real_tokens = (packed.attention_mask[:, 0].diagonal(dim1=-2, dim2=-1) & (packed.position_ids >= 0)).sum()
    assert real_tokens == packed.input_ids.numel()
    per_group = [
        max(PROMPT_LENGTHS)
        - 1  # the prompt columns (the longest prompt has no padding) but the last
        + sum(int(scored_ends[r]) for r, g in enumerate(GROUP_OF_ROW) if g == group)
        for group in range(3)
    ]
    assert packed.input_ids.shape[1] == max(per_group)
    assert (packed.shift_labels != -100).sum() == attention_mask[:, -keep:].sum()


def test_the_block_mask_is_the_dense_pattern_in_a_fraction_of_its_bytes(trainer):
    from memstate.train.dry_run import mask_memory

    # one group of 4 completions of 100 tokens after a 300-token prompt: 700 tokens, 6 blocks of 128
    prompt = torch.randint(5, 50, (1, 300)).expand(4, -1)
    input_ids = torch.cat([prompt, torch.randint(5, 50, (4, 100))], 1)
    attention_mask, keep = torch.ones_like(input_ids), 100
    packed = pack_groups(input_ids, attention_mask, keep, pad_token_id=0, multiple=packing.FLEX_BLOCK)
    rows, length = packed.input_ids.shape
    assert length % packing.FLEX_BLOCK == 0
    block = packed.block_mask()
    dense = block.to_dense().bool()  # (rows, 1, blocks, blocks): which blocks the kernel visits
    blocks = packed.attention_mask.unflatten(2, (-1, 128)).unflatten(4, (-1, 128)).any(dim=(3, 5))
    assert torch.equal(dense, blocks)  # it visits exactly the blocks the dense pattern touches
    assert dense.float().mean() < 1  # and skips some
    nbytes = sum(t.numel() * t.element_size() for t in block.as_tuple() if isinstance(t, torch.Tensor))
    report = mask_memory(rows, 300, 4, 100)
    assert report.endswith(f"flex block mask {nbytes / 2**10:.0f} KiB")
    split = packing.packed_mask_bytes(pack_groups(input_ids, attention_mask, keep, pad_token_id=0), "split")
    assert f"split {split / 2**20:.1f} MiB" in report and split < 0.1 * packed.attention_mask.numel()


def test_broken_mask_is_caught_and_falls_back(fresh, monkeypatch, caplog):
    monkeypatch.setattr(packing, "attends", leaky(packing.attends))
    monkeypatch.setattr(packing, "split_attention", leaky_split)
    input_ids, attention_mask, keep = batch(fresh)
    fresh._logps_checked = False
    fresh.model.eval()
    with torch.no_grad(), caplog.at_level(logging.WARNING, "memstate.train"):
        logps, _, _ = fresh._get_per_token_logps_and_entropies(fresh.model, input_ids, attention_mask, keep)
        ref_logps, _, _ = stock(fresh, fresh.model, input_ids, attention_mask, keep)
    assert not fresh.shared_prefix_active
    assert "first-use check failed: log-probs differ" in fresh.shared_prefix_reason
    assert "shared-prefix training off" in caplog.text
    assert torch.equal(logps, ref_logps)  # the call itself already used TRL's path


@pytest.mark.parametrize("failure", ["raises", "leaks"])
@pytest.mark.parametrize("path", ["flex", "split"])
def test_a_path_that_fails_its_check_continues_on_the_dense_mask(trainer, path, failure, monkeypatch, caplog):
    """A flex or split kernel that does not compile or run here, or a pattern that lets completions see their
    siblings: the first-use check moves the run to the dense mask, checks that, and stays on the shared-prefix path."""
    from torch.nn.attention.flex_attention import create_block_mask

    def broken_block_mask(self):
        if failure == "raises":
            raise RuntimeError("no flex kernel for this device")
        rows, length = self.segment.shape
        segment, valid = self.segment.clamp(max=0), self.valid  # every completion token in the prompt's segment

        def mask_mod(b, h, q, kv):
            return packing.attends(q, kv, segment[b, q], segment[b, kv], valid[b, kv])

        return create_block_mask(mask_mod, rows, None, length, length)

    def broken_split(*args, **kwargs):
        if failure == "raises":
            raise RuntimeError("no split kernel for this device")
        return leaky_split(*args, **kwargs)

    monkeypatch.setattr(packing.PackedGroups, "block_mask", broken_block_mask)
    monkeypatch.setattr(packing, "split_attention", broken_split)
    input_ids, attention_mask, keep = batch(trainer)
    trainer.shared_prefix_attention, trainer._logps_checked = path, False
    trainer.model.eval()
    try:
        with torch.no_grad(), caplog.at_level(logging.INFO, "memstate.train"):
            logps, _, _ = trainer._get_per_token_logps_and_entropies(trainer.model, input_ids, attention_mask, keep)
            ref_logps, _, _ = stock(trainer, trainer.model, input_ids, attention_mask, keep)
        assert trainer.shared_prefix_active and trainer.shared_prefix_attention == "dense"
        assert trainer.shared_prefix_mask == "dense"
        assert f"{path} attention off (first-use check failed" in caplog.text
        assert (f"no {path} kernel" if failure == "raises" else "log-probs differ") in caplog.text
        scored = attention_mask[:, -keep:].bool()
        assert (logps - ref_logps).abs()[scored].max() <= 1e-5
    finally:
        trainer.shared_prefix_reason, trainer._logps_checked = None, True
        trainer.shared_prefix_attention = "dense"


def test_auto_is_split_attention_on_cpu(tiny_models, tmp_path):
    assert make_trainer(tiny_models, tmp_path, lora=False).shared_prefix_attention == "split"


def test_correct_mask_passes_both_checks(tiny_models, tmp_path, caplog):
    trainer = make_trainer(tiny_models, tmp_path, lora=False, check="gradients")
    input_ids, attention_mask, keep = batch(trainer)
    trainer.model.train()
    with caplog.at_level(logging.INFO, "memstate.train"):
        trainer._get_per_token_logps_and_entropies(trainer.model, input_ids, attention_mask, keep)
    assert trainer.shared_prefix_active, trainer.shared_prefix_reason
    assert "log-probs mean |Δ|" in caplog.text and "gradients worst relative difference" in caplog.text


def test_inputs_it_does_not_pack_go_to_trl(fresh):
    input_ids, attention_mask, keep = batch(fresh)
    with torch.no_grad():
        fresh._get_per_token_logps_and_entropies(
            fresh.model, input_ids, attention_mask, keep, token_type_ids=torch.zeros_like(input_ids)
        )
    assert "token-type ids" in fresh.shared_prefix_reason


def test_models_it_cannot_mask_are_refused(tiny_models):
    config = AutoConfig.from_pretrained(tiny_models["policy"])
    model = type("M", (), {"config": config})()
    assert unsupported_model_reason(model) is None
    config._attn_implementation = "flash_attention_2"
    assert "takes no custom 4-D mask" in unsupported_model_reason(model)
    config._attn_implementation = "sdpa"
    config.layer_types = ["sliding_attention", "full_attention"]
    assert "sliding-window" in unsupported_model_reason(model)


def test_training_matches_trl_with_checkpointing_regrouping_and_two_iterations(tiny_models, fever_data, tmp_path):
    """The same short run with the path on and off: 2 micro-batches of 4 per generation round (so TRL's shuffle
    splits groups and the regrouping puts them back), each round optimized twice (old-policy log-probs computed),
    activation checkpointing on. Same seed, same samples: rewards, losses and gradient norms agree. (The logged
    ``kl`` does not: it is a mean of per-micro-batch token means, and the micro-batches hold other completions.)"""
    from memstate.train.config import parse_train_args
    from memstate.train.run import train

    def run(name: str, shared: bool) -> list[dict]:
        out = tmp_path / name
        train(
            *parse_train_args(
                [
                    "--config", str(ROOT / "configs" / "train" / "tiny_cpu.yaml"),
                    "--policy_model", str(tiny_models["policy"]),
                    "--responder_model", str(tiny_models["responder"]),
                    "--data_dir", str(fever_data),
                    "--output_dir", str(out),
                    "--max_steps", "4",
                    "--logging_steps", "1",
                    # a policy that ends some states and not others within the budget: rewards vary (a state cut
                    # off at the limit scores -1), so there is a gradient to compare
                    "--format_warmup_steps", "30",
                    "--format_warmup_lr_scheduler_type", "constant",
                    "--max_completion_length", "48",
                    "--per_device_train_batch_size", "4",
                    "--gradient_accumulation_steps", "2",
                    "--steps_per_generation", "2",
                    "--num_iterations", "2",
                    "--activation_checkpointing", "true",
                    "--beta", "0.1",  # a KL term the loss feels: the reference log-probs are compared too
                    "--save_strategy", "no",
                    "--report_to", "none",
                    "--shared_prefix_training", str(shared).lower(),
                ]
            )
        )  # fmt: skip
        if shared:
            assert json.loads((out / "shared_prefix.json").read_text())["active"]
        return [e for e in json.loads((out / "log_history.json").read_text()) if "loss" in e]

    packed, reference = run("shared", True), run("stock", False)
    assert len(packed) == len(reference) == 4  # 4 optimizer steps; a generation round every 2 (rewards logged then)
    assert any(e["grad_norm"] > 0 for e in reference)  # the rewards varied: there was a gradient to compare
    for a, b in zip(packed, reference, strict=True):
        assert a.get("reward") == pytest.approx(b.get("reward"), abs=1e-6)
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-3, abs=1e-6)
        assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-3, abs=1e-6)
    # after regrouping each micro-batch of 4 is one whole group: its prompt once, so well over 2x fewer tokens
    assert all(e["shared_prefix/token_ratio"] > 2 for e in packed if "shared_prefix/token_ratio" in e)
    assert any("shared_prefix/token_ratio" in e for e in packed)


def test_a_chunk_it_cannot_pack_goes_to_trl_alone(fresh, caplog):
    """A right-padded prompt (TRL left-pads, so never expected) is refused by the packing; that chunk is scored by
    TRL's path, the path stays on for the others."""
    input_ids, attention_mask, keep = batch(fresh)
    prompt_len = input_ids.size(1) - keep
    attention_mask = attention_mask.clone()
    attention_mask[0, prompt_len - 1] = 0  # the last prompt column of row 0 is padding
    fresh.model.eval()
    with torch.no_grad(), caplog.at_level(logging.WARNING, "memstate.train"):
        logps, _, _ = fresh._get_per_token_logps_and_entropies(fresh.model, input_ids, attention_mask, keep, 4)
        ref_logps, _, _ = stock(fresh, fresh.model, input_ids, attention_mask, keep, 4)
    assert "prompts are not left-padded" in caplog.text and fresh.shared_prefix_active
    assert torch.equal(logps[:4], ref_logps[:4])  # the refused chunk: TRL's own numbers
    scored = attention_mask[4:, -keep:].bool()
    assert (logps[4:] - ref_logps[4:]).abs()[scored].max() <= 1e-5


def test_a_run_that_must_not_fall_back_stops_with_the_fix(fresh, monkeypatch):
    """shared_prefix_on_failure: fail (production): TRL's path would need G x the prompt activations per micro-batch,
    so a failed first-use check stops the run, naming the fix, instead of running out of memory later."""
    monkeypatch.setattr(packing, "attends", leaky(packing.attends))
    monkeypatch.setattr(packing, "split_attention", leaky_split)
    monkeypatch.setattr(fresh, "shared_prefix_on_failure", "fail")
    input_ids, attention_mask, keep = batch(fresh)
    fresh._logps_checked = False
    with torch.no_grad(), pytest.raises(shared_prefix.SharedPrefixUnavailable) as raised:
        fresh._get_per_token_logps_and_entropies(fresh.model, input_ids, attention_mask, keep)
    message = str(raised.value)
    assert "first-use check failed: log-probs differ" in message
    assert "shared_prefix_training: false) and a per_device_train_batch_size that fits" in message


# ---- as a TRL user takes it: plain GRPOTrainer arguments, the TRL-version guard, what it refuses at construction ----


def plain_trl_trainer(policy, tmp_path, dataset: Dataset, reward_funcs, shared_prefix=None, **config):
    """A SharedPrefixGRPOTrainer built exactly as TRL's docs build a GRPOTrainer (a model path, reward functions, a
    GRPOConfig, a prompt dataset): no memstate schema, prompts or rewards."""
    args = GRPOConfig(
        output_dir=str(tmp_path / "out"), use_cpu=True, per_device_train_batch_size=4, num_generations=4,
        max_completion_length=8, max_steps=2, logging_steps=1, report_to="none", seed=0, **config,
    )  # fmt: skip
    return SharedPrefixGRPOTrainer(
        model=str(policy), reward_funcs=reward_funcs, args=args, train_dataset=dataset, shared_prefix=shared_prefix
    )


def test_a_plain_trl_run_trains_on_the_shared_prefix_path(tiny_models, tmp_path, caplog):
    calls = []

    def reward_short_completions(completions: list[str], **kwargs) -> list[float]:
        calls.append(len(completions))
        return [-float(len(c)) for c in completions]

    dataset = Dataset.from_list([{"prompt": f"Tell me about the number {n}, in words, briefly:"} for n in range(8)])
    trainer = plain_trl_trainer(tiny_models["policy"], tmp_path, dataset, [reward_short_completions])
    with caplog.at_level(logging.INFO, "memstate.train"):
        trainer.train()
    assert trainer.shared_prefix_active, trainer.shared_prefix_reason
    assert "shared-prefix check: log-probs mean |Δ|" in caplog.text  # the first-use check ran on the live batch
    assert calls and all(n == 4 for n in calls)  # TRL called the test's reward on whole batches
    ratios = [e["shared_prefix/token_ratio"] for e in trainer.state.log_history if "shared_prefix/token_ratio" in e]
    assert len(ratios) == 2 and min(ratios) > 1  # each step scored its group with the prompt encoded once


def test_a_trl_whose_methods_moved_is_refused_in_one_line(tiny_models, tmp_path, monkeypatch):
    import trl

    dataset = Dataset.from_list([{"prompt": "hi"}] * 4)

    def refusal() -> str:
        with pytest.raises(UnsupportedTRL) as raised:
            plain_trl_trainer(tiny_models["policy"], tmp_path, dataset, [zero_reward])
        message = str(raised.value)
        assert "\n" not in message and f"trl {trl.__version__}" in message and SUPPORTED_TRL in message
        return message

    with monkeypatch.context() as m:  # TRL drops its override: transformers' Trainer._prepare_inputs(inputs) remains
        m.delattr(trl.GRPOTrainer, "_prepare_inputs")
        assert "GRPOTrainer._prepare_inputs takes (self, inputs), not (self, generation_batch" in refusal()
    with monkeypatch.context() as m:
        m.delattr(trl.GRPOTrainer, "_get_per_token_logps_and_entropies")
        assert "GRPOTrainer has no _get_per_token_logps_and_entropies" in refusal()
    with monkeypatch.context() as m:  # TRL 1.14's shape: the tensors behind *args
        m.setattr(trl.GRPOTrainer, "_get_per_token_logps_and_entropies", lambda self, model, *args, **kwargs: None)
        assert "takes (self, model, *args, **kwargs)" in refusal()
    with monkeypatch.context() as m:
        m.delattr(trl.trainer.utils, "add_fused_lm_head")
        assert "trl.trainer.utils has no add_fused_lm_head" in refusal()


def test_the_installed_trl_is_supported_or_refused(tiny_models, tmp_path):
    """CI also runs this against a real older TRL (.ci/run): there construction must refuse, in one line."""
    import trl
    from packaging.specifiers import SpecifierSet

    dataset = Dataset.from_list([{"prompt": "hi"}] * 4)
    if trl.__version__ in SpecifierSet(SUPPORTED_TRL):
        assert plain_trl_trainer(tiny_models["policy"], tmp_path, dataset, [zero_reward]).shared_prefix_active
    else:
        with pytest.raises(UnsupportedTRL, match=f"cannot run on trl {trl.__version__} "):
            plain_trl_trainer(tiny_models["policy"], tmp_path, dataset, [zero_reward])


def test_the_project_pins_the_trl_range_the_trainer_supports():
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert f'"trl{SUPPORTED_TRL}",' in pyproject


def moe_like(policy: Path, tmp_path: Path) -> Path:
    """The tiny policy with a config that, as a Mixture-of-Experts model's does, returns router logits and weights
    their load-balancing loss (TRL then adds that loss, whose value depends on the token layout)."""
    import shutil

    path = tmp_path / "moe-like"
    shutil.copytree(policy, path)
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps(config | {"output_router_logits": True, "router_aux_loss_coef": 0.01}))
    return path


@pytest.mark.parametrize(
    ("config", "rows", "moe", "reason"),
    [
        ({"use_liger_kernel": True}, [{"prompt": "hi"}], False, "use_liger_kernel: Liger's kernels"),
        ({}, [{"prompt": "hi", "image": None}], False, "the dataset's 'image' column"),
        ({}, [{"prompt": "hi"}], True, "the MoE load-balancing loss"),
    ],
    ids=["liger", "image-column", "moe-aux-loss"],
)
def test_features_it_does_not_handle_are_decided_at_construction(tiny_models, tmp_path, caplog, config, rows, moe,
                                                                 reason):  # fmt: skip
    dataset = Dataset.from_list(rows * 4)
    policy = moe_like(tiny_models["policy"], tmp_path) if moe else tiny_models["policy"]
    with caplog.at_level(logging.ERROR, "memstate.train"):
        trainer = plain_trl_trainer(policy, tmp_path, dataset, [zero_reward], **config)
    assert not trainer.shared_prefix_active and trainer.shared_prefix_reason.startswith(reason)
    assert len([r for r in caplog.records if "shared-prefix training off" in r.getMessage()]) == 1
    with pytest.raises(shared_prefix.SharedPrefixUnavailable, match=f"cannot run: {reason}"):
        plain_trl_trainer(policy, tmp_path, dataset, [zero_reward],
                          shared_prefix=SharedPrefixConfig(on_failure="fail"), **config)  # fmt: skip


def test_settings_out_of_range_are_refused():
    with pytest.raises(ValueError, match="SharedPrefixConfig.attention must be one of"):
        SharedPrefixConfig(attention="flash")
    with pytest.raises(ValueError, match="check_tolerance must be positive"):
        SharedPrefixConfig(check_tolerance=0)
